"""Multi-head attention as the exporters write it, matched into the attention op.

From what the PyTorch exporters write for scaled_dot_product_attention and for eager
attention: the heads made by reshape/transpose views of (batch, tokens, heads * head_dim)
projections (or of one packed QKV GEMM split in three), checked by applying the views to an
index array; scalar scales on q, k or the scores; additive terms (padding and causal masks, T5's
and MPNet's relative position biases, Bloom's ALiBi added to the (batch*heads, q, k) scores),
summed into the op's one mask, each times the scales applied after it; softmax over the last axis;
the optional where(isnan(p), 0, p); the second matmul; the views back to (batch, tokens, width).
K/V heads repeated for grouped- or multi-query attention (repeat_kv: a broadcast_to of a size-1
axis between kv heads and tokens, merged) are read un-repeated, the op's kv_heads set; K/V made
in (batch, kv heads, tokens, dim) (a KV cache's concatenation, its present) are given to the op
in that layout, read in place. Any other operand whose heads are no column block of a (batch,
tokens, width) array (Q rotated in (batch, heads, tokens, dim) where the rotary pass did not
take it) is copied into one by the views it was made with and a transpose, which FuseOps joins
into one copy.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ir import Prim, Value
from ..symdim import evaluate, is_int, is_sym, same, same_shape
from .pattern import PatternGraph, last_axis_slice, near, new_prim, other, scalar

_VIEWS = ("reshape", "transpose")
_Steps = list[tuple[str, Any]]
Env = dict[str, int]


class _StandIns(dict):  # type: ignore[type-arg]
    """Stand-in sizes for symbolic dims: each name met gets the next of primes."""

    def __init__(self, primes: tuple[int, ...]) -> None:
        super().__init__()
        self.primes = iter(primes)

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> int:
        value = next(self.primes, None)
        if value is None:
            raise ValueError(f"more symbolic dims than stand-in sizes at {name!r}")
        self[name] = value
        return value


# NOTE: index arrays cannot be built of symbolic dims, so a layout is traced at stand-in sizes
# (the shapes' other arithmetic stays symbolic, and the op's attrs must come out as ints). The
# index map of a reshape/transpose chain is a mixed-radix digit map: which digits (axes split
# or merged) go where is fixed by the chain; two different chains give the same map only where
# sizes coincide (a size 1, two sizes equal, one the product of others), as the attention
# layout with a Reshape alone for the Transpose does at seq 1. Distinct primes, none a factor
# of the literal dims' usual 2, 3, 5, 7, have no such coincidence; and the match is made at two
# sizings with no prime in common and taken only when both give the same ops and attrs. A size
# 1 at run time keeps the map: its digit is then always 0 and the others do not move.
_SIZINGS = ((11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53),
            (59, 61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107))
_MAX_TRACED = 1 << 24  # elements of one stand-in index array


def _at(shape: Any, env: Env) -> list[int]:
    return [evaluate(d, env) for d in shape]


def _index(shape: Any, env: Env) -> np.ndarray:
    """Each element's flat index, for an array of shape at the sizes env gives."""
    dims = _at(shape, env)
    if math.prod(dims) > _MAX_TRACED:
        raise ValueError(f"a stand-in index array of {dims} is too large to trace")
    return np.arange(math.prod(dims)).reshape(dims)


def _view(idx: np.ndarray, op: str, attrs: Any, env: Env) -> np.ndarray:
    if op == "reshape":
        return idx.reshape(_at(attrs["newshape"], env))
    if op == "transpose":
        return idx.transpose(attrs["axes"])
    return np.broadcast_to(idx, _at(attrs["shape"], env))


