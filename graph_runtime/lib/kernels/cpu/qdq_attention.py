"""qdq_attention on the CPU: table lookups for the operands (into head-major arrays), NumPy's
batched products, one compiled pass from the scores to the quantized probabilities and one for
the context.

Each step is the QDQ graph's: the scores quantized (round half to even, to int32, plus the
zero point, clipped: convert_quant.quantize's order), the mask added by qadd's table, softmax
in float32 of the DQ'd sum (max subtracted, exp as the softmax kernel's, sum in order,
divided), the probabilities
quantized and mapped through their table (DQ and any where(isnan) / Q -> DQ after), the
context quantized into (batch, tokens, heads * dim). Single-threaded: BERT-tiny's 4 heads of
32 tokens are a few microseconds of work.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import jit_setup
from .loops_jit import compiled, inlined
from .fast_math import exp_as


def _quantize(x: Any, scale: Any, zero: Any, lo: Any, hi: Any) -> Any:
    q = np.int32(np.rint(x / scale)) + zero
    return min(max(q, lo), hi)


_quantize_inlined = inlined(_quantize)


def _probabilities(scores: Any, mask: Any, add: Any, a_table: Any, p_table: Any,
                   s_params: Any, p_params: Any, work: Any, probs: Any) -> None:
    """probs[b, h, i, :] = p_table[Q(softmax(a_table[add[Q(scores) byte, mask byte]]))];
    work: an int32 array of scores' shape."""
    s_scale, s_zero, s_lo, s_hi = (np.float32(s_params[0]), np.int32(s_params[1]),
                                   np.int32(s_params[2]), np.int32(s_params[3]))
    p_scale, p_zero, p_lo, p_hi = (np.float32(p_params[0]), np.int32(p_params[1]),
                                   np.int32(p_params[2]), np.int32(p_params[3]))
    batch, heads, tokens, keys = scores.shape
    rows = batch * heads * tokens
    flat = scores.reshape(rows, keys)
    q = work.reshape(rows, keys)
    u = probs.reshape(rows, keys)
    # NOTE: each step one pass over all rows: the arithmetic passes vectorize, the lookups
    # (gathers) cannot; in one loop per row nothing did (15 us for BERT-tiny's 4 heads)
    for r in range(rows):
        src = flat[r]
        dst = q[r]
        for j in range(keys):
            dst[j] = _quantize_inlined(src[j], s_scale, s_zero, s_lo, s_hi) & 255
    for r in range(rows):
        b = r // (heads * tokens)
        i = r % tokens
        mask_row = mask[0 if mask.shape[0] == 1 else b, 0 if mask.shape[1] == 1 else i]
        src = q[r]
        dst = u[r]
        for j in range(keys):
            dst[j] = a_table[np.int32(add[(src[j] << 8) | np.int32(mask_row[j])])]
    for r in range(rows):
        row = u[r]
        top = row[0]
        for j in range(1, keys):
            top = max(top, row[j])
        for j in range(keys):
            row[j] = exp_as(row[j] - top, row[j])
        total = np.float32(0)
        for j in range(keys):
            total += row[j]
        dst = q[r]
        for j in range(keys):
            dst[j] = _quantize_inlined(row[j] / total, p_scale, p_zero, p_lo, p_hi) & 255
    for r in range(rows):
        src = q[r]
        dst = u[r]
        for j in range(keys):
            dst[j] = p_table[src[j]]


def _heads(x: Any, table: Any, key: bool, out: Any) -> None:
    """out = table[x's bytes] as heads: x (batch, tokens, heads, dim) bytes; out (batch, heads,
    tokens, dim), or (batch, heads, dim, tokens) for key."""
    batch, tokens, heads, dim = x.shape
    for b in range(batch):
        for i in range(tokens):
            for h in range(heads):
                row = x[b, i, h]
                if key:
                    for d in range(dim):
                        out[b, h, d, i] = table[np.int32(row[d])]
                else:
                    dst = out[b, h, i]
                    for d in range(dim):
                        dst[d] = table[np.int32(row[d])]


