"""kv_append on the CPU (ops/kv_append.py): one compiled pass over a step's tokens, cpu/rotary.py's
rotation (bit for bit the exporters' Mul, Neg, Mul and Add) for q and k, the past's rows copied
first. In a decode step it replaces seven small steps a layer, which in a run cost 4-8 us each
with the weights streaming through the caches between them (docs/measurements.md).

A node calls it through its site (KvAppendSite, cpu/block_site.py): recorded, the same pass
runs as a team function on the site's block, and a new past length rewrites the block instead
of recording the step again."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numba import carray

from ...prepared import PreparedKernel
from . import jit_setup
from .block_site import BlockSite, DimsMemo, float32_dims
from .loops_jit import compiled, inlined
from .omp_team import float32_at, team_kernel
from .rotary import _rotate_row

# the team function's block: the arguments in order (qkv, past_k, past_v, cos, sin, q,
# present_k, present_v), each as its address and its dims (RANKS), then the kernel's attrs
RANKS = (3, 4, 4, 3, 3, 3, 4, 4)
BLOCK = len(RANKS) + sum(RANKS) + 7


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


@team_kernel
def _kv_append_team(data: Any) -> None:
    """_kv_append on the block (BLOCK) by the calling thread: the same pass on the same
    arrays, each seen at its own address and dims."""
    b = carray(data, (BLOCK,), np.int64)
    qkv = float32_at(b[0], (b[1], b[2], b[3]))
    past_k = float32_at(b[4], (b[5], b[6], b[7], b[8]))
    past_v = float32_at(b[9], (b[10], b[11], b[12], b[13]))
    cos = float32_at(b[14], (b[15], b[16], b[17]))
    sin = float32_at(b[18], (b[19], b[20], b[21]))
    q = float32_at(b[22], (b[23], b[24], b[25]))
    present_k = float32_at(b[26], (b[27], b[28], b[29], b[30]))
    present_v = float32_at(b[31], (b[32], b[33], b[34], b[35]))
    _kv_append(qkv, cos, sin, past_k, past_v, q, present_k, present_v, b[36], b[37], b[38],
               b[39], b[40], b[41], b[42])


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

    def call_site(self) -> KvAppendSite:
        """The kernel as one node calls it: a block of that node's own (the KernelCache shares
        one kernel between a decoder's layers)."""
        return KvAppendSite(self)


class KvAppendSite(BlockSite):
    """KvAppendKernel's calls by one node (cpu/block_site.py)."""

    def __init__(self, kernel: KvAppendKernel) -> None:
        super().__init__(BLOCK)
        self.kernel = kernel
        self.attrs = list(kernel.attrs)
        self._memo = DimsMemo()

    def function(self) -> Any:
        return _kv_append_team()

    def plain(self, *args: Any) -> None:
        self.kernel(*args)

    def values(self, args: Sequence[Any]) -> list[int] | None:
        """The block for these arrays (C-contiguous float32 of the ranks the pass reads), each
        with its own dims: the team function reads what the plain pass would."""
        values = float32_dims(args, RANKS, self._memo)
        return None if values is None else values + self.attrs
