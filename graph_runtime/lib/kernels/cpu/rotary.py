"""Rotary position embedding on the CPU: one compiled pass from token layout to token layout."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...prepared import PreparedKernel
from . import jit_setup
from .loops_jit import compiled


# NOTE: x * cos + (-x_other) * sin, each product rounded, then the sum: the exporters' Mul, Neg,
# Mul and Add give these values bit for bit (fastmath is off: no fused multiply-add).
@compiled
def _rotate(x: Any, cos: Any, sin: Any, out: Any, heads: int, dim: int, rot: int,
            offset: int) -> None:
    nb, nt = out.shape[0], out.shape[1]
    half = rot // 2
    for b in range(nb):
        for t in range(nt):
            row, c, s, o = x[b, t], cos[b, t], sin[b, t], out[b, t]
            for h in range(heads):
                src, dst = offset + h * dim, h * dim
                for j in range(half):
                    o[dst + j] = row[src + j] * c[j] + -row[src + j + half] * s[j]
                for j in range(half, rot):
                    o[dst + j] = row[src + j] * c[j] + row[src + j - half] * s[j]
                for j in range(rot, dim):
                    o[dst + j] = row[src + j]


class RotaryKernel(PreparedKernel):
    """run(x, cos, sin, out): the heads of columns [offset, offset + heads * dim) of x rotated
    into out, cos and sin broadcast to (batch, tokens, rot). It reads the batch and tokens from
    out at each call: a symbolic module keeps it for every prompt length (any_shape)."""

    def __init__(self, heads: int, dim: int, rot: int, offset: int) -> None:
        jit_setup.start()
        self.heads, self.dim, self.rot, self.offset = heads, dim, rot, offset

    def __call__(self, x: Any, cos: Any, sin: Any, out: Any) -> None:
        table = (out.shape[0], out.shape[1], self.rot)
        _rotate(x, np.broadcast_to(cos, table), np.broadcast_to(sin, table), out,
                self.heads, self.dim, self.rot, self.offset)

    def any_shape(self) -> bool:
        return True
