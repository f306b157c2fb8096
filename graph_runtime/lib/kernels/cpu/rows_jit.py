"""Numba-compiled row kernels for the CPU: layer_norm and softmax over the last axis in one pass.

NumPy's layer_norm made seven passes over the data (copy, mean, subtract, square, mean, divide,
scale) and softmax five; here each row is read once into cache and made there, sums in float64
for float32 rows. Rows are cut into ranges for the runtime's workers when there are many
(threads.py; the functions release the GIL). Machine code is cached beside this file, as in
loops_jit.py. Used for float32/float64 rows over the last axis; other cases keep NumPy.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from .fast_math import exp_as
from .loops_jit import compiled
from .threads import num_threads, parallel_items

# Row elements x rows above which the rows go to the workers.
PARALLEL_ELEMENTS = 1 << 17


@compiled
def _layer_norm_rows(x: Any, gamma: Any, beta: Any, out: Any, eps: float, lo: int,
                     hi: int) -> None:
    n = x.shape[1]
    for r in range(lo, hi):
        total = 0.0
        for j in range(n):
            total += x[r, j]
        mean = total / n
        sq = 0.0
        for j in range(n):
            d = x[r, j] - mean
            sq += d * d
        inv = 1.0 / math.sqrt(sq / n + eps)
        for j in range(n):
            out[r, j] = (x[r, j] - mean) * inv * gamma[j] + beta[j]


@compiled
def _softmax_rows(x: Any, out: Any, lo: int, hi: int) -> None:
    n = x.shape[1]
    for r in range(lo, hi):
        top = -np.inf
        nan = False
        for j in range(n):
            v = x[r, j]
            if v > top:
                top = v
            elif v != v:
                nan = True
        if nan:
            top = np.nan
        total = 0.0
        for j in range(n):
            # float32 rows: the vectorizable exp of fast_math.py; float64 rows: libm's
            e = exp_as(x[r, j] - top, x[r, j])
            out[r, j] = e
            total += e
        scale = 1.0 / total
        for j in range(n):
            out[r, j] = out[r, j] * scale


def _split(rows: int, width: int, call: Callable[[int, int], None]) -> Callable[[], None]:
    workers = num_threads() if rows * width >= PARALLEL_ELEMENTS and rows > 1 else 1
    if workers <= 1:
        return lambda: call(0, rows)
    chunks = min(rows, 4 * workers)
    bounds = [(c * rows // chunks, (c + 1) * rows // chunks) for c in range(chunks)]

    def run() -> None:
        parallel_items(chunks, workers, lambda w, i: call(*bounds[i]))
    return run


def layer_norm_rows(shape: tuple[int, ...], epsilon: float, center: bool, scale: bool
                    ) -> Callable[..., None]:
    """run(x, gamma, beta, out) normalizing over the last axis."""
    width = int(shape[-1]) if shape else 1
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1

    def run(x: Any, gamma: Any, beta: Any, out: Any) -> None:
        g = gamma if scale else np.ones(width, x.dtype)
        b = beta if center else np.zeros(width, x.dtype)
        x2 = x.reshape(rows, width)
        o2 = out.reshape(rows, width)
        _split(rows, width, lambda lo, hi: _layer_norm_rows(x2, g, b, o2, epsilon, lo, hi))()
    return run


def softmax_rows(shape: tuple[int, ...]) -> Callable[..., None]:
    """run(x, out): softmax over the last axis."""
    width = int(shape[-1])
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1

    def run(x: Any, out: Any) -> None:
        x2 = x.reshape(rows, width)
        o2 = out.reshape(rows, width)
        _split(rows, width, lambda lo, hi: _softmax_rows(x2, o2, lo, hi))()
    return run
