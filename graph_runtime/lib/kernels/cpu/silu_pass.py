"""silu in place over a conv's float32 output rows, compiled, right after the primitive wrote them.

oneDNN 3.2's swish post-op (x * sigmoid(x)) is slow on this AVX-512 machine: a 1x1 conv
16 -> 64 at 128x128 took 385-480 us with it against 170 us with relu, a depthwise 3x3 over the
same output 420-870 us against 147 (MobileViT, session 17). This pass computes x / (1 + e^-x)
with fast_math's exp32 in a loop LLVM vectorizes (0.35 ns a value on one core against oneDNN's
0.43-1.4 ns), within 2 float32 ulps (tests/lib/test_silu_pass.py), NaN and infinities as NumPy's
x * sigmoid(x) gives them. A oneDNN conv whose tail ends in silu leaves that silu to this pass
(onednn/conv.py, handed SiluBand by conv_choice.py: the oneDNN family imports nothing of this
one): each work item's rows, on the worker that convolved them, or split over oneDNN's OpenMP
team when one primitive ran there. Which is faster depends on the machine and the threads (a
2-vCPU Intel Xeon on one thread: the swish post-op added 0.49 ns a value to a 1x1 conv, the
pass over its 4 MB output 0.7): conv_choice.py races the two per conv shape (onednn against
onednn_swish), the pass kept unless the post-op is clearly faster.
"""
from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import carray

from . import jit_setup
from .fast_math import exp32
from .omp_team import float32_at, my_rows, run_on_team, team_kernel

# NOTE: contraction (fused multiply-adds) but no reassociation: exp32 rounds to an integer by
# adding and subtracting 1.5 * 2^23, which a reassociating LLVM folds away (errors of 100%).
FLAGS = {"contract", "nsz", "arcp", "afn"}


@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=FLAGS, boundscheck=False)
def silu_in_place(x: Any) -> None:
    """x[i] = x[i] * sigmoid(x[i]) over a 1-D float32 array."""
    one = np.float32(1.0)
    for i in range(x.size):
        v = x[i]
        x[i] = v / (one + exp32(-v))


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def silu_at(address: int, count: int) -> None:
    """silu_in_place over count float32 values at address."""
    silu_in_place(float32_at(address, (count,)))


@team_kernel
def _silu_team(data: Any) -> None:
    b = carray(data, (2,), np.int64)
    # whole cache lines (16 values) per thread, so that no two threads write one line
    lines = (b[1] + 15) // 16
    lo, hi = my_rows(lines)
    hi = min(hi * 16, b[1])
    if lo * 16 < hi:
        silu_at(b[0] + 64 * lo, hi - lo * 16)


class SiluBand:
    """One work item's silu: count float32 values at an address bound each time the item's
    output moves; on_team: the item's primitive ran on the OpenMP team, and so does this."""

    __slots__ = ("count", "on_team", "block")

    def __init__(self, count: int, on_team: bool) -> None:
        self.count = count
        self.on_team = on_team
        self.block = np.array([0, count], np.int64)  # (address, count): the team's block
        jit_setup.start()

    def bind_address(self, address: int) -> None:
        self.block[0] = address

    def run(self) -> None:
        if self.on_team:
            run_on_team(_silu_team(), self.block)
        else:
            silu_at(int(self.block[0]), self.count)
