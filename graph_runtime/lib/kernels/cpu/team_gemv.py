"""Dense products of a few rows (a decode step's x[1, k] @ w[n, k].T) over oneDNN's OpenMP team.

Such a product reads its whole weight once and does two flops a weight: it runs at the memory's
speed. oneDNN 3.2's matmul reads it at one core's bandwidth even on two threads: in a
LLaMA-style decoder whose 48 MB of weights stream from memory each token, its 512x512 products
took 60 us and its 1376x512 ones 140 (17-20 GB/s), about ONNX Runtime's one-thread speed, where
its default two threads took 32 and 93 us (30 GB/s). Here each thread of the team takes a
contiguous share of the weight's rows (whole cache lines of the output) and makes their dot
products with every row of x, the weight row staying in cache across x's rows: 29 and 99 us on
the same machine (numba, float32, sums reassociated into vector lanes). A compiled tail (the
chain's residual add, silu * up) then runs over the few output rows on the caller.

Offered by dense's candidate set (dense_choice.py) for float32 products of at most MAX_ROWS rows
against a 2-D weight when oneDNN's products run on that team (omp_team.available()), and its base
there: a symbolic module's new shapes take it unmeasured. A race times each candidate alone after
a pause, the team asleep and the weight in cache, so small products go to OpenBLAS's call on one
thread there.

GRAPH_RUNTIME_TEAM_GEMV: auto (default, measured), on (wherever it applies), off.
"""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np
from numba import carray

from ...prepared import PreparedKernel
from . import jit_setup
from .loops_jit import lane_dot
from .omp_team import available, float32_at, my_rows, run_on_team, team_kernel

MAX_ROWS = 8  # of x: beyond, the product has flops enough for a GEMM's blocking to win
LINE = 16  # float32 values per cache line: no two threads write one line of the output
# array sets a kernel keeps blocks for (TeamGemv._bind): a decoder's layers each pass their own,
# a symbolic module's new shapes their new views; past it all are dropped at once
BOUND_KEPT = 64


def applies(m: int, n: int, dtype: str) -> bool:
    """Whether a product of m rows against an [n, k] weight may run here now."""
    return dtype == "float32" and 1 <= m <= MAX_ROWS and n >= 2 * LINE and available()


@team_kernel
def _gemv_team(data: Any) -> None:
    """The block holds x, w and out's addresses, then m, n, k."""
    b = carray(data, (6,), np.int64)
    m, n, k = b[3], b[4], b[5]
    x = float32_at(b[0], (m, k))
    w = float32_at(b[1], (n, k))
    out = float32_at(b[2], (m, n))
    lo, hi = my_rows((n + LINE - 1) // LINE)
    for j in range(lo * LINE, min(hi * LINE, n)):
        row = w[j]
        for r in range(m):
            out[r, j] = lane_dot(x[r], row, np.float32(0.0))


class TeamGemv(PreparedKernel):
    """run(x, w, *tail_inputs, out): out[m, n] = tail(x[m, k] @ w[n, k].T, ...), the product on
    the OpenMP team, then the tail (a chain_jit.CompiledChain over the (m, n) output reading
    its inputs after w; None: the product alone) over the output on the caller."""

    def __init__(self, m: int, n: int, k: int, tail: Any = None) -> None:
        jit_setup.start()
        self.shapes = ((m, k), (n, k), (m, n))
        self.tail = tail
        self.block = np.zeros(6, np.int64)
        self.block[3:] = (m, n, k)
        # per set of arrays met, by identity: weak references to them (an entry is used only
        # while each still is the array it was made for, and keeps none alive: a shape's
        # buffers go with its module) and a block holding their addresses. A module passes the
        # same arrays every run, and one kernel serves a decoder's every layer.
        self._bound: dict[tuple[int, ...], tuple[tuple[Any, ...], np.ndarray]] = {}

    def with_tile_tail(self, tail: Any) -> TeamGemv:
        (m, k), (n, _), _ = self.shapes
        return TeamGemv(m, n, k, tail)

    def note(self) -> str:
        text = "dense of few rows on the OpenMP team"
        return text if self.tail is None else text + ", compiled tail " + "+".join(self.tail.ops)

    def workspace_bytes(self) -> int:
        return 0 if self.tail is None else self.tail.workspace_bytes()

    def __call__(self, a: Any, b: Any, *rest: Any) -> None:
        arrays = (a, b, *rest)
        made = self._bound.get(tuple(map(id, arrays)))
        if made is None or any(ref() is not x for ref, x in zip(made[0], arrays)):
            made = self._bind(arrays)
        if made is None:
            self._copying_product(a, b, rest[-1])
        else:
            run_on_team(_gemv_team(), made[1])
        if self.tail is not None:
            # its rows as one block on this thread: a tail's own call may hand a wide output
            # (8 rows of a vocabulary) to the runtime's workers, beside the team's spinning
            m, n = self.shapes[2]
            self.tail.run_block(0, m, 0, n, n, self.tail.flat_arrays(rest))

    def _bind(self, arrays: tuple[Any, ...]) -> tuple[tuple[Any, ...], np.ndarray] | None:
        """A block pointing at arrays read and written in place (float32, C-contiguous), kept,
        so that a call on the same arrays (every run of a module) skips the copies' checks and
        the address lookups (about 4 us less a call, 29 calls a LLaMA decode step); None where
        x, w or out would need a copy."""
        x, w, out = arrays[0], arrays[1], arrays[-1]
        if not all(isinstance(v, np.ndarray) and v.dtype == np.float32 and v.flags.c_contiguous
                   for v in (x, w, out)):
            return None
        block = self.block.copy()
        block[0], block[1], block[2] = x.ctypes.data, w.ctypes.data, out.ctypes.data
        if len(self._bound) >= BOUND_KEPT:
            self._bound.clear()
        made = self._bound[tuple(map(id, arrays))] = (tuple(map(weakref.ref, arrays)), block)
        return made

    def _copying_product(self, a: Any, b: Any, out: Any) -> None:
        """The product of operands that are not all float32 C-contiguous arrays: copied to be
        read by address, the result copied back into out."""
        x = np.ascontiguousarray(a, np.float32)
        w = np.ascontiguousarray(b, np.float32)
        if out.flags.c_contiguous and out.dtype == np.float32:
            y = out
        else:
            y = np.empty(self.shapes[2], np.float32)
        block = self.block
        block[0] = x.ctypes.data
        block[1] = w.ctypes.data
        block[2] = y.ctypes.data
        run_on_team(_gemv_team(), block)
        if y is not out:
            out[...] = y.reshape(out.shape)
