"""One-row dense products whose weight gets zero rows so that OpenBLAS runs them on every core.

OpenBLAS runs a GEMV on one thread below 460,800 weights (115,200 x its default
GEMM_MULTITHREAD_THRESHOLD of 4) and on all cores from there on. Batch-1 layers such as the
MLP's 784x512 and 512x512 sit just below, so on a server core with 1 MB of L2 their weights
stream from L3 at one core's bandwidth. Zero rows up to the threshold make the same call
multi-threaded; the extra outputs are zeros nobody reads. The weight must live in the padded
buffer for that, so the kernel asks the executor to place the weight's entry there
(storage_requests); a weight bound elsewhere later (zero copy) takes the plain call. Whether the
padding pays is measured once per shape on this machine (a candidate of dense's one set,
dense_choice.py), not assumed; it is not offered where oneDNN's products run on OpenMP threads
over every core, whose threads and OpenBLAS's would spin against each other.

GRAPH_RUNTIME_GEMV_PADDING: auto (default, measured), on (whenever the size allows), off.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...prepared import PreparedKernel

OPENBLAS_THREADED_WEIGHTS = 460_800
MAX_GROWTH = 2.0  # at most twice the weights: beyond that the extra traffic eats the gain


def padded_rows(k: int, n: int, dtype: str) -> int:
    """Rows to give an [n, k] weight of x[1, k] @ w.T so that OpenBLAS threads it, or 0 where
    padding cannot pay (already threaded, or more than MAX_GROWTH times the weights)."""
    if dtype not in ("float32", "float64") or k == 0 or n == 0:
        return 0
    rows = -(-OPENBLAS_THREADED_WEIGHTS // k)
    return 0 if rows <= n or rows > MAX_GROWTH * n else rows


class PaddedGemv(PreparedKernel):
    """run(a, b, out) = a[1, k] @ b[n, k].T; through the padded buffer when b is its weight view.

    Asks the executor (storage_requests) to keep the weight's entry in its padded buffer.
    """

    def __init__(self, k: int, n: int, rows: int, dtype: str) -> None:
        self.buffer = np.zeros((rows, k), dtype)
        self.weight = self.buffer[:n]
        self._wide = np.empty((1, rows), dtype)
        self._head = self._wide[:, :n]  # the outputs of the real rows
        self._a_shape, self._out_shape = (1, k), (1, n)

    def storage_requests(self) -> dict[int, Any]:
        """Input 1 (the weight) should live in the first rows of the padded buffer."""
        return {1: self.weight}

    def workspace_bytes(self) -> int:
        """The zero rows below the weight and the wide output row."""
        return int(self.buffer.nbytes - self.weight.nbytes + self._wide.nbytes)

    def __call__(self, a: Any, b: Any, out: Any) -> None:
        a2 = a if a.shape == self._a_shape else a.reshape(self._a_shape)
        out2 = out if out.shape == self._out_shape else out.reshape(self._out_shape)
        if b is self.weight:
            np.dot(a2, self.buffer.T, out=self._wide)
            np.copyto(out2, self._head)
        else:
            np.dot(a2, b.T, out=out2)
