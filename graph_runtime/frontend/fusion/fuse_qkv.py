"""Q, K and V projections of one input packed into one dense at import, read by column offsets.

BERT, ViT, DistilBERT and Whisper project the same hidden states three times (dense + bias
each); as ONNX Runtime's attention fusion does, the three weights (and biases) are concatenated
into one constant so one GEMM writes q | k | v side by side, and the attention op reads its
heads from that array at column offsets (as it reads GPT-2's packed QKV). One product three
times as wide keeps both cores busy where three narrow ones could not, and costs one call.
quantize_dynamic's projections (dense_integer_scaled of one quantized input) pack the same way:
int8 weights, per-column weight scales and biases side by side.
"""
from __future__ import annotations

from collections import Counter

from typing import Any

import numpy as np

from ..ir import Prim, Value
from ..symdim import has_sym, same, same_shape
from .pattern import PatternGraph, new_prim, spliced


def projection(g: PatternGraph, v: Value, reader: Prim
                ) -> tuple[Value, np.ndarray, np.ndarray] | None:
    """(input, weight [units, K], bias [units]) when v = dense(input, weight) [+ bias] with
    constant weight and bias and reader the only reader of v; else None."""
    if v.rank != 3 or g.sole(v) is not reader or v.producer is None:
        return None
    p = v.producer
    bias = np.zeros(v.shape[-1], v.dtype)
    if p.op == "add":
        dense_out = next((a for a in p.inputs if a.producer is not None
                          and a.producer.op == "dense"), None)
        if dense_out is None or g.sole(dense_out) is not p \
                or not same_shape(dense_out.shape, v.shape):
            return None
        b = p.inputs[1] if p.inputs[0] is dense_out else p.inputs[0]
        column = None if b is dense_out else column_bias(b, v)
        if column is None:
            return None
        bias = column
        p = dense_out.producer  # type: ignore[assignment]
    if p.op != "dense" or not (p.attrs.get("units") is None or same(p.attrs["units"], v.shape[-1])):
        return None
    data, weight = p.inputs
    if weight.const is None or weight.rank != 2 or weight.dtype != v.dtype:
        return None
    return data, weight.const, bias


def column_bias(b: Value, v: Value) -> np.ndarray | None:
    """The per-column values of b, a constant of v's dtype added to make v, or None where b is
    no constant of that dtype or varies along v's rows."""
    if b.const is None or b.dtype != v.dtype:
        return None
    # symbolic dims cannot be broadcast to: a per-column bias broadcasts to one row
    shape = (1,) * (v.rank - 1) + v.shape[-1:] if has_sym(v.shape) else v.shape
    try:
        bias = np.broadcast_to(b.const, shape).reshape(-1, v.shape[-1])[0]
    except ValueError:
        return None
    if not np.array_equal(np.broadcast_to(bias, shape), np.broadcast_to(b.const, shape)):
        return None  # a bias that varies along the tokens is no per-column bias
    return bias


def _pack_float(g: PatternGraph, p: Prim) -> tuple[Value, list[Prim], list[int]] | None:
    """One dense + add writing q | k | v, its prims and the three widths."""
    found = [projection(g, v, p) for v in p.inputs[:3]]
    if any(f is None for f in found):
        return None
    projections: list[tuple[Value, np.ndarray, np.ndarray]] = found  # type: ignore
    data = projections[0][0]
    if any(f[0] is not data for f in projections):
        return None
    weight = np.concatenate([f[1] for f in projections], axis=0)
    bias = np.concatenate([f[2] for f in projections]).astype(data.dtype)
    name = p.inputs[0].name
    w = Value(f"{name}_qkv_weight", weight.shape, data.dtype, const=weight)
    b = Value(f"{name}_qkv_bias", bias.shape, data.dtype, const=bias)
    dense = new_prim("dense", [data, w], {}, None, p.origin)
    add = new_prim("add", [dense.outputs[0], b], {}, None, p.origin)
    return add.outputs[0], [dense, add], [f[1].shape[0] for f in projections]


def _integer_projection(g: PatternGraph, v: Value, reader: Prim
                        ) -> tuple[list[Value], list[np.ndarray]] | None:
    """([x, x_zero, x_scale], [w (K, units), w_scale, bias]) when v = dense_integer_scaled
    (quantize_dynamic's projection, bias included: fuse_integer.py) with constant weights,
    scales and bias, read by reader alone; else None."""
    p = v.producer
    if v.rank != 3 or g.sole(v) is not reader or p is None or p.op != "dense_integer_scaled":
        return None
    consts = [p.inputs[i].const for i in (2, 4, 5)]
    if any(c is None for c in consts):
        return None
    return [p.inputs[0], p.inputs[1], p.inputs[3]], consts  # type: ignore[return-value]


def _pack_integer(g: PatternGraph, p: Prim) -> tuple[Value, list[Prim], list[int]] | None:
    """One dense_integer_scaled writing q | k | v (weights, scales and biases side by side:
    each column's result is the one it had alone), its prims and the three widths."""
    found = [_integer_projection(g, v, p) for v in p.inputs[:3]]
    if any(f is None for f in found):
        return None
    projections: list[tuple[list[Value], list[np.ndarray]]] = found  # type: ignore[assignment]
    shared = projections[0][0]
    if any(any(a is not b for a, b in zip(f[0], shared)) for f in projections):
        return None
    name = p.inputs[0].name
    packed = [np.concatenate([f[1][i] for f in projections], axis=-1) for i in range(3)]
    consts = [Value(f"{name}_qkv_{part}", c.shape, str(c.dtype), const=c)
              for part, c in zip(("weight", "w_scale", "bias"), packed)]
    x, x_zero, x_scale = shared
    dense = new_prim("dense_integer_scaled", [x, x_zero, consts[0], x_scale] + consts[1:], {},
                     None, p.origin)
    return dense.outputs[0], [dense], [f[1][0].shape[1] for f in projections]


def pack_qkv(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with each attention's three projections of one input made one dense, and how many
    attentions were packed."""
    # The prims the attention fusion left unread (its head views) still read the projections.
    g = PatternGraph(live(prims, outputs), outputs)
    before: dict[int, list[Prim]] = {}  # id(attention prim) -> prims replacing it
    for p in prims:
        if p.op != "attention" or len({id(v) for v in p.inputs[:3]}) != 3:
            continue
        made = _pack_float(g, p) or _pack_integer(g, p)
        if made is None:
            continue
        packed, new, widths = made
        attrs: dict[str, Any] = dict(p.attrs)
        attrs["q_offset"] = int(attrs.get("q_offset", 0))
        attrs["k_offset"] = int(attrs.get("k_offset", 0)) + widths[0]
        attrs["v_offset"] = int(attrs.get("v_offset", 0)) + widths[0] + widths[1]
        attention = new_prim("attention", [packed, packed, packed] + p.inputs[3:], attrs,
                             p.outputs[0], p.origin)
        before[id(p)] = new + [attention]
    if not before:
        return prims, Counter()
    return spliced(prims, before), Counter(qkv_packed=len(before))


def live(prims: list[Prim], outputs: list[Value]) -> list[Prim]:
    """The prims an output depends on (emission drops the others)."""
    needed = {id(v) for v in outputs}
    live: list[Prim] = []
    for p in reversed(prims):
        if any(id(o) in needed for o in p.outputs):
            live.append(p)
            needed.update(id(v) for v in p.inputs)
    return live[::-1]
