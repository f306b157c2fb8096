"""CPU resize of an image's rows and columns in one compiled pass per plane.

The NumPy path resizes one axis at a time, each tap a gather, a multiply and an add over the
whole tensor in float64, so a bilinear upsample of SegFormer's decoder maps (256 x 64 x 64 to
128 x 128) made about a dozen passes over 32 MB and took 8 ms. Here each output row is summed
from its input rows into a float64 row buffer while they sit in cache, then its columns from
that buffer: the same tables (resize.axis_table: every mode and coordinate rule) and order of
sums as the NumPy path, in float64 (the NumPy path sums float32 data in float32), rounded once;
planes split over the workers.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .loops_jit import compiled
from .pool_jit import SERIAL_OUTPUTS  # a memory-bound loop per plane, as the pools'
from .threads import channel_split, chunk_bounds, parallel_items


@compiled
def resize_planes(x: Any, out: Any, rows: Any, row_w: Any, cols: Any, col_w: Any, p0: int,
                  p1: int, buf: Any) -> None:
    """Planes p0..p1 of x (P, H, W) into out (P, OH, OW): output row i is the sum over its
    taps of row_w[i, a] * x[rows[i, a]], then output column j the sum of col_w[j, b] *
    buf[cols[j, b]], both in float64 from 0."""
    width = x.shape[2]
    out_h, taps_h = rows.shape
    out_w, taps_w = cols.shape
    for p in range(p0, p1):
        for i in range(out_h):
            for w in range(width):
                buf[w] = 0.0
            for a in range(taps_h):
                r = rows[i, a]
                weight = row_w[i, a]
                for w in range(width):
                    buf[w] += weight * x[p, r, w]
            for j in range(out_w):
                acc = 0.0
                for b in range(taps_w):
                    acc += col_w[j, b] * buf[cols[j, b]]
                out[p, i, j] = acc


def _identity(length: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(length, dtype=np.int64)[:, None], np.ones((length, 1))


def resize_jit(shape: tuple[int, ...], out_shape: tuple[int, ...], passes: Any
               ) -> Callable[[Any, Any], None] | None:
    """run(x, out) for a float32/float64 (N, C, H, W) resize whose weighted passes
    (resize.AxisPass) are on H and W only, else None."""
    if len(shape) != 4 or any(step.axis < 2 or step.weight is None for step in passes):
        return None
    n, c, h, w = shape
    tables = {step.axis: (step.index, step.weight) for step in passes}
    rows, row_w = tables.get(2, _identity(h))
    cols, col_w = tables.get(3, _identity(w))
    rows, cols = np.ascontiguousarray(rows), np.ascontiguousarray(cols)
    row_w, col_w = np.ascontiguousarray(row_w), np.ascontiguousarray(col_w)
    planes = n * c
    outputs = planes * out_shape[2] * out_shape[3]
    chunks, workers = channel_split(1, planes, outputs, SERIAL_OUTPUTS)  # planes as channels
    buffers = np.empty((workers, w))

    def run(x: Any, out: Any) -> None:
        src = np.reshape(x, (planes, h, w))  # a copy only if x is not contiguous
        target = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        dst = target.reshape(planes, out_shape[2], out_shape[3])

        def item(worker: int, i: int) -> None:
            p0, p1 = chunk_bounds(planes, chunks, i)
            resize_planes(src, dst, rows, row_w, cols, col_w, p0, p1, buffers[worker])
        parallel_items(chunks, workers, item)
        if target is not out:
            np.copyto(out, target)
    return run
