"""split on the CPU: each output copied from its columns of the input's rows.

A split's outputs are slices of the input along one axis: seen as rows (the dims before the
axis together) of bytes (the axis and the dims after it), each output takes the same byte
range of every row. NumPy's copy of each slice does it; while a replay records
(kernels/replay.py), the same copies run as one team function on the calling thread, which the
replay runs again with its neighbours: a LLaMA-style prompt's split of the fused q, k, v
product between two replayed stretches, in every layer.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numba import carray

from ...prepared import PreparedKernel
from .. import replay
from .omp_team import block, copy_bytes, my_rows, recording_here, run_here, team_kernel

HEAD = 4  # the block's first entries: the input's address, rows, bytes a row, outputs


@team_kernel
def _split_team(data: Any) -> None:
    """The block holds the input's address, its rows, its bytes a row and the count of
    outputs, then per output its address, its first byte in a row and its bytes a row; the
    calling team thread copies its share of the rows."""
    head = carray(data, (HEAD,), np.int64)
    rows, width, outputs = head[1], head[2], head[3]
    b = carray(data, (HEAD + 3 * outputs,), np.int64)
    lo, hi = my_rows(rows)
    for k in range(outputs):
        at = HEAD + 3 * k
        out, start, count = b[at], b[at + 1], b[at + 2]
        for r in range(lo, hi):
            copy_bytes(out + r * count, b[0] + r * width + start, count)


class HostSplit(PreparedKernel):
    """run(x, *outs): outs[i] = x's pieces[i] (start, count) along axis, through xp's copies
    (NumPy's, or CuPy's for arrays on a GPU: those are never recorded)."""

    def __init__(self, xp: Any, axis: int, pieces: Sequence[tuple[int, int]]) -> None:
        self.xp = xp
        self.axis = axis
        self.pieces = list(pieces)
        self.index = [(slice(None),) * axis + (slice(start, start + count),)
                      for start, count in pieces]

    def __call__(self, x: Any, *outs: Any) -> None:
        if recording_here() and self._recorded(x, outs):
            return
        for out, where in zip(outs, self.index):
            self.xp.copyto(out, x[where])

    def _recorded(self, x: Any, outs: Sequence[Any]) -> bool:
        """The copies as one team function on this thread, vouched for (its whole work), where
        every array is C-contiguous and of x's dtype; False where not (copied by NumPy)."""
        arrays = (x, *outs)
        if not all(isinstance(a, np.ndarray) and a.dtype == x.dtype and a.flags.c_contiguous
                   for a in arrays):
            return False
        rows = int(np.prod(x.shape[:self.axis], dtype=np.int64))
        inner = int(np.prod(x.shape[self.axis + 1:], dtype=np.int64)) * x.itemsize
        values: list[Any] = [x, rows, x.shape[self.axis] * inner, len(outs)]
        for out, (start, count) in zip(outs, self.pieces):
            values += [out, start * inner, count * inner]
        run_here(_split_team(), block(*values))
        replay.whole_call(self)
        return True
