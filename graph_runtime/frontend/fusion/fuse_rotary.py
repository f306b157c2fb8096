"""Rotary position embeddings as LLaMA-style decoders' exports write them, matched into the
rotary op.

x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., d/2:], x[..., :d/2]) over the
last axis, where x is the heads of a (batch, tokens, heads * dim) projection (or of a column
block of one, Phi-3's packed QKV) made by reshape and transpose, and cos/sin are the model's own
tables broadcasting over the heads. Partial rotary (x the first rotary_dim of each head,
concatenated back with the rest) is taken too. The op reads the projection and writes the
rotated heads in token layout, and the heads are viewed back as the graph had them: the
attention pass then reads them in place instead of copying them, and any other reader (a KV
cache's concatenation into its present) gets them in that layout, a copy as before. The op's
kernels round as the exporters' Mul, Neg and Add do, so the values are the graph's bit for bit.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from ...errors import LibraryError
from ..ir import Prim, Value
from ..symdim import is_int, is_sym, same, same_shape
from .pattern import PatternGraph, last_axis_slice, new_prim, other, spliced


def _heads(xh: Value) -> tuple[Value, int, int, int] | None:
    """(projection, column offset, heads, dim) when xh (batch, heads, tokens, dim) is the heads
    of a (batch, tokens, width) projection by reshape and transpose (0, 2, 1, 3)."""
    t = xh.producer
    if t is None or t.op != "transpose" or list(t.attrs.get("axes", [])) != [0, 2, 1, 3]:
        return None
    r = t.inputs[0].producer
    if r is None or r.op != "reshape" or r.inputs[0].rank != 3:
        return None
    src = r.inputs[0]
    batch, tokens, heads, dim = t.inputs[0].shape
    if is_sym(heads) or is_sym(dim) or not same_shape(src.shape, (batch, tokens, heads * dim)):
        return None
    block = last_axis_slice(src)
    if block is not None and block[0].rank == 3:  # a column block of a packed projection
        return block[0], block[1], heads, dim
    return src, 0, heads, dim


def _table(t: Value, heads_shape: tuple[Any, ...], rot: int, prims: list[Prim], origin: str
           ) -> Value | None:
    """cos or sin, broadcasting to (batch, heads, tokens, rot) with size 1 for heads, as the op's
    (batch or 1, tokens or 1, rot) table; None otherwise."""
    if t.rank > 4:
        return None
    shape = (1,) * (4 - t.rank) + tuple(t.shape)
    batch, _, tokens, _ = heads_shape
    if not is_int(shape[1], 1) or not is_int(shape[3], rot) \
            or not (is_int(shape[0], 1) or same(shape[0], batch)) \
            or not (is_int(shape[2], 1) or same(shape[2], tokens)):
        return None
    table = (shape[0], shape[2], rot)
    if same_shape(table, t.shape):
        return t
    if t.producer is not None and t.producer.op == "reshape" \
            and same_shape(t.producer.inputs[0].shape, table):
        return t.producer.inputs[0]  # the table the graph reshaped to broadcast over heads
    if t.const is not None:
        return Value(t.name, table, t.dtype, const=t.const.reshape(table))
    prims.append(new_prim("reshape", [t], {"newshape": list(table)}, None, origin))
    return prims[-1].outputs[0]


def match_rotary(g: PatternGraph, neg: Prim) -> tuple[list[Prim], Prim] | None:
    """New prims computing the rotary embedding whose rotate_half negates with neg, and the
    prim they replace."""
    sliced = last_axis_slice(neg.inputs[0])
    if sliced is None or g.sole(neg.inputs[0]) is not neg:
        return None
    x, half, end = sliced
    rot = x.shape[-1]
    if x.rank != 4 or x.dtype not in ("float32", "float64") or is_sym(rot) or rot % 2 \
            or (half, end) != (rot // 2, rot):
        return None
    cat = g.sole(neg.outputs[0])
    if cat is None or cat.op != "concatenate" or cat.attrs.get("axis") not in (-1, 3) \
            or len(cat.inputs) != 2 or cat.inputs[0] is not neg.outputs[0]:
        return None
    low = last_axis_slice(cat.inputs[1])
    if low is None or low[0] is not x or low[1:] != (0, half) or g.sole(cat.inputs[1]) is not cat:
        return None
    times_sin = g.sole(cat.outputs[0])
    sin = None if times_sin is None or times_sin.op != "multiply" \
        else other(times_sin, cat.outputs[0])
    add = None if sin is None else g.sole(times_sin.outputs[0])  # type: ignore[union-attr]
    if add is None or add.op != "add":
        return None
    plain = other(add, times_sin.outputs[0])  # type: ignore[union-attr]
    times_cos = None if plain is None else plain.producer
    if times_cos is None or times_cos.op != "multiply" or g.sole(plain) is not add:  # type: ignore
        return None
    cos = other(times_cos, x)
    if cos is None or not same_shape(add.outputs[0].shape, x.shape):
        return None
    # x: the heads, or (partial rotary) their first rot columns, the rest concatenated after
    out, xh = add.outputs[0], x
    whole = last_axis_slice(x)
    if whole is not None and whole[1] == 0 and whole[0].rank == 4:
        xh = whole[0]
        if whole[2] != xh.shape[-1]:
            rest = g.sole(out)
            tail = None if rest is None or len(rest.inputs) != 2 \
                else last_axis_slice(rest.inputs[1])
            if rest is None or rest.op != "concatenate" or rest.attrs.get("axis") not in (-1, 3) \
                    or rest.inputs[0] is not out or tail is None or tail[0] is not xh \
                    or tail[1:] != (whole[2], xh.shape[-1]):
                return None
            out = rest.outputs[0]
    heads = _heads(xh)
    if heads is None or heads[0].dtype != x.dtype:
        return None
    src, offset, num_heads, dim = heads
    origin = neg.origin
    new: list[Prim] = []
    tables = [_table(t, xh.shape, rot, new, origin) for t in (cos, sin)]  # type: ignore[arg-type]
    if tables[0] is None or tables[1] is None or tables[0].dtype != x.dtype \
            or tables[1].dtype != x.dtype:
        return None
    attrs: dict[str, Any] = {"num_heads": num_heads, "head_dim": dim}
    if rot != dim:
        attrs["rotary_dim"] = rot
    if offset:
        attrs["offset"] = offset
    batch, tokens = xh.shape[0], xh.shape[2]
    old = out.producer
    new.append(new_prim("rotary", [src] + tables, attrs, None, origin))  # type: ignore[operator]
    # the rotated heads viewed as the graph had them, for the attention pass to trace back
    new.append(new_prim("reshape", [new[-1].outputs[0]],
                        {"newshape": [batch, tokens, num_heads, dim]}, None, origin))
    new.append(new_prim("transpose", [new[-1].outputs[0]], {"axes": [0, 2, 1, 3]}, out,
                        origin))
    return new, old  # type: ignore[return-value]


def fuse_rotary(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with each matched rotary embedding one rotary op, and how many were."""
    g = PatternGraph(prims, outputs)
    replace: dict[int, list[Prim]] = {}
    for p in prims:
        if p.op != "negative":
            continue
        try:
            found = match_rotary(g, p)
        except (ValueError, KeyError, TypeError, IndexError, LibraryError):
            continue  # a shape or attribute this matcher did not expect: leave the prims
        if found is not None:
            new, old = found
            replace[id(old)] = new
    if not replace:
        return prims, Counter()
    return spliced(prims, replace), Counter(rotary=len(replace))
