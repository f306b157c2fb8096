"""The QDQ form rewritten into integer ops before lowering, as ONNX Runtime's QDQ transformer does.

ONNX Runtime's quantize_static writes every quantized op as DequantizeLinear -> float op ->
QuantizeLinear. Two patterns become one node of the private domain FUSED_DOMAIN, converted by
convert_qdq.py into the quantized standard ops (lib/ops/quantized.py):

- DQ(x) -> Conv(DQ(w) [, DQ(bias) or float bias]) [-> Relu] -> Q  =>  QConv (qconv2d): int8
  weights with per-output-channel or one scale and zero points 0, scalar x and y parameters.
- DQ(x) -> MatMul / Gemm(DQ(w) [, bias]) [-> Relu] -> Q  =>  QDense (qdense): int8 weights
  (K, N) or transposed, per-column or one scale, zero points 0.
- DQ(a) + DQ(b) [-> Relu] -> Q  =>  QAdd (qadd): scalar parameters.
- QDense -> QAdd of a constant (a separately quantized bias)  =>  QDenseAdd (qdense_add,
  fuse_qdq_bias.py).
- DQ(x) -> Reshape / Transpose / Squeeze / Unsqueeze / Flatten / MaxPool -> Q with the same
  scale and zero point  =>  that op on x's integers (exact; ONNX Runtime drops these too).

A pattern matches only where its float values are read by the pattern alone (not graph outputs)
and every scale and zero point is an initializer; the DequantizeLinear nodes stay (emission
drops them when nothing else reads them). What rounds differently from the float QDQ graph is
said in lib/ops/quantized.py and kernels/onednn/int8_conv.py: within one step.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from .fuse_qdq_bias import merge_bias_adds
from .pattern import NodeUses
from ..ir import Unsupported
from ..tensor_data import to_array

FUSED_DOMAIN = "graph_runtime.qdq"


def int8_import() -> bool:
    """GRAPH_RUNTIME_IMPORT_INT8 (settings.py): the integer ops are CPU-only; off keeps the
    float lowering, which runs on every device."""
    from ... import settings
    return settings.word(settings.IMPORT_INT8) != "off"
INT8 = (np.int8, np.uint8)


def _standard(node: Any, op_type: str) -> bool:
    """Whether node is the standard (ai.onnx) op op_type."""
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


class OnnxGraph(NodeUses):
    """The producers, readers and initializers of one ONNX graph, and its QDQ queries."""

    def __init__(self, graph: Any) -> None:
        super().__init__(graph.node, (o.name for o in graph.output))
        self.inits: dict[str, np.ndarray] = {}
        for t in graph.initializer:
            try:
                self.inits[t.name] = to_array(t, f"initializer {t.name!r}")
            except Unsupported:
                continue  # not matched here; lowering refuses it (naming it) if it is read

    def sole(self, name: str, op_type: str) -> Any:
        """The node of op_type producing name, when name is read once; else None."""
        node = self.producer.get(name)
        if node is None or not _standard(node, op_type) or self.only_reader(name) is None:
            return None
        return node

    def sole_reader(self, name: str, op_type: str) -> Any:
        """The node of op_type reading name, when name is read once; else None."""
        node = self.only_reader(name)
        return node if node is not None and _standard(node, op_type) else None

    def dq(self, name: str) -> tuple[str, np.ndarray, np.ndarray, int] | None:
        """(quantized input, scale, zero point, axis) of the DequantizeLinear making name, its
        parameters initializers and its input int8/uint8 (int32: a bias); None otherwise."""
        node = self.producer.get(name)
        if node is None or node.op_type != "DequantizeLinear" or len(node.input) < 2:
            return None
        scale = self.inits.get(node.input[1])
        zero_name = node.input[2] if len(node.input) > 2 else ""
        zero = self.inits.get(zero_name) if zero_name else None
        if scale is None or scale.dtype != np.float32 or (zero_name and zero is None):
            return None
        if zero is None:
            zero = np.zeros(scale.shape, np.uint8)
        if zero.dtype not in INT8 + (np.int32,) \
                or any(a.name == "block_size" and a.i for a in node.attribute):
            return None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        return node.input[0], scale, zero, axis

    def q(self, node: Any) -> tuple[float, int, str] | None:
        """(scale, zero point, dtype) of a QuantizeLinear with scalar initializer parameters."""
        if len(node.input) < 3 or node.input[1] not in self.inits \
                or node.input[2] not in self.inits:
            return None
        scale, zero = self.inits[node.input[1]], self.inits[node.input[2]]
        if scale.size != 1 or zero.size != 1 or zero.dtype not in INT8 \
                or scale.dtype != np.float32:
            return None
        return float(scale.reshape(())), int(zero.reshape(())), str(zero.dtype)

    def quantized_op(self, q: Any, *op_types: str
                     ) -> tuple[tuple[float, int, str], Any | None, Any] | None:
        """((scale, zero, dtype) of q, its Relu or None, the op of op_types the two read) for
        the form op -> (Relu ->) QuantizeLinear q, each read only by the next."""
        out = self.q(q)
        if out is None:
            return None
        relu = self.sole(q.input[0], "Relu")
        value = relu.input[0] if relu is not None else q.input[0]
        op = next((n for n in (self.sole(value, t) for t in op_types) if n is not None), None)
        return None if op is None else (out, relu, op)


def _scalar(scale: np.ndarray, zero: np.ndarray) -> bool:
    return scale.size == 1 and zero.size == 1


def _bias(g: OnnxGraph, name: str, o: int) -> np.ndarray | None:
    """The float bias (o,): zeros when absent, a float32 initializer, or DequantizeLinear of an
    int32 initializer; None when it is something else."""
    if not name:
        return np.zeros(o, np.float32)
    if name in g.inits:
        value = g.inits[name]
        return value.reshape(o) if value.dtype == np.float32 and value.size == o else None
    bq = g.dq(name)
    if bq is None or bq[0] not in g.inits or g.inits[bq[0]].dtype != np.int32 \
            or bq[1].size not in (1, o) or g.inits[bq[0]].size != o:
        return None
    b_int = g.inits[bq[0]].astype(np.float32) - bq[2].astype(np.float32)
    return np.broadcast_to(b_int * bq[1].astype(np.float32), (o,)).astype(np.float32)


def _requant(x: tuple, w_scale: np.ndarray, bias: np.ndarray, y_scale: float, o: int
             ) -> tuple[np.ndarray, np.ndarray]:
    """(m, b) of the quantized ops: x_scale * w_scale / y_scale and bias / y_scale, float32 in
    ONNX Runtime's order (the scale product, then the division)."""
    ys = np.float32(y_scale)
    m = (np.float32(x[1].reshape(())) * np.broadcast_to(
        w_scale.astype(np.float32).reshape(-1), (o,))) / ys
    return m.astype(np.float32), (bias / ys).astype(np.float32)


