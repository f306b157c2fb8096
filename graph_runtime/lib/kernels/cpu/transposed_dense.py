"""Batched dense products x[m, k] @ w[n, k].T with the weight kept transposed, when that pays.

OpenBLAS's kernel for a transposed B is slower on some shapes than for a plain one (the
batch-32 MLP's 32x784 @ (512x784).T; docs/measurements.md). The copy is derived data: made once
per weight version (derived.py), counted as workspace (it doubles that weight's memory), and
only where it measured clearly faster on this machine, once per shape (the tuning service).

GRAPH_RUNTIME_DENSE_TRANSPOSE: auto (default, measured per shape), on, off.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .... import settings
from ...._timing import Race, Verdict, sampler
from ...tunable import Candidate, TunableOp
from ...tuning import Choice
from ..derived import DerivesFromInputs

# the given weight, or a kept transposed copy (TransposedDense, built by ops/linalg.py)
TRANSPOSE: TunableOp[None] = TunableOp(Choice("cpu.dense_transpose", settings.DENSE_TRANSPOSE),
                                       (Candidate("off"), Candidate("on")))
MIN_FLOPS = 1e6  # below this the call is too short for the layout to matter


def keeps_transposed(m: int, n: int, k: int, dtype: str) -> bool:
    """Whether x[m, k] @ w[n, k].T should run against a transposed copy of w."""
    if m < 2 or 2.0 * m * n * k < MIN_FLOPS or dtype not in ("float32", "float64"):
        return False
    key = f"{dtype} x {m}x{k} weight {n}x{k}"
    chosen = TRANSPOSE.choose(("off", "on"), "cpu", key,
                              lambda race: _race(race, m, n, k, dtype), "off")
    return chosen == "on"


def _race(race: Race, m: int, n: int, k: int, dtype: str) -> Verdict:
    """Both layouts raced on arrays of the real shapes, 8 calls a sample (a few ms)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(dtype)
    wt = np.ascontiguousarray(w.T)
    out = np.empty((m, n), dtype)

    def kept() -> None:
        np.dot(x, wt, out=out)

    def given() -> None:
        np.dot(x, w.T, out=out)

    return race({"on": sampler(kept, number=8), "off": sampler(given, number=8)})


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
