"""Rotary position embedding on the CPU: one compiled pass from token layout to token layout."""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import carray

from ...prepared import PreparedKernel
from . import jit_setup
from .loops_jit import compiled, inlined
from .rows_jit import PARALLEL_ELEMENTS
from .. import replay
from .omp_team import (available, block, float32_at, my_rows, recording_here, run_here,
                       run_on_team, team_arrays, team_kernel)


# NOTE: x * cos + (-x_other) * sin, each product rounded, then the sum: the exporters' Mul, Neg,
# Mul and Add give these values bit for bit (fastmath is off: no fused multiply-add). Each head
# is read through slices indexed from 0: indices computed as offset + h * dim + j kept numba's
# negative-index checks in the loops, which then did not vectorize (a LLaMA layer's 4 x 194
# tokens of 8 heads: 752 against 94 us).
@inlined
def _rotate_row(row: Any, c: Any, s: Any, o: Any, heads: int, dim: int, rot: int,
                offset: int) -> None:
    half = rot // 2
    for h in range(heads):
        x = row[offset + h * dim:offset + (h + 1) * dim]
        y = o[h * dim:(h + 1) * dim]
        first, second = x[:half], x[half:rot]
        c2, s2 = c[half:rot], s[half:rot]
        out2 = y[half:rot]
        for j in range(half):
            y[j] = first[j] * c[j] + -second[j] * s[j]
        for j in range(half):
            out2[j] = second[j] * c2[j] + first[j] * s2[j]
        for j in range(rot, dim):
            y[j] = x[j]


@compiled
def _rotate(x: Any, cos: Any, sin: Any, out: Any, heads: int, dim: int, rot: int,
            offset: int) -> None:
    for b in range(out.shape[0]):
        for t in range(out.shape[1]):
            _rotate_row(x[b, t], cos[b, t], sin[b, t], out[b, t], heads, dim, rot, offset)


@team_kernel
def _rotate_team(data: Any) -> None:
    """_rotate's rows on oneDNN's OpenMP team (omp_team.py), float32: the block holds x, cos,
    sin, out, tokens, rows, x's and out's widths, heads, dim, rot, offset and whether cos and
    sin hold a table per batch item (else one for all)."""
    b = carray(data, (13,), np.int64)
    tokens, rows, heads, dim, rot = b[4], b[5], b[8], b[9], b[10]
    x = float32_at(b[0], (rows, b[6]))
    out = float32_at(b[3], (rows, b[7]))
    tables = rows if b[12] else tokens
    cos = float32_at(b[1], (tables, rot))
    sin = float32_at(b[2], (tables, rot))
    lo, hi = my_rows(rows)
    for r in range(lo, hi):
        t = r if b[12] else r % tokens
        _rotate_row(x[r], cos[t], sin[t], out[r], heads, dim, rot, b[11])


class RotaryKernel(PreparedKernel):
    """run(x, cos, sin, out): the heads of columns [offset, offset + heads * dim) of x rotated
    into out, cos and sin broadcast to (batch, tokens, rot). It reads the batch and tokens from
    out at each call: a symbolic module keeps it for every prompt length (any_shape)."""

    def __init__(self, heads: int, dim: int, rot: int, offset: int) -> None:
        jit_setup.start()
        self.heads, self.dim, self.rot, self.offset = heads, dim, rot, offset
        self.team = available()  # large calls on oneDNN's OpenMP team

    def __call__(self, x: Any, cos: Any, sin: Any, out: Any) -> None:
        table = (out.shape[0], out.shape[1], self.rot)
        large = out.size >= PARALLEL_ELEMENTS
        if self.team and (large or recording_here()):
            per_batch = cos.shape == table
            if (per_batch or cos.shape in (table[1:], (1, *table[1:]))) and sin.shape == \
                    cos.shape and team_arrays(x, cos, sin, out):
                # small work while a replay records: the team function on this thread alone,
                # as the replay will run it
                (run_on_team if large else run_here)(_rotate_team(), block(
                    x, cos, sin, out, table[1], table[0] * table[1], x.shape[-1],
                    out.shape[-1], self.heads, self.dim, self.rot, self.offset, per_batch))
                if replay.active is not None:
                    replay.whole_call(self)  # one team function on a block: its whole work
                return
        if cos.shape != table or sin.shape != table:  # a decode step's are (1, 1, rot)
            cos, sin = np.broadcast_to(cos, table), np.broadcast_to(sin, table)
        _rotate(x, cos, sin, out, self.heads, self.dim, self.rot, self.offset)

    def any_shape(self) -> bool:
        return True
