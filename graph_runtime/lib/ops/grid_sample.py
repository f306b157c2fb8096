"""grid_sample (ONNX GridSample): 2-D and 3-D sampling at normalised grid points."""
from __future__ import annotations

import itertools
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..attrs import bool_attr, op_error, str_attr
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import FLOAT_DTYPES, check_dtype

MODES = ("nearest", "linear", "cubic")
PADDINGS = ("zeros", "border", "reflection")
CUBIC_ALPHA = -0.75  # Keys' cubic convolution, as ONNX and PyTorch use


def _params(attrs: Mapping[str, Any]) -> tuple[str, str, bool]:
    op = "grid_sample"
    return (str(str_attr(op, attrs, "mode", "linear", choices=MODES)),
            str(str_attr(op, attrs, "padding_mode", "zeros", choices=PADDINGS)),
            bool_attr(op, attrs, "align_corners", False))


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    op = "grid_sample"
    if len(inputs) != 2:
        raise op_error(op, f"takes 2 inputs (X, grid), got {len(inputs)}")
    x, grid = inputs
    check_dtype(op, x, FLOAT_DTYPES)
    check_dtype(op, grid, FLOAT_DTYPES, "input 1 (grid)")
    spatial = len(x.shape) - 2
    if spatial not in (2, 3) or len(grid.shape) != spatial + 2 or grid.shape[0] != x.shape[0] \
            or grid.shape[-1] != spatial:
        raise op_error(op, f"X {x} and grid {grid}: expected (N, C, H, W) with (N, H', W', 2) "
                           "or (N, C, D, H, W) with (N, D', H', W', 3)")
    mode, _, _ = _params(attrs)
    if mode == "cubic" and spatial == 3:
        raise op_error(op, "mode 'cubic' on a 3-D input; ONNX defines it for 2-D only")
    return [TensorSpec((x.shape[0], x.shape[1]) + tuple(grid.shape[1:-1]), x.dtype)]


def reflect(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """x folded into [low, high] by reflecting at the nearer border until it lies inside."""
    span = high - low
    if span <= 0:
        return np.full_like(x, low)
    below = low - x
    above = x - high
    turns_b = np.trunc(below / span)
    turns_a = np.trunc(above / span)
    rest_b = below - turns_b * span
    rest_a = above - turns_a * span
    from_below = np.where(turns_b % 2 == 0, low + rest_b, high - rest_b)
    from_above = np.where(turns_a % 2 == 0, high - rest_a, low + rest_a)
    return np.where(x < low, from_below, np.where(x > high, from_above, x))


def _cubic(t: np.ndarray) -> list[np.ndarray]:
    """Keys' weights of the taps at -1, 0, 1, 2 for a fraction t in [0, 1)."""
    a = CUBIC_ALPHA

    def near(d: np.ndarray) -> np.ndarray:
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: np.ndarray) -> np.ndarray:
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _taps(x: np.ndarray, extent: int, mode: str, padding: str, low: float, high: float
          ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per tap along one axis: (index into the axis, weight, inside) for every sample point."""
    if mode == "nearest":
        positions = [np.trunc(x)]  # x was rounded (half to even) before padding, as in ONNX
        weights = [np.ones_like(x)]
    else:
        base = np.floor(x)
        t = x - base
        if mode == "linear":
            positions, weights = [base, base + 1], [1 - t, t]
        else:
            positions, weights = [base - 1, base, base + 1, base + 2], _cubic(t)
    taps = []
    for pos, weight in zip(positions, weights):
        inside = (pos >= 0) & (pos < extent)
        if padding == "border":
            pos = np.clip(pos, 0, extent - 1)
            inside = np.ones_like(inside)
        elif padding == "reflection":
            pos = np.clip(np.trunc(reflect(pos, low, high)), 0, extent - 1)
            inside = np.ones_like(inside)
        taps.append((np.clip(pos, 0, extent - 1).astype(np.int64), weight, inside))
    return taps


def sample_points(x: np.ndarray, grid: np.ndarray, mode: str, padding: str,
                  align: bool) -> np.ndarray:
    """One batch item: x (C, *spatial), grid (*out, k) -> (C, *out) in float64."""
    spatial = x.shape[1:]
    points = grid.reshape(-1, len(spatial))[:, ::-1]  # the grid lists x (width) first
    taps_per_axis = []
    for axis, extent in enumerate(spatial):
        n = points[:, axis].astype(np.float64)
        pos = (n + 1) / 2 * (extent - 1) if align else ((n + 1) * extent - 1) / 2
        # NOTE: ONNX's reference rounds the denormalised position to the grid's dtype.
        pos = pos.astype(grid.dtype).astype(np.float64)
        low, high = (0.0, extent - 1.0) if align else (-0.5, extent - 0.5)
        if mode == "nearest":
            pos = np.rint(pos)
        outside = (pos < low) | (pos > high)
        if padding == "border":
            pos = np.where(outside, np.clip(pos, 0, extent - 1), pos)
        elif padding == "reflection":
            pos = np.where(outside, reflect(pos, low, high), pos)
        taps_per_axis.append(_taps(pos, extent, mode, padding, low, high))
    data = x.astype(np.float64)
    total = np.zeros((x.shape[0], points.shape[0]))
    for combo in itertools.product(*taps_per_axis):
        weight = np.ones(points.shape[0])
        inside = np.ones(points.shape[0], bool)
        for _, w, ok in combo:
            weight = weight * w
            inside &= ok
        values = data[(slice(None),) + tuple(index for index, _, _ in combo)]
        total += np.where(inside, weight, 0.0) * values
    return total.reshape((x.shape[0],) + grid.shape[:-1])


def _cpu_grid_sample(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                     outputs: Sequence[TensorSpec],
                     attrs: Mapping[str, Any]) -> Callable[..., None]:
    mode, padding, align = _params(attrs)

    def run(x: Any, grid: Any, out: Any) -> None:
        for n in range(x.shape[0]):
            out[n] = sample_points(x[n], grid[n], mode, padding, align)
    return run


define_op("grid_sample", _infer, 2, ("mode", "padding_mode", "align_corners"))
kernel("grid_sample", "cpu")(_cpu_grid_sample)