def _context(ctx: Any, params: Any, out: Any) -> None:
    """out[b, i, h, :] = Q(ctx[b, h, i, :]): the heads back side by side."""
    scale, zero, lo, hi = (np.float32(params[0]), np.int32(params[1]), np.int32(params[2]),
                           np.int32(params[3]))
    batch, heads, tokens, dim = ctx.shape
    for b in range(batch):
        for h in range(heads):
            for i in range(tokens):
                row = ctx[b, h, i]
                dst = out[b, i, h]
                for d in range(dim):
                    dst[d] = _quantize_inlined(row[d], scale, zero, lo, hi)


_heads_compiled = compiled(_heads)
_probabilities_compiled = compiled(_probabilities)
_context_compiled = compiled(_context)


def qdq_attention_kernel(batch: int, heads: int, tokens: int, dim: int,
                         params: dict[str, tuple[float, int, int, int]],
                         offsets: tuple[int, int, int] = (0, 0, 0)) -> Callable[..., None]:
    """run(q, k, v, mask, q_table, k_table, v_table, add_table, a_table, p_table, out); params
    "s", "p", "y": (scale, zero point, lowest, highest) of the scores', probabilities' and
    context's quantization; offsets: the first column of q, k and v in their arrays."""
    jit_setup.start()
    width = heads * dim
    qh, vh = (np.empty((batch, heads, tokens, dim), np.float32) for _ in range(2))
    kh = np.empty((batch, heads, dim, tokens), np.float32)
    scores = np.empty((batch, heads, tokens, tokens), np.float32)
    probs = np.empty_like(scores)
    work = np.empty(scores.shape, np.int32)
    ctx = np.empty((batch, heads, tokens, dim), np.float32)
    s, p, y = (np.array(params[k], np.float64) for k in ("s", "p", "y"))

    last: list[Any] = [(), ()]  # the arrays of the last run, and the views made of them

    def views(q: Any, k: Any, v: Any, mask: Any, add_table: Any, out: Any) -> tuple[Any, ...]:
        # NOTE: the pool hands the same arrays every run: their views are made once (seven
        # NumPy views a run were ~4 us of BERT-tiny's ~37)
        arrays = (q, k, v, mask, add_table, out)
        if len(last[0]) != len(arrays) or any(a is not b for a, b in zip(arrays, last[0])):
            heads_views = tuple(x.view(np.uint8)[:, :, at:at + width].reshape(
                batch, tokens, heads, dim) for x, at in zip((q, k, v), offsets))
            masks = np.ascontiguousarray(mask).reshape(mask.shape[0], mask.shape[2],
                                                       tokens).view(np.uint8)
            last[:] = [arrays, heads_views + (masks, add_table.view(np.uint8),
                                              out.reshape(batch, tokens, heads, dim))]
        return last[1]  # type: ignore[no-any-return]

    def run(q: Any, k: Any, v: Any, mask: Any, q_table: Any, k_table: Any, v_table: Any,
            add_table: Any, a_table: Any, p_table: Any, out: Any) -> None:
        qv, kv, vv, masks, add, out4 = views(q, k, v, mask, add_table, out)
        if not mask.flags.c_contiguous:  # its copy is this run's (the views' one is stale)
            masks = np.ascontiguousarray(mask).reshape(masks.shape).view(np.uint8)
        _heads_compiled(qv, q_table, False, qh)
        _heads_compiled(kv, k_table, True, kh)
        _heads_compiled(vv, v_table, False, vh)
        np.matmul(qh, kh, out=scores)
        _probabilities_compiled(scores, masks, add, a_table, p_table, s, p, work, probs)
        np.matmul(probs, vh, out=ctx)
        _context_compiled(ctx, y, out4)
    return run
