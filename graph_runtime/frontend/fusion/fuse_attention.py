"""Multi-head attention as the exporters write it, matched into the attention op.

From what the PyTorch exporters write for scaled_dot_product_attention and for eager
attention: the heads made by reshape/transpose views of (batch, tokens, heads * head_dim)
projections (or of one packed QKV GEMM split in three), checked by applying the views to an
index array; scalar scales on q, k or the scores; an additive mask; softmax over the last axis;
the optional where(isnan(p), 0, p); the second matmul; the views back to (batch, tokens, width).
An operand whose heads are no column block of a (batch, tokens, width) array (heads computed
in (batch, heads, tokens, dim) by rotary embeddings, K/V heads repeated by broadcast_to for
grouped- or multi-query attention) is copied into one by the views it was made with and a
transpose, which FuseOps joins into one copy.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir import Prim, Value
from .pattern import PatternGraph, near, new_prim, other, scalar

_VIEWS = ("reshape", "transpose")
_Steps = list[tuple[str, Any]]


def _view(idx: np.ndarray, op: str, attrs: Any) -> np.ndarray:
    if op == "reshape":
        return idx.reshape(attrs["newshape"])
    if op == "transpose":
        return idx.transpose(attrs["axes"])
    return np.broadcast_to(idx, attrs["shape"])


def _trace_back(g: PatternGraph, v: Value
                ) -> tuple[Value, np.ndarray, float, tuple[Value, _Steps]] | None:
    """The array v is a view of, v's elements as indices into it, the scalar factor, and the
    value the view steps start from (src, or the split output src was cut into) with the
    steps, first step first."""
    steps: list[tuple[str, Any]] = []
    scale = 1.0
    cur = v
    while cur.producer is not None and g.sole(cur) is not None:
        p = cur.producer
        if p.op in _VIEWS or p.op == "broadcast_to":
            steps.append((p.op, p.attrs))
            cur = p.inputs[0]
        elif p.op in ("multiply", "divide") and scalar(p.inputs[1]) is not None:
            factor = scalar(p.inputs[1])
            scale = scale * factor if p.op == "multiply" else scale / factor  # type: ignore
            cur = p.inputs[0]
        elif p.op == "multiply" and scalar(p.inputs[0]) is not None:
            scale *= scalar(p.inputs[0])  # type: ignore[operator]
            cur = p.inputs[1]
        else:
            break
    src = cur
    steps.reverse()
    made_from = (cur, steps)
    idx = np.arange(math.prod(src.shape)).reshape(src.shape)
    if src.producer is not None and src.producer.op == "split" and src.rank >= 2:
        split = src.producer
        axis = split.attrs.get("axis", 0)
        base = split.inputs[0]
        if axis in (-1, base.rank - 1):
            start = 0
            for o in split.outputs:
                if o is src:
                    break
                start += o.shape[-1]
            src = base
            idx = np.arange(math.prod(src.shape)).reshape(src.shape)[..., start:start + cur.shape[-1]]
    for op, attrs in steps:
        idx = _view(idx, op, attrs)
    return src, idx, scale, made_from


def _heads(src: Value, idx: np.ndarray, tokens: int, dim: int, key_t: bool
           ) -> tuple[int, int, int] | None:
    """(batch, heads, column offset) when idx holds src's heads as (batch*heads, tokens, dim)
    (or (batch*heads, dim, tokens) with key_t), else None."""
    width = src.shape[-1]
    total = math.prod(src.shape)
    if width * tokens == 0 or total % (width * tokens):
        return None
    batch = total // (width * tokens)
    flat = idx.reshape(-1)
    heads = idx.shape[0] // batch if batch and idx.shape[0] % batch == 0 else 0
    if heads < 1:
        return None
    offset = int(flat.min()) % width
    if offset + heads * dim > width:
        return None
    want = np.arange(total).reshape(batch, tokens, width)[:, :, offset:offset + heads * dim]
    want = want.reshape(batch, tokens, heads, dim)
    want = want.transpose(0, 2, 3, 1) if key_t else want.transpose(0, 2, 1, 3)
    if want.size != idx.size or not np.array_equal(want.reshape(idx.shape), idx):
        return None
    return batch, heads, offset


def _as_3d(src: Value, batch: int, prims: list[Prim], origin: str) -> Value:
    shape = (batch, math.prod(src.shape) // (batch * src.shape[-1]), src.shape[-1])
    if src.shape == shape:
        return src
    if src.const is not None:
        return Value(src.name, shape, src.dtype, const=src.const.reshape(shape))
    prim = new_prim("reshape", [src], {"newshape": list(shape)}, None, origin)
    prims.append(prim)
    return prim.outputs[0]


def _copied(start: tuple[Value, _Steps], batch: int, heads: int, tokens: int, key_t: bool,
            prims: list[Prim], origin: str) -> Value:
    """The operand the steps make from start, copied to (batch, tokens, heads * dim) by a
    transpose (its scalar factors left out: the caller applies them)."""
    cur, steps = start
    for op, attrs in steps:
        prims.append(new_prim(op, [cur], attrs, None, origin))
        cur = prims[-1].outputs[0]
    rows, cols = cur.shape[-2:]
    for op, attrs in (("reshape", {"newshape": [batch, heads, rows, cols]}),
                      ("transpose", {"axes": [0, 3, 1, 2] if key_t else [0, 2, 1, 3]}),
                      ("reshape", {"newshape": [batch, tokens, heads * (rows * cols // tokens)]})):
        prims.append(new_prim(op, [cur], attrs, None, origin))
        cur = prims[-1].outputs[0]
    return cur


def match_attention(g: PatternGraph, bmm: Prim) -> tuple[list[Prim], Prim] | None:
    """New prims computing the attention whose scores bmm makes, and the prim they replace."""
    if bmm.op not in ("batch_matmul", "matmul") or bmm.outputs[0].dtype not in ("float32",
                                                                                 "float64"):
        return None
    qa, ka = bmm.inputs
    if qa.rank < 2 or ka.rank < 2 or (bmm.op == "matmul" and bmm.attrs):
        return None
    # batch_matmul: (batch*heads, tokens, dim) operands; matmul: the same with one matrix
    # (batch and heads 1), which the importer writes as a 4-D by 2-D product.
    key_t = not bmm.attrs.get("transpose_b", False)
    bh = math.prod(qa.shape[:-2])
    q_len, dim = qa.shape[-2:]
    k_len = ka.shape[-1] if key_t else ka.shape[-2]
    if math.prod(ka.shape[:-2]) != bh or (bmm.op == "matmul" and bh != 1):
        return None
    # scores -> [reshape] -> [scale] -> [+ mask] -> softmax
    cur = bmm.outputs[0]
    scale = 1.0
    mask: Value | None = None
    scores4: tuple[int, ...] = ()
    while True:
        p = g.sole(cur)
        if p is None:
            return None
        if p.op == "reshape":
            cur = p.outputs[0]
        elif p.op in ("multiply", "divide") and scalar(p.inputs[1]) is not None \
                and p.inputs[0] is cur:
            factor = scalar(p.inputs[1])
            scale = scale * factor if p.op == "multiply" else scale / factor  # type: ignore
            cur = p.outputs[0]
        elif p.op == "add" and mask is None and cur.rank == 4:
            mask = other(p, cur)
            if mask is None or mask.dtype != cur.dtype:
                return None
            scores4 = cur.shape  # the mask broadcasts against these axes
            cur = p.outputs[0]
        elif p.op == "softmax" and p.attrs.get("axis", -1) in (-1, cur.rank - 1):
            cur = p.outputs[0]
            break
        else:
            return None
    # probabilities -> [where(isnan(p), 0, p)] -> [reshape] -> matmul with v
    nan_to_zero = False
    readers = g.readers.get(id(cur), [])
    if len(readers) == 2 and id(cur) not in g.pinned:
        isnan = next((p for p in readers if p.op == "isnan"), None)
        where = next((p for p in readers if p.op == "where"), None)
        if isnan is None or where is None or g.sole(isnan.outputs[0]) is not where \
                or where.inputs[0] is not isnan.outputs[0] or where.inputs[2] is not cur \
                or not near(where.inputs[1], 0.0):
            return None
        nan_to_zero = True
        cur = where.outputs[0]
    p = g.sole(cur)
    if p is not None and p.op == "reshape":
        cur = p.outputs[0]
        p = g.sole(cur)
    if p is None or p.op != bmm.op or p.inputs[0] is not cur \
            or p.attrs.get("transpose_b", False) or p.inputs[1].rank < 2 \
            or math.prod(p.inputs[1].shape[:-2]) != bh or p.inputs[1].shape[-1] != dim:
        return None  # the op's v heads are as wide as q's and k's
    bmm2 = p
    # the three operands as head views of their sources, or copied into that layout
    operands = (qa, ka, bmm2.inputs[1])
    traced = [t for t in (_trace_back(g, v) for v in operands) if t is not None]
    if len(traced) != 3:
        return None
    kinds = ((q_len, False), (k_len, key_t), (k_len, False))
    layouts = [_heads(t[0], t[1].reshape((bh,) + tuple(o.shape[-2:])), tokens, dim, kt)
               for t, o, (tokens, kt) in zip(traced, operands, kinds)]
    # a (batch, heads, tokens, dim) source says which; (batch*heads, tokens, dim) does not
    q_src = traced[0][0]
    if q_src.rank == 4 and q_src.shape[2:] == (q_len, dim):
        batch, heads = q_src.shape[:2]
    elif layouts[0] is not None:
        batch, heads = layouts[0][:2]
    elif qa.rank == 4:
        batch, heads = qa.shape[:2]
    else:
        return None
    if bh != batch * heads or traced[2][2] != 1.0:
        return None
    scale *= traced[0][2] * traced[1][2]
    origin = bmm.origin
    new: list[Prim] = []
    inputs: list[Value] = []
    offsets = []
    for t, layout, (tokens, kt) in zip(traced, layouts, kinds):
        if layout is not None and layout[:2] == (batch, heads):
            inputs.append(_as_3d(t[0], batch, new, origin))
            offsets.append(layout[2])
        else:
            inputs.append(_copied(t[3], batch, heads, tokens, kt, new, origin))
            offsets.append(0)
    # context (batch*heads, q_len, dim) -> views -> (batch, q_len, heads*dim) or 2-D
    cur = bmm2.outputs[0]
    idx = np.arange(math.prod(cur.shape)).reshape(cur.shape)
    want_all = np.arange(math.prod(cur.shape)).reshape(batch, heads, q_len, dim)
    want_all = want_all.transpose(0, 2, 1, 3)
    final = None
    while True:
        p = g.sole(cur)
        if p is None or p.op not in _VIEWS:
            break
        idx = idx.reshape(p.attrs["newshape"]) if p.op == "reshape" \
            else idx.transpose(p.attrs["axes"])
        cur = p.outputs[0]
        if cur.shape[-1] == heads * dim and cur.rank in (2, 3) \
                and np.array_equal(idx, want_all.reshape(cur.shape)):
            final = cur
    if final is None or final.producer is None:
        return None
    old = final.producer
    # mask broadcast to 4-D
    if mask is not None:
        shape4 = (1,) * (4 - mask.rank) + tuple(mask.shape)
        full = (batch, heads, q_len, k_len)
        if scores4 != full or len(shape4) != 4 \
                or any(m not in (1, f) for m, f in zip(shape4, full)):
            return None
        if shape4 != mask.shape:
            if mask.const is not None:
                mask = Value(mask.name, shape4, mask.dtype, const=mask.const.reshape(shape4))
            else:
                reshape = new_prim("reshape", [mask], {"newshape": list(shape4)}, None, origin)
                new.append(reshape)
                mask = reshape.outputs[0]
        inputs.append(mask)
    attrs = {"num_heads": heads, "head_dim": dim, "scale": scale, "q_offset": offsets[0],
             "k_offset": offsets[1], "v_offset": offsets[2], "nan_to_zero": nan_to_zero}
    if final.rank == 3:
        new.append(new_prim("attention", inputs, attrs, final, origin))
    else:
        att = new_prim("attention", inputs, attrs, None, origin)
        new.append(att)
        new.append(new_prim("reshape", [att.outputs[0]], {"newshape": list(final.shape)}, final,
                             origin))
    return new, old
