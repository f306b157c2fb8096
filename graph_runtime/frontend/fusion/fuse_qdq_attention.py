"""Multi-head attention in quantize_static's QDQ form matched into one qdq_attention op.

After fuse_qdq.py, BERT's attention is still some twenty prims between the Q, K and V
projections' int8 results and the int8 context: head views, Q -> DQ around every float op, the
scaled heads, two batched products, the quantized mask add, softmax and where(isnan). Every
rounding the model specifies is kept, in order: each operand of a product is a function of one
int8 tensor's bytes (its DQ, scale and Q -> DQ steps: a 256-entry float table the operand's own
prims compute, as fuse_lookup.py's), the scores and the context are quantized with the model's
parameters, the mask add is qadd's table, softmax reads its DQ'd input and its output is
quantized again (kernels/cpu/qdq_attention.py). Only the standard head layout is matched
(each of q, k, v one (batch, tokens, heads * dim) int8 tensor; the context back in it).
"""
from __future__ import annotations

from collections import Counter

import math
from typing import Any

import numpy as np

from .fuse_attention import _heads
from .fuse_lookup import INT8, _cone, _elementwise, _table, closed
from ..ir import Prim, Value
from .pattern import PatternGraph, new_prim

VIEWS = ("reshape", "transpose")


def _views(g: PatternGraph, v: Value) -> tuple[Value, list[tuple[str, Any]], list[Prim]]:
    """The value v is a chain of views of (each step read once), the steps, and their prims."""
    steps: list[tuple[str, Any]] = []
    prims: list[Prim] = []
    cur = v
    while cur.producer is not None and cur.producer.op in VIEWS and g.sole(cur) is not None:
        p = cur.producer
        steps.append((p.op, p.attrs))
        prims.append(p)
        cur = p.inputs[0]
    return cur, steps, prims


def _index(src: Value, *chains: list[tuple[str, Any]]) -> np.ndarray:
    """src's element indices through the chains of view steps (each listed last step first,
    the first chain nearest src)."""
    idx = np.arange(math.prod(src.shape)).reshape(src.shape)
    for steps in chains:
        for op, attrs in reversed(steps):
            idx = idx.reshape(attrs["newshape"]) if op == "reshape" else idx.transpose(
                attrs["axes"])
    return idx


def _quantized(g: PatternGraph, y: Value) -> tuple[Value, float, int, list[Prim]] | None:
    """(x, scale, zero, prims) when y = cast(clip(add(cast(round(divide(x, scale)), int32),
    zero))), QuantizeLinear's lowering (convert_quant.py) with scalar parameters."""
    chain: list[Prim] = []
    cur = y
    want = ["cast", "clip", "add", "cast", "round", "divide"]
    zero = 0
    for op in want:
        p = cur.producer
        if op == "add" and p is not None and p.op == "cast":
            continue  # no zero point
        if p is None or p.op != op or (chain and g.sole(cur) is not chain[-1]):
            return None
        chain.append(p)
        if op == "add":
            z = p.inputs[1].const
            if z is None or z.size != 1 or z.dtype.kind not in "iu":
                return None
            zero = int(z.reshape(()))
        cur = p.inputs[0]
    divide = chain[-1]
    scale = divide.inputs[1].const
    if scale is None or scale.size != 1 or y.dtype not in INT8 \
            or chain[-3].outputs[0].dtype != "int32":
        return None
    return cur, float(scale.reshape(())), zero, chain


def _real(g: PatternGraph, v: Value) -> bool:
    """Whether v is the Q of a value no elementwise prim makes (softmax's or a product's)."""
    found = _quantized(g, v)
    if found is None:
        return False
    p = found[0].producer
    return p is not None and p.op not in _elementwise()


