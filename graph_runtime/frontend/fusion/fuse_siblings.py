"""Products of one input packed into one, then split: a decoder's q, k and v projections.

Where rotary embeddings or a KV cache sit between a decoder's projections and its attention
(LLaMA, Qwen2, Mistral: q and k rotated, k and v concatenated onto the past), the attention
fusion's packing (fuse_qkv.py) cannot read them at column offsets, and the three products stay
apart: a grouped-query model's k and v products are narrow (a quarter of q's columns), which a
GEMM runs far below its speed at a prompt's rows, and at a decode step each is a call that
streams a small weight. Here every set of two or more dense prims reading one input with
constant 2-D weights (and per-column constant biases, as Qwen2 has) becomes one dense over the
weights side by side, and a split of its output's last axis gives each former output back, so
their readers are unchanged. The split copies the outputs (a prompt's rows x their widths), far
less than what the one wider product saves.

Runs after the attention, QKV and gated-MLP passes, so it packs what those left apart.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from .. import sym_infer
from ..ir import Prim, Unsupported, Value
from ..symdim import is_sym
from .fuse_qkv import column_bias, live
from .pattern import PatternGraph, new_prim, spliced

PACKED_DTYPES = ("float32", "float64")


def _packable(p: Prim) -> bool:
    """Whether p is a dense of a float input against a constant 2-D weight of its dtype."""
    if p.op != "dense" or len(p.inputs) != 2:
        return False
    x, w = p.inputs
    return (x.dtype in PACKED_DTYPES and w.const is not None and w.rank == 2
            and w.dtype == x.dtype and x.rank >= 2 and not is_sym(x.shape[-1])
            and w.shape[1] == x.shape[-1] and p.attrs.get("units") in (None, w.shape[0]))


def _with_bias(g: PatternGraph, p: Prim) -> tuple[Value, np.ndarray | None, Prim | None]:
    """(the value the product's readers read, its per-column bias or None, the add prim or
    None): the add of a constant bias that varies along the columns only, where that add is the
    product's sole reader; else the product's own output."""
    out = p.outputs[0]
    add = g.sole(out)
    if add is None or add.op != "add" or len(add.inputs) != 2:
        return out, None, None
    b = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
    if b is out or b.rank > 1 or tuple(add.outputs[0].shape) != tuple(out.shape):
        return out, None, None
    bias = column_bias(b, add.outputs[0])
    if bias is None:
        return out, None, None
    return add.outputs[0], np.array(bias, out.dtype), add


def _split(packed: Value, parts: list[Value], widths: list[int], origin: str) -> Prim:
    """split(packed, last axis) writing parts (their readers unchanged)."""
    bounds = [int(b) for b in np.cumsum(widths)[:-1]]
    attrs = {"indices_or_sections": bounds, "axis": packed.rank - 1}
    got = sym_infer.infer("split", [packed.spec], attrs)
    if [(tuple(s.shape), str(s.dtype)) for s in got] != [(tuple(v.shape), v.dtype)
                                                         for v in parts]:
        raise ValueError("the split does not give the products' shapes back")
    prim = Prim("split", attrs, [packed], list(parts), origin)
    for v in parts:
        v.producer = prim
    return prim


def pack_siblings(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with each set of dense siblings (one input, constant weights) as one dense and a
    split, and how many products were packed away."""
    prims = live(prims, outputs)
    g = PatternGraph(prims, outputs)
    groups: dict[int, list[Prim]] = {}
    for p in prims:
        if _packable(p):
            groups.setdefault(id(p.inputs[0]), []).append(p)
    replaced: dict[int, list[Prim]] = {}
    packed = 0
    for group in groups.values():
        if len(group) < 2:
            continue
        x = group[0].inputs[0]
        parts = [_with_bias(g, p) for p in group]
        weights = [np.asarray(p.inputs[1].const) for p in group]  # (_packable: constants)
        widths = [int(w.shape[0]) for w in weights]
        origin = group[0].origin
        name = group[0].outputs[0].name
        w: np.ndarray = np.concatenate(weights, axis=0)
        made = [new_prim("dense", [x, Value(f"{name}_siblings_weight", w.shape, x.dtype,
                                                 const=w)], {}, None, origin)]
        if any(bias is not None for _, bias, _ in parts):
            bias = np.concatenate([np.zeros(n, x.dtype) if b is None else b
                                   for n, (_, b, _) in zip(widths, parts)])
            made.append(new_prim("add", [made[-1].outputs[0],
                                         Value(f"{name}_siblings_bias", bias.shape, x.dtype,
                                               const=bias)], {}, None, origin))
        try:
            made.append(_split(made[-1].outputs[0], [v for v, _, _ in parts], widths, origin))
        except (ValueError, Unsupported):
            for p in group:  # (the parts' producers were not touched: _split sets them last)
                p.outputs[0].producer = p
            continue
        replaced[id(group[0])] = made
        for p, (_, _, add) in zip(group, parts):
            replaced.setdefault(id(p), [])
            if add is not None:
                replaced[id(add)] = []
        packed += len(group)
    if not packed:
        return prims, Counter()
    return spliced(prims, replaced), Counter(products_packed=packed)