def _dense(g: OnnxGraph, q: Any, name: str) -> tuple[Any, dict[str, Any], list[Any]] | None:
    """DQ(x) -> MatMul / Gemm with DQ(int8 weights) [-> Relu] -> Q as a QDense node."""
    from onnx import helper, numpy_helper
    found = g.quantized_op(q, "MatMul", "Gemm")
    if found is None or len(found[2].input) < 2:
        return None
    (y_scale, y_zero, dtype), relu, op = found
    attrs = {a.name: a for a in op.attribute}
    trans_b = bool(attrs["transB"].i) if "transB" in attrs else False
    if any(k in attrs and (attrs[k].i if k == "transA" else attrs[k].f != 1.0)
           for k in ("transA", "alpha", "beta")):
        return None
    x, w = g.dq(op.input[0]), g.dq(op.input[1])
    if x is None or w is None or not _scalar(x[1], x[2]) or x[2].dtype not in INT8 \
            or w[0] not in g.inits:
        return None
    weights, w_scale, w_zero, axis = g.inits[w[0]], w[1], w[2], w[3]
    if weights.dtype != np.int8 or weights.ndim != 2 or np.any(w_zero != 0):
        return None
    o = weights.shape[0 if trans_b else 1]
    column_axis = (0, -2) if trans_b else (1, -1)
    if not (w_scale.size == 1 or (w_scale.shape == (o,) and axis in column_axis)):
        return None
    bias = _bias(g, op.input[2] if op.op_type == "Gemm" and len(op.input) > 2 else "", o)
    if bias is None:
        return None
    m, b = _requant(x, w_scale, bias, y_scale, o)
    inits = {f"{name}_m": m, f"{name}_b": b}
    w_name = w[0]
    if trans_b:
        w_name = f"{name}_w"
        inits[w_name] = np.ascontiguousarray(weights.T)
    node = helper.make_node("QDense", [x[0], w_name, f"{name}_m", f"{name}_b"], [q.output[0]],
                            name=name, domain=FUSED_DOMAIN, x_zero=int(x[2].reshape(())),
                            y_zero=y_zero, relu=int(relu is not None), dtype=dtype)
    replaced = [op, q] + ([relu] if relu is not None else [])
    return node, {k: numpy_helper.from_array(v, k) for k, v in inits.items()}, replaced


