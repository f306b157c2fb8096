"""DynamicQuantizeLinear as one CPU kernel: NumPy's min and max, then one compiled pass.

The importer's lowering of the op took five graph nodes (min, max, the scale, the zero point,
the quantize chain); as one kernel it is two passes over memory and one call. Every value is
ONNX's definition in float32, step by step as convert_qlinear.dynamic_quantize writes it: range
[min(x, 0), max(x, 0)], scale = range / 255 (1 / 255 for an all-zero x), zero point =
rint(clip(-min / scale, 0, 255)), y = clip(rint(x / scale) + zero point, 0, 255). A NaN in x
makes the scale NaN and every y and the zero point 0, as that lowering gives on x86.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import jit_setup
from .loops_jit import compiled, inlined
from ..threads import num_threads, parallel_items

CHUNK = 1 << 18  # elements per work item


def _quantize(x: Any, scale: Any, zero: Any, y: Any, start: int, stop: int) -> None:
    # NOTE: over slices, so that the index is known non-negative: with x[i] for i from
    # range(start, stop) numba's negative-index wraparound kept LLVM from vectorizing (10x).
    xs = x[start:stop]
    ys = y[start:stop]
    for i in range(xs.shape[0]):
        q = np.rint(xs[i] / scale) + zero
        q = min(max(q, np.float32(0)), np.float32(255))
        ys[i] = np.uint8(np.int32(q))


def _scale_zero(low: Any, high: Any, scale: Any, zero: Any) -> None:
    """scale[0], zero[0] from the range [low, high] (both hold 0), in float32 steps."""
    span = high - low
    if span == 0:
        span = np.float32(1)
    s = span / np.float32(255)
    z = np.float32(0) - low / s
    z = min(max(z, np.float32(0)), np.float32(255))
    scale[0] = s
    zero[0] = np.uint8(np.rint(z))


_scale_zero_inlined = inlined(_scale_zero)
_quantize_inlined = inlined(_quantize)


def _whole(x: Any, low: Any, high: Any, y: Any, scale: Any, zero: Any) -> None:
    """The parameters and the quantize pass in one call (a tensor of one work item)."""
    _scale_zero_inlined(low, high, scale, zero)
    _quantize_inlined(x, scale[0], np.float32(zero[0]), y, 0, x.shape[0])


_quantize_compiled = compiled(_quantize)
_scale_zero_compiled = compiled(_scale_zero)
_whole_compiled = compiled(_whole)


def dynamic_quantize_kernel(size: int) -> Callable[..., None]:
    """run(x, y, scale, zero_point) for a float32 x of `size` elements."""
    jit_setup.start()
    parts = max(1, -(-size // CHUNK))
    workers = max(1, num_threads()) if parts > 1 else 1
    last: list[Any] = [None, None]  # the arguments, and their flat views

    def run(x: Any, y: Any, scale: Any, zero_point: Any) -> None:
        arrays = (x, y, scale, zero_point)
        if last[0] is None or any(a is not b for a, b in zip(arrays, last[0])):
            last[:] = [arrays, (x.reshape(-1), y.reshape(-1), scale.reshape(1),
                                zero_point.reshape(1))]
        flat_x, flat_y, scale1, zero1 = last[1]
        # NumPy's min and max: vectorized, and NaN-propagating as ONNX's reductions are
        low, high = flat_x.min(), flat_x.max()
        if np.isnan(low) or np.isnan(high):
            scale1[0] = np.float32(np.nan)
            zero1[0] = 0
            flat_y[...] = 0
            return
        low, high = min(low, np.float32(0)), max(high, np.float32(0))
        if parts == 1:
            _whole_compiled(flat_x, low, high, flat_y, scale1, zero1)
            return
        _scale_zero_compiled(low, high, scale1, zero1)
        s, z = scale1[0], np.float32(zero1[0])
        parallel_items(parts, workers, lambda worker, i: _quantize_compiled(
            flat_x, s, z, flat_y, i * CHUNK, min(size, (i + 1) * CHUNK)))
    return run
