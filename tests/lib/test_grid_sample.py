"""grid_sample (cpu) against a per-point float64 reference written from ONNX's GridSample."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from graph_runtime.lib.ops.grid_sample import reflect


def keys(t: float) -> float:
    a, t = -0.75, abs(t)
    if t <= 1:
        return ((a + 2) * t - (a + 3)) * t * t + 1
    return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a if t < 2 else 0.0


def point(x: np.ndarray, coords: list[float], mode: str, padding: str, align: bool) -> np.ndarray:
    """x (C, *spatial) at one denormalised point, taps fetched with the padding rule."""
    spatial = x.shape[1:]
    lows = [0.0 if align else -0.5 for _ in spatial]
    highs = [d - 1.0 if align else d - 0.5 for d in spatial]

    def fetch(index: tuple[int, ...]) -> np.ndarray:
        fixed = []
        for i, d, lo, hi in zip(index, spatial, lows, highs):
            if padding == "zeros" and not 0 <= i < d:
                return np.zeros(x.shape[0])
            if padding == "border":
                i = min(max(i, 0), d - 1)
            if padding == "reflection":
                i = int(reflect(np.array(float(i)), lo, hi))
            fixed.append(i)
        return x[(slice(None),) + tuple(fixed)]

    axes = []
    for c, d, lo, hi in zip(coords, spatial, lows, highs):
        if mode == "nearest":
            c = float(np.rint(c))
        if c < lo or c > hi:
            c = min(max(c, 0), d - 1) if padding == "border" else (
                float(reflect(np.array(c), lo, hi)) if padding == "reflection" else c)
        if mode == "nearest":
            axes.append([(int(c), 1.0)])
            continue
        base = int(np.floor(c))
        t = c - base
        offsets = (0, 1) if mode == "linear" else (-1, 0, 1, 2)
        axes.append([(base + o, 1 - abs(t - o) if mode == "linear" else keys(t - o))
                     for o in offsets])
    total = np.zeros(x.shape[0])
    for combo in itertools.product(*axes):
        total += np.prod([w for _, w in combo]) * fetch(tuple(i for i, _ in combo))
    return total


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_2d(mode, padding, align, run_op, random_array) -> None:
    x = random_array((2, 3, 4, 5), "float64", seed=1)
    grid = random_array((2, 3, 6, 2), "float64", -1.6, 1.6, seed=2)
    (got,) = run_op("cpu", "grid_sample", [x, grid], {"mode": mode, "padding_mode": padding,
                                                      "align_corners": int(align)})
    for n, i, j in np.ndindex(2, 3, 6):
        gx, gy = grid[n, i, j]
        coords = [((g + 1) / 2 * (d - 1)) if align else (((g + 1) * d - 1) / 2)
                  for g, d in ((gy, 4), (gx, 5))]
        np.testing.assert_allclose(got[n, :, i, j], point(x[n], coords, mode, padding, align),
                                   rtol=1e-10, atol=1e-12)


def test_grid_sample_3d_linear(run_op, random_array) -> None:
    x = random_array((1, 2, 3, 4, 5), "float64", seed=3)
    grid = random_array((1, 2, 3, 2, 3), "float64", -1.2, 1.2, seed=4)
    (got,) = run_op("cpu", "grid_sample", [x, grid], {"mode": "linear"})
    for idx in np.ndindex(2, 3, 2):
        g = grid[(0,) + idx][::-1]
        coords = [((v + 1) * d - 1) / 2 for v, d in zip(g, (3, 4, 5))]
        np.testing.assert_allclose(got[(0, slice(None)) + idx],
                                   point(x[0], coords, "linear", "zeros", False), atol=1e-12)
