"""quantize_dynamic's MatMulInteger / ConvInteger -> Cast -> Mul(x_scale * w_scale) [-> Add(bias)]
rewritten into one float-output integer op before lowering, as ONNX Runtime's
MatMulIntegerToFloat fusion. A DynamicQuantizeLinear whose quantized output only such integer
ops read is marked (FUSED_DOMAIN) to become one CPU kernel (lib op dynamic_quantize); elsewhere
it keeps the lowering every device runs.

The product runs as oneDNN's int8 matmul or convolution with its float result scaled and biased
inside (lib/kernels/onednn/int8_*.py): the int32 accumulator, its cast, the scale product and the
bias add were four graph nodes. Matched only where each intermediate value has one reader (and
is no graph output), the weights are an int8 initializer with zero point 0, x is uint8/int8,
x_scale a one-element float32 value and w_scale a float32 initializer (one value or one per
column). The float steps: float32(acc) * float32(x_scale * w_scale) + bias, as the graph's; oneDNN
may fuse the multiply and the add (one rounding instead of two, within one float32 ulp).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from .fuse_qdq import FUSED_DOMAIN, OnnxGraph, int8_import

INT8_ELEMS = (2, 3)  # TensorProto.UINT8, INT8
FLOAT = 1


def _elem(types: dict[str, Any], name: str) -> tuple[int, tuple[int, ...] | None]:
    """(elem type, shape or None) of a value from shape inference; -1 for an unknown dim."""
    tp = types.get(name)
    if tp is None or not tp.HasField("tensor_type"):
        return 0, None
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return tt.elem_type, None
    return tt.elem_type, tuple(int(d.dim_value) if d.HasField("dim_value") else -1
                               for d in tt.shape.dim)


def _bias(g: OnnxGraph, name: str, n: int, conv: bool) -> np.ndarray | None:
    """A per-column (per-channel for a conv) float32 bias: an initializer (behind Identity
    nodes or not), or (a conv's) the Reshape / Unsqueeze of one to (n, 1, 1) or (1, n, 1, 1);
    None otherwise."""
    identity = g.producer.get(name)
    while name not in g.inits and identity is not None and identity.op_type == "Identity":
        name = identity.input[0]  # PyTorch's exports give a bias as Identity(initializer)
        identity = g.producer.get(name)
    value = g.inits.get(name)
    shapes = [(n,), (1, n)] if not conv else [(n, 1, 1), (1, n, 1, 1)]
    if value is None and conv:
        node = g.producer.get(name)
        if node is None or node.op_type not in ("Reshape", "Unsqueeze") \
                or node.input[0] not in g.inits:
            return None
        value = g.inits[node.input[0]]
        if value.size != n:
            return None
        target = g.inits.get(node.input[1]) if len(node.input) > 1 else None
        if node.op_type == "Reshape" and (target is None or tuple(target) not in shapes):
            return None
        if node.op_type == "Unsqueeze" and value.shape != (n,):
            return None
        value = value.reshape(shapes[0])
    if value is None or value.dtype != np.float32 or value.shape not in shapes:
        return None
    return value.reshape(n)


def _scaled(g: OnnxGraph, types: dict[str, Any], mm: Any, name: str
            ) -> tuple[Any, dict[str, np.ndarray], list[Any]] | None:
    conv = mm.op_type == "ConvInteger"
    if len(mm.input) < 2 or mm.input[1] not in g.inits:
        return None
    w = g.inits[mm.input[1]]
    w_zero = g.inits.get(mm.input[3]) if len(mm.input) > 3 and mm.input[3] else np.zeros(1)
    x_elem, x_shape = _elem(types, mm.input[0])
    if w.dtype != np.int8 or w.ndim != (4 if conv else 2) or w_zero is None \
            or np.any(w_zero != 0) or x_elem not in INT8_ELEMS or x_shape is None \
            or len(x_shape) < 2 or (conv and len(x_shape) != 4):
        return None
    if len(mm.input) > 2 and mm.input[2] and _elem(types, mm.input[2])[0] != x_elem:
        return None
    cast = g.sole_reader(mm.output[0], "Cast")
    if cast is None or next((a.i for a in cast.attribute if a.name == "to"), 0) != FLOAT:
        return None
    mul = g.sole_reader(cast.output[0], "Mul")
    if mul is None:
        return None
    other = mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]
    product = g.producer.get(other)
    if product is None or product.op_type != "Mul":
        return None
    scales = [i for i in product.input if i in g.inits]
    x_scale = [i for i in product.input if i not in g.inits]
    n = w.shape[0] if conv else w.shape[1]
    per_channel = [(n, 1, 1), (1, n, 1, 1)] if conv else [(n,), (1, n)]
    if len(scales) != 1 or len(x_scale) != 1 or g.inits[scales[0]].dtype != np.float32 \
            or g.inits[scales[0]].shape not in [(), (1,)] + per_channel:
        return None
    s_elem, s_shape = _elem(types, x_scale[0])
    if s_elem != FLOAT or s_shape is None or any(d != 1 for d in s_shape):
        return None
    bias = np.zeros(n, np.float32)
    replaced = [mm, cast, mul]
    out = mul.output[0]
    add = g.sole_reader(out, "Add")
    if add is not None:
        value = _bias(g, add.input[1] if add.input[0] == out else add.input[0], n, conv)
        if value is not None:
            bias = value
            replaced.append(add)
            out = add.output[0]
    from onnx import helper
    x_zero = mm.input[2] if len(mm.input) > 2 else ""
    inputs = [mm.input[0], x_zero, mm.input[1], x_scale[0], f"{name}_ws", f"{name}_bias"]
    kind = "IntegerToFloatConv" if conv else "IntegerToFloatMatMul"
    node = helper.make_node(kind, inputs, [out], name=name, domain=FUSED_DOMAIN)
    if conv:
        node.attribute.extend(mm.attribute)
    w_scale = np.broadcast_to(g.inits[scales[0]].reshape(-1), (n,)).astype(np.float32)
    return node, {f"{name}_ws": w_scale, f"{name}_bias": bias}, replaced


def fuse_integer(model: Any, types: dict[str, Any]) -> tuple[Any, Counter]:
    """model with the patterns fused (a copy; the input is untouched), and their count."""
    graph = model.graph
    kinds = ("MatMulInteger", "ConvInteger")
    if not int8_import() or not any(n.op_type in kinds for n in graph.node):
        return model, Counter()
    from onnx import ModelProto, helper, numpy_helper
    g = OnnxGraph(graph)
    replace: dict[int, Any] = {}
    drop: set[int] = set()
    inits: dict[str, np.ndarray] = {}
    counts: Counter = Counter()
    for i, node in enumerate(graph.node):
        if node.op_type == "DynamicQuantizeLinear" and node.domain in ("", "ai.onnx") \
                and node.output[0] not in g.pinned and g.readers.get(node.output[0]) \
                and all(r.op_type in kinds for r in g.readers[node.output[0]]):
            # read by the integer ops only: the one-kernel form (CPU-only, as they are)
            one = helper.make_node("DynamicQuantizeLinear", list(node.input),
                                   list(node.output), name=node.name, domain=FUSED_DOMAIN)
            replace[id(node)] = one
            counts["DynamicQuantizeLinear"] += 1
            continue
        if node.op_type not in kinds or node.domain not in ("", "ai.onnx"):
            continue
        found = _scaled(g, types, node, f"integer_fused_{i}")
        if found is None:
            continue
        fused, new_inits, replaced = found
        replace[id(replaced[-1])] = fused  # at the last node's place: every input is made
        drop.update(id(n) for n in replaced[:-1])
        inits.update(new_inits)
        counts[fused.op_type] += 1
    if not replace:
        return model, counts
    out = ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(replace.get(id(n), n) for n in graph.node if id(n) not in drop)
    out.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    if not any(o.domain == FUSED_DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(FUSED_DOMAIN, 1))
    return out, counts
