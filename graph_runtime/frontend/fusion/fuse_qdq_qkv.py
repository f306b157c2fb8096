"""A qdq_attention's three qdense_add projections of one input packed into one qdense_add_packed.

quantize_static's BERT projects the same int8 hidden states three times, each product with its
own output scale and zero point and its bias added by its own qadd: side by side, each column
keeps its multiplier, bias, zero point and (its projection's qadd table at its constant) byte
map, so one product three times as wide gives every value the three gave
(lib/ops/quantized_packed.py), and the attention reads its q, k and v at column offsets.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from ...lib.kernels.cpu.quantized import qadd_table
from ..ir import Prim, Value
from .pattern import PatternGraph, new_prim, spliced


def _projection(g: PatternGraph, v: Value, reader: Prim) -> Prim | None:
    """The qdense_add making v when reader alone reads it, its operands constant and neither
    step a relu; else None."""
    p = v.producer
    if p is None or p.op != "qdense_add" or g.sole(v) is not reader \
            or any(a.const is None for a in p.inputs[1:]) \
            or p.attrs.get("relu") or p.attrs.get("add_relu"):
        return None
    return p


def _byte_map(p: Prim) -> np.ndarray:
    """(N, 256): the sum's byte per column and dense byte (p's qadd table at its constant)."""
    a = p.attrs
    dense_dtype, addend = str(a["dtype"]), p.inputs[4].const
    assert addend is not None
    n = p.inputs[1].shape[1]
    table = qadd_table((float(a["add_a_scale"]), float(a["add_b_scale"]),
                        float(a["add_y_scale"])),
                       (int(a["add_a_zero"]), int(a["add_b_zero"]), int(a["add_y_zero"])),
                       False, dense_dtype, str(addend.dtype), str(a["add_dtype"]))
    column = np.broadcast_to(addend.reshape(-1), (n,)).view(np.uint8).astype(np.int64)
    return np.ascontiguousarray(table.reshape(256, 256)[:, column].T)


def _columns(p: Prim, parts: list[Prim]) -> Prim:
    """qdense_add_packed of parts (qdense_add prims of one x) side by side, writing p's output
    when parts is [p] (a fresh value otherwise)."""
    first = parts[0]
    consts = [np.concatenate([q.inputs[i].const for q in parts], axis=-1)  # type: ignore
              for i in (1, 2, 3)]
    zeros = np.concatenate([np.full(q.inputs[1].shape[1], int(q.attrs.get("y_zero", 0)),
                                    np.int32) for q in parts])
    colmap = np.concatenate([_byte_map(q) for q in parts]).reshape(-1)
    name = p.outputs[0].name
    values = [Value(f"{name}_{part}", c.shape, str(c.dtype), const=c) for part, c in
              zip(("weight", "m", "b", "y_zero", "colmap"), consts + [zeros, colmap])]
    return new_prim("qdense_add_packed", [first.inputs[0]] + values,
                    {"x_zero": int(first.attrs.get("x_zero", 0)),
                     "dense_dtype": str(first.attrs["dtype"])},
                    p.outputs[0] if parts == [p] else None, p.origin)


def columns_form(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with each remaining qdense_add of constant operands one qdense_add_packed (its
    product's int32 result requantized and mapped by one compiled pass: 2-3x faster than
    oneDNN's requantization and the qadd lookup for BERT-tiny), and a qlookup reading one alone
    folded into its byte map (the two byte functions composed: the same bytes). Returns the
    prims and how many were rewritten (qdense_add_columns) and lookups folded (qlookup_folded)."""
    from .fuse_qkv import live
    alive = live(prims, outputs)
    g = PatternGraph(alive, outputs)
    replace: dict[int, Prim] = {}
    made_by: dict[int, Prim] = {}  # id of a rewritten qdense_add's output -> its new prim
    for p in alive:
        if p.op == "qdense_add" and all(a.const is not None for a in p.inputs[1:]) \
                and not p.attrs.get("relu") and not p.attrs.get("add_relu"):
            replace[id(p)] = made_by[id(p.outputs[0])] = _columns(p, [p])
    rewritten = len(replace)
    folded = 0
    for p in alive:
        if p.op != "qlookup" or p.inputs[1].const is None:
            continue
        made = made_by.get(id(p.inputs[0]))
        if made is None or g.sole(p.inputs[0]) is not p:
            continue
        colmap = made.inputs[5].const
        assert colmap is not None
        composed = p.inputs[1].const[colmap.view(np.uint8).astype(np.int64)]
        value = Value(f"{p.outputs[0].name}_colmap", composed.shape, str(composed.dtype),
                      const=np.ascontiguousarray(composed))
        replace[id(p)] = new_prim("qdense_add_packed", made.inputs[:5] + [value], made.attrs,
                                  p.outputs[0], p.origin)
        folded += 1
    return [replace.get(id(p), p) for p in prims], Counter(qdense_add_columns=rewritten,
                                                           qlookup_folded=folded)


def pack_qdq_qkv(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with each qdq_attention's projections packed (the three left unread, for emission
    to drop), and how many attentions."""
    from .fuse_qkv import live
    g = PatternGraph(live(prims, outputs), outputs)
    before: dict[int, list[Prim]] = {}
    for p in prims:
        if p.op != "qdq_attention" or len({id(v) for v in p.inputs[:3]}) != 3 \
                or any(p.attrs.get(f"{n}_offset", 0) for n in "qkv"):
            continue
        found = [_projection(g, v, p) for v in p.inputs[:3]]
        if any(f is None for f in found):
            continue
        projections: list[Prim] = found  # type: ignore[assignment]
        first = projections[0]
        keys = ("x_zero", "dtype", "add_dtype")
        if any(q.inputs[0] is not first.inputs[0] or any(q.attrs.get(k) != first.attrs.get(k)
                                                         for k in keys) for q in projections):
            continue
        packed = _columns(p, projections)
        width = projections[0].outputs[0].shape[-1]
        attrs = dict(p.attrs, width=width, q_offset=0, k_offset=width, v_offset=2 * width)
        if any(q.outputs[0].shape[-1] != width for q in projections):
            continue
        out = packed.outputs[0]
        attention = new_prim("qdq_attention", [out, out, out] + p.inputs[3:], attrs,
                             p.outputs[0], p.origin)
        before[id(p)] = [packed, attention]
    return spliced(prims, before), Counter(qdq_qkv_packed=len(before))
