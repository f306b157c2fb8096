"""A fused QDense followed by the QAdd of a constant (a bias quantized on its own, as
quantize_static writes MatMul + Add) merged into one QDenseAdd node (lib op qdense_add).

Exact: qadd is a table lookup on the two integers, applied here to qdense's integer result
(kept in a scratch array) in the same call; the merge saves a node per projection (BERT-tiny:
12 of about 80). Only where the QDense result is read by that QAdd alone and the constant
operand is one value or one per column.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .pattern import NodeUses

ADD_ATTRS = ("a_scale", "a_zero", "b_scale", "b_zero", "y_scale", "y_zero", "relu", "dtype")


def _constant(name: str, inits: dict[str, np.ndarray], producer: dict[str, Any],
              depth: int = 0) -> np.ndarray | None:
    """The value of name when it is an initializer, or Identity, DequantizeLinear or
    QuantizeLinear (one scale and zero point) of such values, computed as ONNX defines them
    (quantize_static writes a bias as Q(DQ(int32 bias)) behind PyTorch's Identity); else None."""
    if name in inits:
        return inits[name]
    node = producer.get(name)
    if node is None or depth > 16:
        return None
    if node.op_type == "Identity":
        return _constant(node.input[0], inits, producer, depth + 1)
    if node.op_type not in ("DequantizeLinear", "QuantizeLinear") or len(node.input) != 3 \
            or any(a.name == "block_size" for a in node.attribute):
        return None
    args = [_constant(i, inits, producer, depth + 1) for i in node.input]
    if any(a is None for a in args):
        return None
    x, scale, zero = args
    assert x is not None and scale is not None and zero is not None  # (for mypy)
    if scale.dtype != np.float32 or scale.size != 1 or zero.size != 1:
        return None
    s, z = scale.reshape(()), zero.reshape(())
    if node.op_type == "DequantizeLinear":
        if x.dtype not in (np.int8, np.uint8, np.int32) or zero.dtype != x.dtype:
            return None
        # as convert_quant.dequantize computes it: NumPy's promotion of float32 and the zero
        # point's type (float64 for int32), then the scale's
        work = np.result_type(np.float32, zero.dtype)
        dx = x.astype(np.float32).astype(work) - z.astype(work)
        wide = np.result_type(work, scale.dtype)
        return (dx.astype(wide) * s.astype(wide)).astype(np.float32)
    if x.dtype != np.float32 or zero.dtype not in (np.int8, np.uint8) \
            or not np.isfinite(x).all():
        return None
    info = np.iinfo(zero.dtype)
    return np.clip(np.rint(x / s) + np.float32(z), info.min, info.max).astype(zero.dtype)


def merge_bias_adds(nodes: list[Any], inits: dict[str, np.ndarray], outputs: set[str]
                    ) -> tuple[list[Any], dict[str, np.ndarray], int]:
    """nodes with each QDense -> QAdd(constant) pair as one QDenseAdd, the constants made, and
    how many merged."""
    from onnx import helper
    uses = NodeUses(nodes, outputs)
    made: dict[str, np.ndarray] = {}
    dense = {n.output[0]: n for n in nodes if n.op_type == "QDense"}
    merged: dict[int, Any] = {}
    drop: set[int] = set()
    for add in nodes:
        if add.op_type != "QAdd":
            continue
        for k in (0, 1):
            d = dense.get(add.input[k])
            const = _constant(add.input[1 - k], inits, uses.producer)
            if d is None or const is None or uses.only_reader(d.output[0]) is None \
                    or id(d) in drop:
                continue
            n = inits[d.input[1]].shape[1]
            if const.shape not in ((), (1,), (n,), (1, n)):
                continue
            attrs = {a.name: helper.get_attribute_value(a) for a in add.attribute}
            if k == 1:  # the table is indexed (dense result, constant): swap a and b
                for a, b in (("a_scale", "b_scale"), ("a_zero", "b_zero")):
                    attrs[a], attrs[b] = attrs[b], attrs[a]
            const_name = add.input[1 - k]
            if const_name not in inits:
                const_name = f"{add.name}_addend"
                made[const_name] = const
            node = helper.make_node("QDenseAdd", list(d.input) + [const_name],
                                    [add.output[0]], name=add.name, domain=add.domain,
                                    **{f"add_{key}": attrs[key] for key in ADD_ATTRS})
            node.attribute.extend(d.attribute)
            merged[id(add)] = node
            drop.add(id(d))
            break
    return [merged.get(id(n), n) for n in nodes if id(n) not in drop], made, len(merged)
