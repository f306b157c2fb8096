"""Dense products of a few rows (a decode step's x[1, k] @ w[n, k].T) over oneDNN's OpenMP team.

Such a product reads its whole weight once and does two flops a weight: it runs at the memory's
speed. oneDNN 3.2's matmul reads it at one core's bandwidth even on two threads: in a
LLaMA-style decoder whose 48 MB of weights stream from memory each token, its 512x512 products
took 60 us and its 1376x512 ones 140 (17-20 GB/s), about ONNX Runtime's one-thread speed, where
its default two threads took 32 and 93 us (30 GB/s). Here the team's threads take the
weight's rows 32 at a time from a shared counter (whole cache lines of the output; a thread
whose core is late takes fewer) and sum eight rows' dot products together with every row of x,
the weight rows staying in cache across x's rows (numba, float32, sums in vector lanes, each
product fused with its sum). A 90 MB chain of decode-size products took 1.57-2.04x ONNX
Runtime's default time one row at a time, evenly split; so, 1.04-1.08x (docs/measurements.md).
A compiled tail (the chain's residual add, silu * up) then runs over the few output rows on the
caller.

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
from .omp_team import available, claim_rows, float32_at, run_at, run_on_team, team_kernel

MAX_ROWS = 8  # of x: beyond, the product has flops enough for a GEMM's blocking to win
LINE = 16  # float32 values per cache line
# rows a team thread takes at a time (whole cache lines of the output: no two threads write one)
CHUNK = 2 * LINE
BLOCK = 8  # int64 entries of a kernel's block (_gemv_team)
COUNTER = BLOCK - 1  # the block's last entry: the first row no thread has taken
# array sets a kernel keeps blocks for (TeamGemv._bind): a decoder's layers each pass their own,
# a symbolic module's new shapes their new views; past it all are dropped at once
BOUND_KEPT = 64


def applies(m: int, n: int, dtype: str) -> bool:
    """Whether a product of m rows against an [n, k] weight may run here now."""
    return dtype == "float32" and 1 <= m <= MAX_ROWS and n >= 2 * LINE and available()


@team_kernel(reassociate=True)
def _gemv_team(data: Any) -> None:
    """The block holds x, w and out's addresses, m, n, k, the address of its last entry and
    that entry (the first row not yet taken: 0 when the team starts). Each thread takes CHUNK
    rows at a time, eight weight rows summed together in vector lanes: eight streams from
    memory in flight, not one, and no thread left waiting for another whose core is busy."""
    b = carray(data, (BLOCK,), np.int64)
    m, n, k = b[3], b[4], b[5]
    x = float32_at(b[0], (m, k))
    w = float32_at(b[1], (n, k))
    out = float32_at(b[2], (m, n))
    while True:
        j = claim_rows(b[6], CHUNK)
        if j >= n:
            return
        end = min(j + CHUNK, n)
        while j + 8 <= end:
            w0, w1, w2, w3 = w[j], w[j + 1], w[j + 2], w[j + 3]
            w4, w5, w6, w7 = w[j + 4], w[j + 5], w[j + 6], w[j + 7]
            for r in range(m):
                xr = x[r]
                s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
                for i in range(k):
                    xi = xr[i]
                    s0 += xi * w0[i]
                    s1 += xi * w1[i]
                    s2 += xi * w2[i]
                    s3 += xi * w3[i]
                    s4 += xi * w4[i]
                    s5 += xi * w5[i]
                    s6 += xi * w6[i]
                    s7 += xi * w7[i]
                o = out[r]
                o[j], o[j + 1], o[j + 2], o[j + 3] = s0, s1, s2, s3
                o[j + 4], o[j + 5], o[j + 6], o[j + 7] = s4, s5, s6, s7
            j += 8
        for jj in range(j, end):
            for r in range(m):
                out[r, jj] = lane_dot(x[r], w[jj], np.float32(0.0))


class TeamGemv(PreparedKernel):
    """run(x, w, *tail_inputs, out): out[m, n] = tail(x[m, k] @ w[n, k].T, ...), the product on
    the OpenMP team, then the tail (a chain_jit.CompiledChain over the (m, n) output reading
    its inputs after w; None: the product alone) over the output on the caller."""

    def __init__(self, m: int, n: int, k: int, tail: Any = None) -> None:
        jit_setup.start()
        self.shapes = ((m, k), (n, k), (m, n))
        self.tail = tail
        # per (x, w, out) met, by identity: weak references to them (an entry is used only
        # while each still is the array it was made for, and keeps none alive: a shape's
        # buffers go with its module), a block holding their addresses and the block's own
        # address. A module passes the same arrays every run, and one kernel serves a
        # decoder's every layer.
        self._bound: dict[tuple[int, ...], tuple[tuple[Any, ...], np.ndarray, int]] = {}

    def with_tile_tail(self, tail: Any) -> TeamGemv:
        (m, k), (n, _), _ = self.shapes
        return TeamGemv(m, n, k, tail)

    def note(self) -> str:
        text = "dense of few rows on the OpenMP team"
        return text if self.tail is None else text + ", compiled tail " + "+".join(self.tail.ops)

    def workspace_bytes(self) -> int:
        return 0 if self.tail is None else self.tail.workspace_bytes()

    def __call__(self, a: Any, b: Any, *rest: Any) -> None:
        out = rest[-1]
        made = self._bound.get((id(a), id(b), id(out)))
        if made is None or made[0][0]() is not a or made[0][1]() is not b \
                or made[0][2]() is not out:
            made = self._bind(a, b, out)
        if made is None:
            self._copying_product(a, b, out)
        else:
            made[1][COUNTER] = 0  # no row taken yet
            run_at(_gemv_team().address, made[2])
        if self.tail is not None:
            # its rows as one block on this thread: a tail's own call may hand a wide output
            # (8 rows of a vocabulary) to the runtime's workers, beside the team's spinning
            m, n = self.shapes[2]
            self.tail.run_block(0, m, 0, n, n, self.tail.flat_arrays(rest))

    def _bind(self, x: Any, w: Any, out: Any
              ) -> tuple[tuple[Any, ...], np.ndarray, int] | None:
        """A block pointing at the arrays read and written in place (float32, C-contiguous),
        kept with its address, so that a call on the same arrays (every run of a module) skips
        the copies' checks and the address lookups (about 5 us less a call, 29 calls a LLaMA
        decode step); None where x, w or out would need a copy. A tail's inputs are not in it
        (read anew each call)."""
        if not all(isinstance(v, np.ndarray) and v.dtype == np.float32 and v.flags.c_contiguous
                   for v in (x, w, out)):
            return None
        block = self._block(x, w, out)
        if len(self._bound) >= BOUND_KEPT:
            self._bound.clear()
        made = self._bound[(id(x), id(w), id(out))] = (
            (weakref.ref(x), weakref.ref(w), weakref.ref(out)), block, block.ctypes.data)
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
        run_on_team(_gemv_team(), self._block(x, w, y))
        if y is not out:
            out[...] = y.reshape(out.shape)

    def _block(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
        """_gemv_team's block for these arrays, its row counter at 0."""
        (m, k), (n, _), _ = self.shapes
        block = np.zeros(BLOCK, np.int64)
        block[:6] = (x.ctypes.data, w.ctypes.data, out.ctypes.data, m, n, k)
        block[6] = block.ctypes.data + COUNTER * block.itemsize
        return block