def _operand(g: PatternGraph, v: Value, ops: frozenset[str], order: dict[int, int]
             ) -> tuple[Value, np.ndarray, np.ndarray, list[Prim]] | None:
    """(int8 root, v's elements as indices into it, v's value per root byte, prims) when v is
    a view of an elementwise function of a view of one int8 tensor."""
    made, float_steps, views = _views(g, v)
    cone = _cone(made, ops, False, lambda u: _real(g, u))
    if cone is None or made.dtype != "float32":
        return None
    prims, leaf = cone
    if not closed(g, prims, made):
        return None
    if made is not v and g.sole(made) is None:
        return None
    root, byte_steps, more = _views(g, leaf)
    if root.dtype not in INT8:
        return None
    table = _table(sorted(prims, key=lambda p: order[id(p)]), leaf, made)
    return root, _index(root, byte_steps, float_steps), table, prims + views + more


def _byte_map(g: PatternGraph, v: Value, ops: frozenset[str], order: dict[int, int]
              ) -> tuple[Value, np.ndarray | None, list[Prim]] | None:
    """(u, table, prims): int8 v as an elementwise function of the Q'd product u (table: v's
    bytes per byte of u; None when v is u itself)."""
    if _real(g, v):
        return v, None, []
    cone = _cone(v, ops, False, lambda u: _real(g, u))
    if cone is None:
        return None
    prims, leaf = cone
    if not closed(g, prims, v):
        return None
    return leaf, _table(sorted(prims, key=lambda p: order[id(p)]), leaf, v), prims


def _product(g: PatternGraph, out: Value) -> Prim | None:
    p = out.producer
    if p is None or p.op != "batch_matmul" or p.attrs.get("transpose_a", False) \
            or out.dtype != "float32" or out.rank != 3:
        return None
    return p


