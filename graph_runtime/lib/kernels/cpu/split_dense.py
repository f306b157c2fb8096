"""Batched dense products split by output columns over work-stealing CPU workers.

x[m, k] @ w[n, k].T for m > 1 (the batch-32 MLP) is compute bound; OpenBLAS's threaded GEMM
splits it statically, so one descheduled thread on a shared machine stalls the call. Here the
columns go out in blocks to threads.parallel_images workers, each on one BLAS thread, so a
worker that has a core takes more blocks. Whether the split beats the other ways is measured
once per shape on this machine ("auto": a candidate of dense's one set, dense_choice.py).

Off by default: on the shared 2-core development machine the split measured faster in isolation
but ran the batch-32 MLP's dense layers slower inside the graph (OpenBLAS's own threads,
spinning after the graph's other BLAS calls, compete with the workers; docs/measurements.md),
so it is opt-in until a quiet machine shows it pays in the graph.

GRAPH_RUNTIME_DENSE_SPLIT: off (default), auto (measured once per shape), on.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...prepared import PreparedKernel
from ..threads import num_threads, parallel_images

MIN_FLOPS = 4e6  # below this a call is too short to hand out
MIN_COLUMNS = 64  # per block: narrower GEMMs lose BLAS efficiency


def split_blocks(m: int, n: int, k: int, dtype: str) -> int:
    """Column blocks for x[m, k] @ w[n, k].T, or 0 where the split does not apply."""
    workers = num_threads()
    blocks = min(2 * workers, n // MIN_COLUMNS)
    if (workers < 2 or m < 2 or blocks < 2 or 2.0 * m * n * k < MIN_FLOPS
            or dtype not in ("float32", "float64")):
        return 0
    return blocks


class SplitDense(PreparedKernel):
    """run(x, w, out): out[m, n] = x[m, k] @ w[n, k].T, column blocks on parallel workers."""

    def __init__(self, m: int, n: int, k: int, blocks: int) -> None:
        self.shapes = ((m, k), (n, k), (m, n))
        step = -(-n // blocks)
        self.bounds = [(j, min(n, j + step)) for j in range(0, n, step)]
        self.workers = min(num_threads(), len(self.bounds))

    def uses_workers(self) -> bool:
        return True

    def __call__(self, a: Any, b: Any, out: Any) -> None:
        a_shape, b_shape, c_shape = self.shapes
        x = a if a.shape == a_shape else a.reshape(a_shape)
        w = b if b.shape == b_shape else b.reshape(b_shape)
        y = out if out.shape == c_shape else out.reshape(c_shape)
        bounds = self.bounds

        def block(worker: int, index: int) -> None:
            j0, j1 = bounds[index]
            np.matmul(x, w[j0:j1].T, out=y[:, j0:j1])
        parallel_images(len(bounds), self.workers, block)