def _conv(g: OnnxGraph, q: Any, name: str) -> tuple[Any, dict[str, Any], list[Any]] | None:
    """The QConv node replacing q, its new initializers, and the nodes it replaces."""
    from onnx import helper, numpy_helper
    found = g.quantized_op(q, "Conv")
    if found is None or len(found[2].input) < 2:
        return None
    (y_scale, y_zero, dtype), relu, conv = found
    x, w = g.dq(conv.input[0]), g.dq(conv.input[1])
    if x is None or w is None or not _scalar(x[1], x[2]) or x[2].dtype not in INT8 \
            or w[0] not in g.inits:
        return None
    weights, w_scale, w_zero, axis = g.inits[w[0]], w[1], w[2], w[3]
    o = weights.shape[0]
    if weights.dtype != np.int8 or weights.ndim != 4 or np.any(w_zero != 0) \
            or not (w_scale.size == 1 or (w_scale.shape == (o,) and axis in (0, -4))):
        return None
    bias = _bias(g, conv.input[2] if len(conv.input) > 2 else "", o)
    if bias is None:
        return None
    m, b = _requant(x, w_scale, bias, y_scale, o)
    inits = {f"{name}_m": m, f"{name}_b": b}
    node = helper.make_node("QConv", [x[0], w[0], f"{name}_m", f"{name}_b"], [q.output[0]],
                            name=name, domain=FUSED_DOMAIN,
                            x_zero=int(x[2].reshape(())), y_zero=y_zero, relu=int(relu is not None),
                            dtype=dtype)
    node.attribute.extend(a for a in conv.attribute)
    replaced = [conv, q] + ([relu] if relu is not None else [])
    return node, {k: numpy_helper.from_array(v, k) for k, v in inits.items()}, replaced


def _add(g: OnnxGraph, q: Any, name: str) -> tuple[Any, dict[str, Any], list[Any]] | None:
    from onnx import helper
    found = g.quantized_op(q, "Add")
    if found is None:
        return None
    (y_scale, y_zero, dtype), relu, add = found
    a, b = g.dq(add.input[0]), g.dq(add.input[1])
    if a is None or b is None or not _scalar(a[1], a[2]) or not _scalar(b[1], b[2]) \
            or a[2].dtype not in INT8 or b[2].dtype not in INT8:
        return None
    node = helper.make_node(
        "QAdd", [a[0], b[0]], [q.output[0]], name=name, domain=FUSED_DOMAIN,
        a_scale=float(a[1].reshape(())), a_zero=int(a[2].reshape(())),
        b_scale=float(b[1].reshape(())), b_zero=int(b[2].reshape(())), y_scale=y_scale,
        y_zero=y_zero, relu=int(relu is not None), dtype=dtype)
    return node, {}, [add, q] + ([relu] if relu is not None else [])


