"""Q, K and V projections of one input packed into one dense at import, read by column offsets.

BERT, ViT, DistilBERT and Whisper project the same hidden states three times (dense + bias
each); as ONNX Runtime's attention fusion does, the three weights (and biases) are concatenated
into one constant so one GEMM writes q | k | v side by side, and the attention op reads its
heads from that array at column offsets (as it reads GPT-2's packed QKV). One product three
times as wide keeps both cores busy where three narrow ones could not, and costs one call.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .ir import Prim, Value
from .pattern import PatternGraph, new_prim


def _projection(g: PatternGraph, v: Value, reader: Prim
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
        if dense_out is None or g.sole(dense_out) is not p or dense_out.shape != v.shape:
            return None
        b = p.inputs[1] if p.inputs[0] is dense_out else p.inputs[0]
        if b is dense_out or b.const is None or b.dtype != v.dtype:
            return None
        try:
            bias = np.broadcast_to(b.const, v.shape).reshape(-1, v.shape[-1])[0]
        except ValueError:
            return None
        if not np.array_equal(np.broadcast_to(bias, v.shape), np.broadcast_to(b.const, v.shape)):
            return None  # a bias that varies along the tokens is no per-column bias
        p = dense_out.producer  # type: ignore[assignment]
    if p.op != "dense" or p.attrs.get("units") not in (None, v.shape[-1]):
        return None
    data, weight = p.inputs
    if weight.const is None or weight.rank != 2 or weight.dtype != v.dtype:
        return None
    return data, weight.const, bias


def pack_qkv(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], int]:
    """prims with each attention's three projections of one input made one dense, and how many
    attentions were packed."""
    # The prims the attention fusion left unread (its head views) still read the projections.
    g = PatternGraph(_live(prims, outputs), outputs)
    before: dict[int, list[Prim]] = {}  # id(attention prim) -> prims replacing it
    for p in prims:
        if p.op != "attention" or len({id(v) for v in p.inputs[:3]}) != 3:
            continue
        found = [_projection(g, v, p) for v in p.inputs[:3]]
        if any(f is None for f in found):
            continue
        projections: list[tuple[Value, np.ndarray, np.ndarray]] = found  # type: ignore
        data = projections[0][0]
        if any(f[0] is not data for f in projections):
            continue
        weight = np.concatenate([f[1] for f in projections], axis=0)
        bias = np.concatenate([f[2] for f in projections]).astype(data.dtype)
        widths = [f[1].shape[0] for f in projections]
        name = p.inputs[0].name
        w = Value(f"{name}_qkv_weight", weight.shape, data.dtype, const=weight)
        b = Value(f"{name}_qkv_bias", bias.shape, data.dtype, const=bias)
        dense = new_prim("dense", [data, w], {}, None, p.origin)
        add = new_prim("add", [dense.outputs[0], b], {}, None, p.origin)
        packed = add.outputs[0]
        attrs: dict[str, Any] = dict(p.attrs)
        attrs["q_offset"] = int(attrs.get("q_offset", 0))
        attrs["k_offset"] = int(attrs.get("k_offset", 0)) + widths[0]
        attrs["v_offset"] = int(attrs.get("v_offset", 0)) + widths[0] + widths[1]
        attention = new_prim("attention", [packed, packed, packed] + p.inputs[3:], attrs,
                             p.outputs[0], p.origin)
        before[id(p)] = [dense, add, attention]
    if not before:
        return prims, 0
    result: list[Prim] = []
    for p in prims:
        result.extend(before.get(id(p), [p]))
    return result, len(before)


def _live(prims: list[Prim], outputs: list[Value]) -> list[Prim]:
    """The prims an output depends on (emission drops the others)."""
    needed = {id(v) for v in outputs}
    live: list[Prim] = []
    for p in reversed(prims):
        if any(id(o) in needed for o in p.outputs):
            live.append(p)
            needed.update(id(v) for v in p.inputs)
    return live[::-1]
