"""kv_append on the CPU (ops/kv_append.py): one compiled pass over a step's tokens, cpu/rotary.py's
rotation (bit for bit the exporters' Mul, Neg, Mul and Add) for q and k, the past's rows copied
first. In a decode step it replaces seven small steps a layer, which in a run cost 4-8 us each
with the weights streaming through the caches between them (docs/measurements.md)."""
from __future__ import annotations

from typing import Any

from ...prepared import PreparedKernel
from . import jit_setup
from .loops_jit import compiled, inlined
from .rotary import _rotate_row


@inlined
def _copy_rows(src: Any, dst: Any) -> None:
    """src's rows into dst's, a row at a time (a slice assignment of the whole block ran at a
    third of the speed: it did not vectorize)."""
    for r in range(src.shape[0]):
        row, out = src[r], dst[r]
        for j in range(row.size):
            out[j] = row[j]


@compiled
def _kv_append(qkv: Any, cos: Any, sin: Any, past_k: Any, past_v: Any, q: Any, present_k: Any,
               present_v: Any, q_heads: int, kv_heads: int, dim: int, rot: int, q_off: int,
               k_off: int, v_off: int) -> None:
    batch, tokens, past = qkv.shape[0], qkv.shape[1], past_k.shape[2]
    per_batch, per_token = cos.shape[0] > 1, cos.shape[1] > 1
    for b in range(batch):
        for h in range(kv_heads):
            _copy_rows(past_k[b, h], present_k[b, h, :past])
            _copy_rows(past_v[b, h], present_v[b, h, :past])
        cb = b if per_batch else 0
        for t in range(tokens):
            ct = t if per_token else 0
            c, s, row = cos[cb, ct], sin[cb, ct], qkv[b, t]
            _rotate_row(row, c, s, q[b, t], q_heads, dim, rot, q_off)
            for h in range(kv_heads):
                _rotate_row(row, c, s, present_k[b, h, past + t], 1, dim, rot, k_off + h * dim)
                v = row[v_off + h * dim:v_off + (h + 1) * dim]
                out = present_v[b, h, past + t]
                for j in range(dim):
                    out[j] = v[j]


class KvAppendKernel(PreparedKernel):
    """run(qkv, past_k, past_v, cos, sin, q, present_k, present_v). It reads every size from
    its arrays at each call and keeps nothing sized: a symbolic module keeps it for every past
    length and prompt (any_shape, shape_free)."""

    def __init__(self, q_heads: int, kv_heads: int, dim: int, rot: int, q_off: int,
                 k_off: int, v_off: int) -> None:
        jit_setup.start()
        self.attrs = (q_heads, kv_heads, dim, rot, q_off, k_off, v_off)

    def __call__(self, qkv: Any, past_k: Any, past_v: Any, cos: Any, sin: Any, q: Any,
                 present_k: Any, present_v: Any) -> None:
        _kv_append(qkv, cos, sin, past_k, past_v, q, present_k, present_v, *self.attrs)

    def any_shape(self) -> bool:
        return True

    def shape_free(self) -> bool:
        return True