# Ops that only move or select elements: DQ -> op -> Q with one scale and zero point is the op
# on the integers (Q(DQ(x)) == x: |x - zero| <= 255 survives float32's multiply and divide).
# MaxPool too: DQ is monotone (scale > 0), and the integer pool's padding (the type's lowest
# value) never beats a window's real element, as the float pool's -inf does not.
PASS_THROUGH = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "MaxPool")


def _pass_through(g: OnnxGraph, q: Any, name: str) -> tuple[Any, dict[str, Any], list[Any]] | None:
    """DQ -> Reshape/Transpose/... -> Q with equal parameters as that op on the integers."""
    from onnx import NodeProto
    out = g.q(q)
    if out is None:
        return None
    op = next((n for n in (g.sole(q.input[0], t) for t in PASS_THROUGH) if n is not None), None)
    if op is None or not op.input or any(op.output[1:]):
        return None  # (MaxPool's indices output read)
    x = g.dq(op.input[0])
    if x is None or not _scalar(x[1], x[2]) or x[2].dtype not in INT8 \
            or (op.op_type == "MaxPool" and not float(x[1].reshape(())) > 0):
        return None
    if (np.float32(x[1].reshape(())), int(x[2].reshape(())), str(x[2].dtype)) \
            != (np.float32(out[0]), out[1], out[2]):
        return None
    node = NodeProto()
    node.CopyFrom(op)
    node.input[0] = x[0]
    node.output[0] = q.output[0]
    node.name = name
    return node, {}, [op, q]


def fuse_qdq(model: Any) -> tuple[Any, Counter]:
    """model with the QDQ patterns fused (a copy; the input is untouched), and their counts."""
    graph = model.graph
    if not int8_import() or not any(n.op_type == "QuantizeLinear" for n in graph.node):
        return model, Counter()
    g = OnnxGraph(graph)
    replace: dict[int, Any] = {}  # id of the Q node -> the fused node
    drop: set[int] = set()
    inits: dict[str, Any] = {}
    counts: Counter = Counter()
    for i, node in enumerate(graph.node):
        if node.op_type != "QuantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        name = f"qdq_fused_{i}"
        for kind, match in (("QConv", _conv), ("QDense", _dense), ("QAdd", _add),
                            ("QDQ pass-through", _pass_through)):
            found = match(g, node, name)
            if found is None:
                continue
            fused, new_inits, replaced = found
            replace[id(node)] = fused
            drop.update(id(n) for n in replaced if n is not node)
            inits.update(new_inits)
            counts[kind] += 1
            break
    if not replace:
        return model, counts
    from onnx import ModelProto, helper, numpy_helper
    out = ModelProto()
    out.CopyFrom(model)
    nodes = [replace.get(id(n), n) for n in graph.node if id(n) not in drop]
    # DequantizeLinear nodes only the fused patterns read go too (a weight's would be folded
    # into a float copy of the weights for nothing)
    kept = NodeUses(nodes, (o.name for o in graph.output))
    nodes = [n for n in nodes if n.op_type != "DequantizeLinear" or kept.used(n.output[0])]
    arrays = dict(g.inits)
    arrays.update({k: numpy_helper.to_array(v) for k, v in inits.items()})
    nodes, made, merged = merge_bias_adds(nodes, arrays, {o.name for o in graph.output})
    inits.update({k: numpy_helper.from_array(v, k) for k, v in made.items()})
    if merged:
        counts.update({"QDenseAdd": merged, "QDense": -merged, "QAdd": -merged})
        counts = +counts  # the counts that stay positive
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(inits.values())
    if not any(o.domain == FUSED_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(FUSED_DOMAIN, 1))
    return out, counts
