"""quantize_static's residual add and LayerNorm (qadd -> DQ -> layer_norm -> Q) as one
qadd_layer_norm: the same tables and steps in one call instead of two nodes (BERT-tiny: 4 us
for the qadd and 10 for the chain, where float32's LayerNorm is 4); and the Q of a take from a
constant table as a take from the table quantized at import."""
from __future__ import annotations

from collections import Counter

import numpy as np

from ...lib.kernels.cpu.quantized import qadd_table
from .fuse_lookup import INT8, _cone, _elementwise, _table, closed, evaluate
from .fuse_qdq_attention import _quantized
from ..ir import Prim, Value
from .pattern import PatternGraph, new_prim
from ...lib.ops.qlayer_norm import trailing


def _match(g: PatternGraph, q_out: Prim, order: dict[int, int]) -> Prim | None:
    y = q_out.outputs[0]
    found = _quantized(g, y)
    if found is None:
        return None
    normed, scale, zero, _ = found
    ln = normed.producer
    if ln is None or ln.op != "layer_norm" or ln.attrs.get("axis", -1) not in (
            -1, normed.rank - 1) or g.sole(normed) is None or normed.dtype != "float32" \
            or any(v.const is None for v in ln.inputs[1:3]) or len(ln.inputs) != 3:
        return None
    x = ln.inputs[0]
    cone = _cone(x, _elementwise() - {"qadd"}, True)
    if cone is None or g.sole(x) is not ln:
        return None
    prims, total = cone
    if not closed(g, prims, x):
        return None
    add = total.producer
    if add is None or add.op != "qadd" or g.sole(total) is not next(
            (p for p in prims if total in p.inputs), None) or add.attrs.get("relu"):
        return None
    a, b = add.inputs
    swap = a.shape != x.shape
    if swap:
        a, b = b, a
    if a.shape != x.shape or not trailing(b.shape, a.shape) or a.dtype not in INT8 \
            or b.dtype not in INT8:
        return None
    x_table = _table(sorted(prims, key=lambda p: order[id(p)]), total, x)
    at = add.attrs
    table = qadd_table((float(at["a_scale"]), float(at["b_scale"]), float(at["y_scale"])),
                       (int(at["a_zero"]), int(at["b_zero"]), int(at["y_zero"])), False,
                       add.inputs[0].dtype, add.inputs[1].dtype, total.dtype)
    if swap:  # indexed by (a byte, b byte) of the operands as the kernel takes them
        table = np.ascontiguousarray(table.reshape(256, 256).T).reshape(-1)
    width = x.shape[-1]
    gamma, beta = (np.broadcast_to(v.const.reshape(-1), (width,)).astype(np.float32)  # type: ignore
                   for v in ln.inputs[1:3])
    sums = x_table[table.view(np.uint8).astype(np.int64)]  # the two byte maps composed
    consts = [Value(f"{y.name}_{n}", c.shape, str(c.dtype), const=np.ascontiguousarray(c))
              for n, c in (("sum_table", sums), ("gamma", gamma), ("beta", beta))]
    return new_prim("qadd_layer_norm", [a, b] + consts,
                    {"epsilon": float(ln.attrs.get("epsilon", 1e-5)), "y_scale": scale,
                     "y_zero": zero, "y_dtype": y.dtype}, y, ln.origin)


def _quantized_take(g: PatternGraph, q_out: Prim, order: dict[int, int]) -> Prim | None:
    """take(Q(table), ids) for Q(take(table, ids)) of a constant float table: Q is elementwise
    and take only selects, so the rows quantized at import are the bytes the two give
    (BERT's word embeddings: 8 us a run, 2 so)."""
    y = q_out.outputs[0]
    found = _quantized(g, y)
    if found is None:
        return None
    taken, _, _, prims = found
    take = taken.producer
    if take is None or take.op != "take" or g.sole(taken) is None \
            or take.inputs[0].const is None or take.inputs[0].dtype != "float32":
        return None
    table = take.inputs[0]
    quantized = evaluate(sorted(prims, key=lambda p: order[id(p)]), taken,
                         np.asarray(table.const), y)
    value = Value(f"{table.name}_quantized", table.shape, y.dtype,
                  const=np.ascontiguousarray(quantized))
    return new_prim("take", [value] + take.inputs[1:], dict(take.attrs), y, take.origin)


def fuse_qdq_norms(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with each match one qadd_layer_norm or quantized take (the prims they replace left
    unread), and how many of each."""
    from .fuse_qkv import live
    alive = live(prims, outputs)
    g = PatternGraph(alive, outputs)
    order = {id(p): i for i, p in enumerate(alive)}
    replace: dict[int, Prim] = {}
    for p in alive:
        if p.op != "cast" or len(p.outputs) != 1 or p.outputs[0].dtype not in INT8:
            continue
        try:
            made = _match(g, p, order) or _quantized_take(g, p, order)
        except (ValueError, KeyError, TypeError, IndexError):
            continue
        if made is not None:
            replace[id(p)] = made
    takes = sum(1 for p in replace.values() if p.op == "take")
    return [replace.get(id(p), p) for p in prims], Counter(qadd_layer_norm=len(replace) - takes,
                                                           quantized_take=takes)