def match_qdq_attention(g: PatternGraph, y: Value, order: dict[int, int]
                        ) -> tuple[Prim, list[Prim]] | None:
    """The qdq_attention prim making int8 y (the context in (batch, tokens, width)), and the
    prims it replaces; None where y is not such an attention's result."""
    ops = _elementwise() - {"qadd"}
    ctx_src, out_steps, out_views = _views(g, y)
    found = _quantized(g, ctx_src)
    if found is None:
        return None
    ctx_float, y_scale, y_zero, y_prims = found
    made, mid_steps, mid_views = _views(g, ctx_float)
    second = _product(g, made)
    if second is None or g.sole(made) is None:
        return None
    probs, values = second.inputs
    p_side = _operand(g, probs, ops, order)
    v_side = _operand(g, values, ops, order)
    if p_side is None or v_side is None:
        return None
    p8 = p_side[0]
    p_q = _quantized(g, p8)
    if p_q is None or p_q[0].producer is None or p_q[0].producer.op != "softmax":
        return None
    softmax = p_q[0].producer
    if softmax.attrs.get("axis", -1) not in (-1, softmax.outputs[0].rank - 1) \
            or softmax.outputs[0].rank != 4 or g.sole(p_q[0]) is None:
        return None
    batch, heads, tokens, keys = softmax.outputs[0].shape
    a_side = _operand(g, softmax.inputs[0], ops, order)
    if a_side is None or a_side[0].producer is None or a_side[0].producer.op != "qadd" \
            or not np.array_equal(a_side[1], _index(a_side[0])):
        return None
    qadd = a_side[0].producer
    if g.sole(a_side[0]) is None:
        return None
    scores8, mask8 = qadd.inputs
    swap = False
    if scores8.shape != (batch, heads, tokens, keys):
        scores8, mask8, swap = mask8, scores8, True
    if scores8.shape != (batch, heads, tokens, keys) or mask8.rank != 4 \
            or mask8.shape[0] not in (1, batch) or mask8.shape[1] != 1 \
            or mask8.shape[2] not in (1, tokens) or mask8.shape[3] != keys \
            or g.sole(scores8) is None:
        return None
    s_map = _byte_map(g, scores8, ops, order)
    if s_map is None:
        return None
    s_q = _quantized(g, s_map[0])
    if s_q is None:
        return None
    s_made, s_steps, s_views = _views(g, s_q[0])
    first = _product(g, s_made)
    if first is None or g.sole(s_made) is None or not np.array_equal(
            _index(s_made, s_steps).reshape(-1), np.arange(math.prod(s_made.shape))):
        return None
    q_side = _operand(g, first.inputs[0], ops, order)
    k_side = _operand(g, first.inputs[1], ops, order)
    if q_side is None or k_side is None:
        return None
    dim = first.inputs[0].shape[-1]
    width = heads * dim
    key_t = not first.attrs.get("transpose_b", True)
    v_key_t = bool(second.attrs.get("transpose_b", True))
    for side, kt in ((q_side, False), (k_side, key_t), (v_side, v_key_t)):
        root = side[0]
        if root.shape != (batch, tokens, width) or _heads(root, side[1], tokens, dim, kt) \
                != (batch, heads, 0, heads):  # every head its own k and v
            return None
    p_want = _index(softmax.outputs[0]).reshape(batch * heads, tokens, keys)
    if not np.array_equal(p_side[1], p_want) or tokens != keys:
        return None
    ctx_idx = _index(made, mid_steps, out_steps)
    want = np.arange(math.prod(made.shape)).reshape(batch, heads, tokens, dim)
    if y.shape != (batch, tokens, width) \
            or not np.array_equal(ctx_idx, want.transpose(0, 2, 1, 3).reshape(y.shape)):
        return None
    from ...lib.kernels.cpu.quantized import qadd_table
    attrs = {k: qadd.attrs[k] for k in ("a_scale", "a_zero", "b_scale", "b_zero", "y_scale",
                                         "y_zero")}
    names = ("a_scale", "a_zero", "b_scale", "b_zero") if not swap else (
        "b_scale", "b_zero", "a_scale", "a_zero")
    add = qadd_table((float(attrs[names[0]]), float(attrs[names[2]]), float(attrs["y_scale"])),
                     (int(attrs[names[1]]), int(attrs[names[3]]), int(attrs["y_zero"])),
                     bool(qadd.attrs.get("relu", False)), scores8.dtype, mask8.dtype,
                     a_side[0].dtype)
    if s_map[1] is not None:  # the scores' own steps before the add, by the scores' byte
        add = add.reshape(256, 256)[s_map[1].view(np.uint8).astype(np.int64)].reshape(-1)
    consts = [Value(f"{y.name}_{n}", (t.size,), str(t.dtype), const=t) for n, t in
              (("q_table", q_side[2]), ("k_table", k_side[2]), ("v_table", v_side[2]),
               ("add_table", add), ("a_table", a_side[2]), ("p_table", p_side[2]))]
    new_attrs = {"heads": heads, "s_scale": s_q[1], "s_zero": s_q[2], "s_dtype": s_map[0].dtype,
                 "p_scale": p_q[1], "p_zero": p_q[2], "p_dtype": p8.dtype,
                 "y_scale": y_scale, "y_zero": y_zero, "y_dtype": y.dtype}
    mask = mask8
    prim = new_prim("qdq_attention", [q_side[0], k_side[0], v_side[0], mask] + consts,
                    new_attrs, y, second.origin)
    replaced = [second, first, qadd, softmax] + out_views + y_prims + mid_views \
        + p_side[3] + v_side[3] + p_q[3] + a_side[3] + s_map[2] + s_q[3] + s_views + q_side[3] + k_side[3]
    return prim, replaced


def fuse_qdq_attention(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with each matched attention one qdq_attention (the prims it replaces left unread,
    for emission to drop), and how many."""
    from .fuse_qkv import live
    alive = live(prims, outputs)
    g = PatternGraph(alive, outputs)
    order = {id(p): i for i, p in enumerate(alive)}
    replace: dict[int, Prim] = {}
    for p in alive:
        if len(p.outputs) != 1 or p.outputs[0].dtype not in INT8 or p.op not in VIEWS + ("cast",):
            continue
        try:
            found = match_qdq_attention(g, p.outputs[0], order)
        except (ValueError, KeyError, TypeError, IndexError):
            continue
        if found is not None:
            replace[id(p)] = found[0]
    return [replace.get(id(p), p) for p in prims], Counter(qdq_attention=len(replace))
