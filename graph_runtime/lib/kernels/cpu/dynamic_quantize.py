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

from .loops_jit import compiled
from .threads import num_threads, parallel_items

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


_quantize_compiled = compiled(_quantize)


def dynamic_quantize_kernel(size: int) -> Callable[..., None]:
    """run(x, y, scale, zero_point) for a float32 x of `size` elements."""
    parts = max(1, -(-size // CHUNK))
    workers = max(1, num_threads()) if parts > 1 else 1

    def run(x: Any, y: Any, scale: Any, zero_point: Any) -> None:
        flat_x = x.reshape(-1)
        flat_y = y.reshape(-1)
        f = np.float32
        # NumPy's min and max: vectorized, and NaN-propagating as ONNX's reductions are
        low, high = min(f(flat_x.min()), f(0)), max(f(flat_x.max()), f(0))
        if np.isnan(low) or np.isnan(high):
            scale[...] = f(np.nan)
            zero_point[...] = 0
            flat_y[...] = 0
            return
        span = f(high - low)
        s = f(f(1) if span == 0 else span) / f(255)
        z = f(np.rint(np.clip(f(f(0) - f(low / s)), f(0), f(255))))
        scale[...] = s
        zero_point[...] = np.uint8(z)
        parallel_items(parts, workers, lambda worker, i: _quantize_compiled(
            flat_x, s, z, flat_y, i * CHUNK, min(size, (i + 1) * CHUNK)))
    return run
