"""CPU resize of an image's rows and columns in one compiled pass, NCHW or channels-last.

The NumPy path resizes one axis at a time, each tap a gather, a multiply and an add over the
whole tensor in float64, so a bilinear upsample of SegFormer's decoder maps (256 x 64 x 64 to
128 x 128) made about a dozen passes over 32 MB and took 8 ms. Here each output row is summed
from its input rows into a float64 row buffer while they sit in cache, then its columns from
that buffer: the same tables (resize.axis_table: every mode and coordinate rule) and order of
sums as the NumPy path, in float64 (the NumPy path sums float32 data in float32), rounded once.

On NCHW data a plane is the unit (planes split over the workers). SegFormer's decoder maps
are tokens, the NHWC bytes of an image, and its resized maps feed a concat and a oneDNN 1x1
conv that read NHWC too: there the unit is an output row of pixels, each tap a contiguous
vector of channels (output rows split over the workers), and the tokens -> NCHW transpose
before the resize becomes a plain copy (runtime/layouts.py keeps such entries NHWC).
"""
from __future__ import annotations

from typing import Any, Collection

import numpy as np

from ...prepared import PreparedKernel
from . import jit_setup
from .loops_jit import compiled
from .pool_jit import SERIAL_OUTPUTS  # a memory-bound loop per plane, as the pools'
from ..threads import channel_split, chunk_bounds, parallel_items


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


@compiled
def resize_pixel_rows(x: Any, out: Any, rows: Any, row_w: Any, cols: Any, col_w: Any, t0: int,
                      t1: int, buf: Any, acc: Any) -> None:
    """Output rows t0..t1 (image-major: t = n * OH + i) of x (N, H, W, C) into out (N, OH, OW,
    C), any strides: the sums of resize_planes in the same order, each over a channel vector."""
    width, channels = x.shape[2], x.shape[3]
    out_h, taps_h = rows.shape
    out_w, taps_w = cols.shape
    for t in range(t0, t1):
        n, i = t // out_h, t % out_h
        buf[:, :] = 0.0
        for a in range(taps_h):
            r = rows[i, a]
            weight = row_w[i, a]
            for w in range(width):
                for c in range(channels):
                    buf[w, c] += weight * x[n, r, w, c]
        for j in range(out_w):
            acc[:] = 0.0
            for b in range(taps_w):
                weight = col_w[j, b]
                src = cols[j, b]
                for c in range(channels):
                    acc[c] += weight * buf[src, c]
            for c in range(channels):
                out[n, i, j, c] = acc[c]


def _identity(length: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(length, dtype=np.int64)[:, None], np.ones((length, 1))


class ResizeCopy(PreparedKernel):
    """run(x, out) for a resize that changes no axis: a copy, in whichever layouts."""

    def __call__(self, x: Any, out: Any) -> None:
        np.copyto(out, x)

    def channels_last_positions(self) -> tuple[int, ...]:
        return (0, 1)

    def use_channels_last(self, positions: Collection[int]) -> None:
        """Nothing to change: copyto reads and writes any strides."""


class ResizeJit(PreparedKernel):
    """run(x, out) for a float (N, C, H, W) resize weighted on H and W; x and out may each be
    the NCHW view of NHWC bytes (use_channels_last)."""

    def __init__(self, shape: tuple[int, ...], out_shape: tuple[int, ...], passes: Any) -> None:
        jit_setup.start()
        n, c, h, w = shape
        self.shape, self.out_shape = shape, out_shape
        tables = {step.axis: (step.index, step.weight) for step in passes}
        rows, row_w = tables.get(2, _identity(h))
        cols, col_w = tables.get(3, _identity(w))
        self.rows, self.cols = np.ascontiguousarray(rows), np.ascontiguousarray(cols)
        self.row_w, self.col_w = np.ascontiguousarray(row_w), np.ascontiguousarray(col_w)
        self.planes = n * c
        outputs = self.planes * out_shape[2] * out_shape[3]
        self.chunks, self.workers = channel_split(1, self.planes, outputs, SERIAL_OUTPUTS)
        self.buffers: Any = np.empty((self.workers, w))
        self.pixels = False

    def channels_last_positions(self) -> tuple[int, ...]:
        return (0, 1)

    def use_channels_last(self, positions: Collection[int]) -> None:
        """Any NHWC side: run by pixel rows (a mixed pair reads or writes strided)."""
        if not positions:
            return
        n, c, h, w = self.shape
        out_rows = n * self.out_shape[2]
        outputs = self.planes * self.out_shape[2] * self.out_shape[3]
        self.chunks, self.workers = channel_split(1, out_rows, outputs, SERIAL_OUTPUTS)
        self.buffers = (np.empty((self.workers, w, c)), np.empty((self.workers, c)))
        self.pixels = True

    def workspace_bytes(self) -> int:
        bufs = self.buffers if isinstance(self.buffers, tuple) else (self.buffers,)
        return sum(int(b.nbytes) for b in bufs)

    def __call__(self, x: Any, out: Any) -> None:
        if self.pixels:
            self._by_pixel_rows(x, out)
            return
        planes, (_, _, h, w), (_, _, oh, ow) = self.planes, self.shape, self.out_shape
        src = np.reshape(x, (planes, h, w))  # a copy only if x is not contiguous
        target = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        dst = target.reshape(planes, oh, ow)

        def item(worker: int, i: int) -> None:
            p0, p1 = chunk_bounds(planes, self.chunks, i)
            resize_planes(src, dst, self.rows, self.row_w, self.cols, self.col_w, p0, p1,
                          self.buffers[worker])
        parallel_items(self.chunks, self.workers, item)
        if target is not out:
            np.copyto(out, target)

    def _by_pixel_rows(self, x: Any, out: Any) -> None:
        src, dst = x.transpose(0, 2, 3, 1), out.transpose(0, 2, 3, 1)
        total = self.shape[0] * self.out_shape[2]
        rows_buf, acc_buf = self.buffers

        def item(worker: int, i: int) -> None:
            t0, t1 = chunk_bounds(total, self.chunks, i)
            resize_pixel_rows(src, dst, self.rows, self.row_w, self.cols, self.col_w, t0, t1,
                              rows_buf[worker], acc_buf[worker])
        parallel_items(self.chunks, self.workers, item)

    def __repr__(self) -> str:
        unit = "pixel rows" if self.pixels else "planes"
        return f"ResizeJit({self.shape} -> {self.out_shape}, by {unit})"


def resize_jit(shape: tuple[int, ...], out_shape: tuple[int, ...], passes: Any
               ) -> PreparedKernel | None:
    """run(x, out) for an (N, C, H, W) resize: a copy when no axis changes, else for float32/
    float64 data whose weighted passes (resize.AxisPass) are on H and W only; else None."""
    if len(shape) != 4:
        return None
    if not passes:
        return ResizeCopy()
    if any(step.axis < 2 or step.weight is None for step in passes):
        return None
    return ResizeJit(shape, out_shape, passes)