def _trace_back(g: PatternGraph, v: Value, env: Env
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
    idx: np.ndarray | None = None
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
            first, width = _at((start, cur.shape[-1]), env)
            idx = _index(src.shape, env)[..., first:first + width]
    block = last_axis_slice(src) if idx is None and src.rank >= 2 else None
    if block is not None and block[0].rank == src.rank:  # Phi-3's V: a packed QKV's columns
        src = block[0]
        idx = _index(src.shape, env)[..., block[1]:block[2]]
    if idx is None:  # not a column block of a split: the source's own index
        idx = _index(src.shape, env)
    for op, attrs in steps:
        idx = _view(idx, op, attrs, env)
    return src, idx, scale, made_from


def _heads(src: Value, idx: np.ndarray, tokens: Any, dim: int, key_t: bool,
           env: Env | None = None, width: Any = None) -> tuple[Any, int, int, int] | None:
    """(batch, heads, column offset, kv heads) when idx (at the sizes env gives) holds src's
    heads as (batch*heads, tokens, dim) (or (batch*heads, dim, tokens) with key_t), src read as
    (batch, tokens, width) (width its last dim unless given), each of its kv heads repeated for
    heads // kv heads consecutive heads (repeat_kv's broadcast; kv heads = heads where none
    is), else None."""
    width = src.shape[-1] if width is None else width
    total = math.prod(src.shape)
    if is_int(width * tokens, 0) or not is_int(total % (width * tokens), 0):
        return None
    batch = total // (width * tokens)
    n_batch, n_tokens, n_width = _at((batch, tokens, width), env or {})
    flat = idx.reshape(-1)
    heads = idx.shape[0] // n_batch if n_batch and idx.shape[0] % n_batch == 0 else 0
    if heads < 1:
        return None
    offset = int(flat.min()) % n_width
    # the distinct heads batch 0 reads, by their first element
    kv = len(np.unique(idx.reshape(n_batch, heads, -1)[0, :, 0])) if idx.size else heads
    if heads % kv or offset + kv * dim > n_width:
        return None
    want: np.ndarray = np.arange(n_batch * n_tokens * n_width).reshape(n_batch, n_tokens,
                                                                        n_width)
    want = want[:, :, offset:offset + kv * dim].reshape(n_batch, n_tokens, kv, dim)
    want = want.transpose(0, 2, 3, 1) if key_t else want.transpose(0, 2, 1, 3)
    want = want.repeat(heads // kv, axis=1)
    if want.size != idx.size or not np.array_equal(want.reshape(idx.shape), idx):
        return None
    return batch, heads, offset, kv


def _layout(src: Value, idx: np.ndarray, tokens: Any, dim: int, key_t: bool,
            env: Env) -> tuple[Any, int, int, int, Any] | None:
    """_heads and the width it read src with: src's last dim, or for a (batch, tokens, heads,
    dim) source (Bloom's heads taken from a QKV interleaved per head) its last two."""
    widths = [src.shape[-1]] + ([src.shape[-2] * src.shape[-1]] if src.rank >= 4 else [])
    for width in widths:
        found = _heads(src, idx, tokens, dim, key_t, env, width)
        if found is not None:
            return (*found, width)
    return None


def _as_3d(src: Value, batch: int, width: Any, prims: list[Prim], origin: str) -> Value:
    shape = (batch, math.prod(src.shape) // (batch * width), width)
    if same_shape(src.shape, shape):
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


def _unrepeated(start: tuple[Value, _Steps], operand: Value, batch: Any, heads: int,
                tokens: Any, dim: int, key_t: bool, env: Env) -> tuple[_Steps, int] | None:
    """The steps from start to the (batch, kv heads, tokens, dim) value repeat_kv repeats, and
    its kv heads, when the operand (made from start by its steps) is that value with each head
    repeated for heads // kv consecutive heads (a broadcast_to of a size-1 axis, merged), or
    start itself, unrepeated (kv heads = heads); else None."""
    cur, steps = start
    at = next((i for i, (op, _) in enumerate(steps) if op == "broadcast_to"), None)
    if at is not None and any(op == "broadcast_to" for op, _ in steps[at + 1:]):
        return None
    idx = _index(cur.shape, env)
    traced = [idx]
    for op, attrs in steps:
        traced.append(_view(traced[-1], op, attrs, env))
    got = traced[-1].reshape(_at(operand.shape, env))
    want_dims = _at((batch, tokens, dim), env)
    # before the reshape adding the group axis, or the broadcast; with none, start
    for cut in (0,) if at is None else (at - 1, at):
        pre = traced[max(cut, 0)]
        if pre.ndim != 4 or [pre.shape[0], *pre.shape[2:]] != want_dims or heads % pre.shape[1]:
            continue
        want = pre.repeat(heads // pre.shape[1], axis=1)
        want = want.transpose(0, 1, 3, 2) if key_t else want
        if want.size == got.size and np.array_equal(want.reshape(got.shape), got):
            return steps[:max(cut, 0)], int(pre.shape[1])
    return None


def _as_mask(term: Value, at: tuple[Any, ...], full: tuple[Any, ...], prims: list[Prim],
             origin: str) -> Value | None:
    """term, added to the scores where they were shaped at (full, or full's batch and heads
    merged in one axis), as a 4-D value broadcasting to full; None when it is neither."""
    batch, heads = full[:2]
    if term.rank > len(at):
        return None
    shape = (1,) * (len(at) - term.rank) + tuple(term.shape)
    if len(at) == 3 and same_shape(at, (batch * heads,) + full[2:]):
        # the merged axis is batch-major, as the q and k traces found the heads
        if is_int(shape[0], 1):
            shape = (1, 1) + shape[1:]
        elif same(shape[0], batch * heads):
            shape = (batch, heads) + shape[1:]
        else:
            return None
    elif not same_shape(at, full):
        return None  # a reshape that is neither layout: where term's elements land is unknown
    if any(not (is_int(m, 1) or same(m, f)) for m, f in zip(shape, full)):
        return None
    if same_shape(shape, term.shape):
        return term
    if term.const is not None:
        return Value(term.name, shape, term.dtype, const=term.const.reshape(shape))
    prims.append(new_prim("reshape", [term], {"newshape": list(shape)}, None, origin))
    return prims[-1].outputs[0]


def _mask(terms: list[tuple[Value, tuple[Any, ...], float]], full: tuple[Any, ...],
          prims: list[Prim], origin: str) -> Value | None:
    """The sum of the terms (each times its factor) as one 4-D mask broadcasting to full; None
    when one of them cannot be put in that form."""
    total: Value | None = None
    for term, at, factor in terms:
        mask = _as_mask(term, at, full, prims, origin)
        if mask is None:
            return None
        if factor != 1.0:
            times = Value(f"{term.name}_factor", (), mask.dtype,
                          const=np.array(factor, mask.dtype))
            prims.append(new_prim("multiply", [mask, times], {}, None, origin))
            mask = prims[-1].outputs[0]
        if total is not None:
            prims.append(new_prim("add", [total, mask], {}, None, origin))
            mask = prims[-1].outputs[0]
        total = mask
    return total


def match_attention(g: PatternGraph, bmm: Prim) -> tuple[list[Prim], Prim] | None:
    """New prims computing the attention whose scores bmm makes, and the prim they replace."""
    env = _StandIns(_SIZINGS[0])
    found = _match(g, bmm, env)
    if found is None or not env:
        return found  # no symbolic dim was traced: the layouts are of the real sizes
    # the layouts traced at two stand-in sizings (see _SIZINGS) must agree
    new, old = found
    final = new[-1].outputs[0]
    final.producer = old  # the check matches the graph as it was
    check = _match(g, bmm, _StandIns(_SIZINGS[1]))
    final.producer = new[-1]
    if check is None or check[1] is not old \
            or [(p.op, p.attrs) for p in check[0]] != [(p.op, p.attrs) for p in new]:
        final.producer = old
        return None
    return found


def _match(g: PatternGraph, bmm: Prim, env: Env) -> tuple[list[Prim], Prim] | None:
    """match_attention with layouts traced at the sizes env gives the symbolic dims."""
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
    # scores -> [reshape] -> [scale] -> [+ term]... -> softmax, in any order
    cur = bmm.outputs[0]
    scale = 1.0
    terms: list[tuple[Value, tuple[Any, ...], float]] = []  # (term, scores' shape, factor)
    while True:
        p = g.sole(cur)
        if p is None:
            return None
        if p.op == "reshape":
            cur = p.outputs[0]
        elif p.op in ("multiply", "divide") and scalar(p.inputs[1]) is not None \
                and p.inputs[0] is cur:
            factor = scalar(p.inputs[1])
            if p.op == "divide":
                if factor == 0.0:
                    return None  # x / 0 is left to the prims (1 / 0 would raise here)
                factor = 1.0 / factor  # type: ignore[operator]
            scale *= factor  # type: ignore[operator]
            # softmax(s * (qk + b)) = softmax(s * qk + s * b): a term added before is scaled too
            terms = [(t, at, f * factor) for t, at, f in terms]  # type: ignore[operator]
            cur = p.outputs[0]
        elif p.op == "add" and cur.rank in (3, 4):
            term = other(p, cur)
            if term is None or term.dtype != cur.dtype:
                return None
            terms.append((term, cur.shape, 1.0))  # the term broadcasts against these axes
            cur = p.outputs[0]
        elif p.op == "softmax" and p.attrs.get("axis", -1) in (-1, cur.rank - 1) \
                and same(cur.shape[-1], k_len):  # its rows are the scores' rows
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
    traced = [t for t in (_trace_back(g, v, env) for v in operands) if t is not None]
    if len(traced) != 3:
        return None
    kinds = ((q_len, False), (k_len, key_t), (k_len, False))
    if is_sym(dim):
        return None  # the op's head_dim would be symbolic
    layouts = [_layout(t[0], t[1].reshape(_at((bh,) + tuple(o.shape[-2:]), env)), tokens, dim,
                       kt, env) for t, o, (tokens, kt) in zip(traced, operands, kinds)]
    # a (batch, heads, tokens, dim) source says which; (batch*heads, tokens, dim) does not
    q_src = traced[0][0]
    if q_src.rank == 4 and same_shape(q_src.shape[2:], (q_len, dim)):
        batch, heads = q_src.shape[:2]
    elif layouts[0] is not None:
        batch, heads = layouts[0][:2]
    elif qa.rank == 4:
        batch, heads = qa.shape[:2]
    else:
        return None
    if is_sym(heads) or not same(bh, batch * heads) or traced[2][2] != 1.0:
        return None
    scale *= traced[0][2] * traced[1][2]
    # each operand read in place: a column block of kv heads (repeated or not), or k's and v's
    # (batch, kv heads, tokens, dim) value before repeat_kv's broadcast; else copied as read
    kvs: list[int] = []
    unrepeated: list[tuple[_Steps, int] | None] = []
    for i, (t, layout, o, (tokens, kt)) in enumerate(zip(traced, layouts, operands, kinds)):
        if layout is not None and not same_shape(layout[:2], (batch, heads)):
            layouts[i] = layout = None
        unrepeated.append(None if layout is not None or i == 0
                          else _unrepeated(t[3], o, batch, heads, tokens, dim, kt, env))
        kvs.append(layout[3] if layout is not None else
                   heads if unrepeated[i] is None else unrepeated[i][1])  # type: ignore[index]
    kv_heads = kvs[1] if kvs[1] == kvs[2] else heads  # k's and v's kv heads, or every head
    origin = bmm.origin
    new: list[Prim] = []
    inputs: list[Value] = []
    offsets = []
    for i, (t, layout, (tokens, kt)) in enumerate(zip(traced, layouts, kinds)):
        kv = heads if i == 0 else kv_heads
        if layout is not None and kvs[i] == kv:
            inputs.append(_as_3d(t[0], batch, layout[4], new, origin))
            offsets.append(layout[2])
            continue
        if unrepeated[i] is not None and kvs[i] == kv:
            # the (batch, kv heads, tokens, dim) value itself (a KV cache's present), read in
            # place by the op
            cur = t[3][0]
            for op, view_attrs in unrepeated[i][0]:  # type: ignore[index]
                new.append(new_prim(op, [cur], view_attrs, None, origin))
                cur = new[-1].outputs[0]
            inputs.append(cur)
        else:  # the heads as the product reads them, repeated ones included
            inputs.append(_copied(t[3], batch, heads, tokens, kt, new, origin))
        offsets.append(0)
    # context (batch*heads, q_len, dim) -> views -> (batch, q_len, heads*dim) or 2-D
    cur = bmm2.outputs[0]
    idx = _index(cur.shape, env)
    want_all = _index((batch, heads, q_len, dim), env).transpose(0, 2, 1, 3)
    final = None
    while True:
        p = g.sole(cur)
        if p is None or p.op not in _VIEWS:
            break
        idx = _view(idx, p.op, p.attrs, env)
        cur = p.outputs[0]
        if same(cur.shape[-1], heads * dim) and cur.rank in (2, 3) \
                and np.array_equal(idx, want_all.reshape(_at(cur.shape, env))):
            final = cur
    if final is None or final.producer is None:
        return None
    old = final.producer
    if terms:
        mask = _mask(terms, (batch, heads, q_len, k_len), new, origin)
        if mask is None:
            return None
        inputs.append(mask)
    attrs = {"num_heads": heads, "head_dim": dim, "scale": scale, "q_offset": offsets[0],
             "k_offset": offsets[1], "v_offset": offsets[2], "nan_to_zero": nan_to_zero}
    if kv_heads != heads:
        attrs["kv_heads"] = kv_heads
    if final.rank == 3:
        new.append(new_prim("attention", inputs, attrs, final, origin))
    else:
        att = new_prim("attention", inputs, attrs, None, origin)
        new.append(att)
        new.append(new_prim("reshape", [att.outputs[0]], {"newshape": list(final.shape)}, final,
                             origin))
    return new, old
