"""Batched dense products x[m, k] @ w[n, k].T with the weight kept transposed, when that pays.

OpenBLAS's kernel for a transposed B is slower on some shapes than for a plain one (the
batch-32 MLP's 32x784 @ (512x784).T; docs/measurements.md). The copy is derived data: made once
per weight version (derived.py), counted as workspace (it doubles that weight's memory), and
only where it measured clearly faster on this machine, once per shape (a candidate of dense's
one set, dense_choice.py, offered with the tiles off or by GRAPH_RUNTIME_DENSE_TRANSPOSE=on).

GRAPH_RUNTIME_DENSE_TRANSPOSE: auto (default, measured per shape), on, off.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..derived import DerivesFromInputs

MIN_FLOPS = 1e6  # below this the call is too short for the layout to matter


def transposes(m: int, n: int, k: int, dtype: str) -> bool:
    """Whether a transposed copy of w may serve x[m, k] @ w[n, k].T (a batched product of a
    size where the layout can matter)."""
    return m >= 2 and 2.0 * m * n * k >= MIN_FLOPS and dtype in ("float32", "float64")


class TransposedDense(DerivesFromInputs):
    """run(x, w, out): out[m, n] = x[m, k] @ w[n, k].T through a kept (k, n) copy of w."""

    derived = (1,)

    def __init__(self, m: int, n: int, k: int, dtype: str) -> None:
        super().__init__()
        self.shapes = ((m, k), (n, k), (m, n))
        self.wt = np.empty((k, n), dtype)

    def workspace_bytes(self) -> int:
        """The transposed copy of the weight."""
        return int(self.wt.nbytes)

    def __call__(self, a: Any, b: Any, out: Any) -> None:
        a_shape, b_shape, c_shape = self.shapes
        if self._stale():
            np.copyto(self.wt, (b if b.shape == b_shape else b.reshape(b_shape)).T)
        x = a if a.shape == a_shape else a.reshape(a_shape)
        y = out if out.shape == c_shape else out.reshape(c_shape)
        np.dot(x, self.wt, out=y)
