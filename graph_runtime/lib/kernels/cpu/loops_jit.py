"""Numba-compiled CPU loops for the memory-bound kernels NumPy cannot do in one pass.

A depthwise conv or a pool done with NumPy takes two passes over memory per window tap (a
strided multiply or max into a temporary, then a fold into the result); compiled, each output
row is made while it sits in L1, with the conv's bias, residual add and clamp applied before it
leaves. This is why numba is a base dependency: a depthwise conv and ResNet's max pool run
several times faster compiled than as im2col or NumPy (docs/measurements.md).

Each function computes one work item, an image and a range of its channels, and releases the
GIL (nogil), so that threads.py spreads items over its workers; numba's own parallel=True would
start a second thread pool competing with ours. fastmath stays off: results must match a
float64 reference as closely as NumPy's do, NaN included. cache=True keeps the machine code in
__pycache__ beside this file, or in numba's user cache directory where that is read-only; where
neither can be written the functions compile in every process instead.
"""
from __future__ import annotations

from typing import Any, Callable, Literal

import numba
import numpy as np

from .jit_cache import install

install()  # before any cache=True function here (jit_cache.py)


def compiled(fn: Callable[..., Any], inline: Literal["never", "always"] = "never") -> Any:
    try:
        return numba.njit(fn, cache=True, nogil=True, fastmath=False, boundscheck=False,
                          inline=inline)
    except RuntimeError:  # numba found no writable cache directory: compile in each process
        return numba.njit(fn, cache=False, nogil=True, fastmath=False, boundscheck=False,
                          inline=inline)


def reassociating(fn: Callable[..., Any]) -> Any:
    """compiled, LLVM free to reorder this function's float additions (fastmath's reassoc flag
    alone: NaN and inf keep their meaning), so that a sum loop vectorizes: for float64 sums
    whose order matters only to rounding. Called, not inlined: inlined code takes its caller's
    flags."""
    try:
        return numba.njit(fn, cache=True, nogil=True, fastmath={"reassoc"}, boundscheck=False)
    except RuntimeError:  # no writable cache directory, as in compiled()
        return numba.njit(fn, cache=False, nogil=True, fastmath={"reassoc"}, boundscheck=False)


@reassociating
def lane_dot(x: Any, w: Any, zero: Any) -> Any:
    """x . w summed from zero (x's type) in vector lanes, as OpenBLAS's and oneDNN's products
    sum: the dot products of the few-row kernels (team_gemv.py, attention.py's decode pass)."""
    total = zero
    for i in range(x.shape[0]):
        total += x[i] * w[i]
    return total


def inlined(fn: Callable[..., Any]) -> Any:
    """A helper numba copies into each caller: a call between compiled functions is not
    inlined by LLVM, and called helpers made the loops much slower (docs/measurements.md)."""
    return compiled(fn, "always")


@inlined
def _span(off: int, stride: int, size: int, out: int) -> tuple[int, int]:
    """The outputs o in [lo, hi) whose tap o * stride + off lands inside [0, size)."""
    lo = 0
    if off < 0:
        lo = min(out, (stride - 1 - off) // stride)
    hi = out
    last = size - 1 - off
    if last < 0:
        hi = 0
    elif last // stride + 1 < out:
        hi = last // stride + 1
    return lo, max(lo, hi)


# NOTE: numba checks every signed index for wraparound (a negative index counts from the end),
# and that branch, like slicing a row in the loop, kept LLVM from vectorizing these loops
# (docs/measurements.md). The inner loops index the rows themselves with unsigned ints, and take
# stride 1 and 2 as constants, so that loads are contiguous or evenly interleaved; other strides
# get the same loop with a variable stride, not vectorized.
u64 = numba.uint64


@inlined
def _add_tap(dst: Any, src: Any, wv: Any, first: int, stop: int, off: int, stride: int) -> None:
    """dst[o] += wv * src[o * stride + off] for o in [first, stop) (all inside src)."""
    if stride == 1:
        for o in range(first, stop):
            dst[u64(o)] += wv * src[u64(o + off)]
    elif stride == 2:
        for o in range(first, stop):
            dst[u64(o)] += wv * src[u64(2 * o + off)]
    else:
        for o in range(first, stop):
            dst[u64(o)] += wv * src[u64(o * stride + off)]


@inlined
def _max_tap(dst: Any, src: Any, first: int, stop: int, off: int, stride: int) -> None:
    """dst[o] = max(dst[o], src[o * stride + off]) for o in [first, stop); a NaN wins, as in
    np.maximum."""
    if stride == 1:
        for o in range(first, stop):
            v = src[u64(o + off)]
            if v > dst[u64(o)] or np.isnan(v):
                dst[u64(o)] = v
    elif stride == 2:
        for o in range(first, stop):
            v = src[u64(2 * o + off)]
            if v > dst[u64(o)] or np.isnan(v):
                dst[u64(o)] = v
    else:
        for o in range(first, stop):
            v = src[u64(o * stride + off)]
            if v > dst[u64(o)] or np.isnan(v):
                dst[u64(o)] = v


@inlined
def _row3x3(dst: Any, r0: Any, r1: Any, r2: Any, w: Any, b: Any, first: int, stop: int,
            pl: int, stride: int, dw: int) -> None:
    """dst[o] = b + the 9 taps of a 3x3 window on rows r0, r1, r2, for o in [first, stop) where
    all taps are inside the rows (w: the 3x3 weight, pl: the left padding, dw: the dilation)."""
    w00, w01, w02 = w[0, 0], w[0, 1], w[0, 2]
    w10, w11, w12 = w[1, 0], w[1, 1], w[1, 2]
    w20, w21, w22 = w[2, 0], w[2, 1], w[2, 2]
    e = u64(dw)
    f = u64(2 * dw)
    if stride == 1:
        for o in range(first, stop):
            j = u64(o - pl)
            dst[u64(o)] = b + (w00 * r0[j] + w01 * r0[j + e] + w02 * r0[j + f]
                               + w10 * r1[j] + w11 * r1[j + e] + w12 * r1[j + f]
                               + w20 * r2[j] + w21 * r2[j + e] + w22 * r2[j + f])
    elif stride == 2 and dw == 1:  # constant offsets: one interleaved load covers the taps
        for o in range(first, stop):
            j = u64(2 * o - pl)
            dst[u64(o)] = b + (w00 * r0[j] + w01 * r0[j + u64(1)] + w02 * r0[j + u64(2)]
                               + w10 * r1[j] + w11 * r1[j + u64(1)] + w12 * r1[j + u64(2)]
                               + w20 * r2[j] + w21 * r2[j + u64(1)] + w22 * r2[j + u64(2)])
    else:
        for o in range(first, stop):
            j = u64(o * stride - pl)
            dst[u64(o)] = b + (w00 * r0[j] + w01 * r0[j + e] + w02 * r0[j + f]
                               + w10 * r1[j] + w11 * r1[j + e] + w12 * r1[j + f]
                               + w20 * r2[j] + w21 * r2[j + e] + w22 * r2[j + f])


@inlined
def _edge3x3(dst: Any, r0: Any, r1: Any, r2: Any, w: Any, b: Any, o: int, cols: Any, pl: int,
             stride: int, dw: int) -> None:
    """dst[o] = b + the taps of a 3x3 window on rows r0, r1, r2 that lie inside them (cols: each
    column tap's outputs, _tap_spans): one column at a time, cheaper than _add_tap's loops for
    the column or two at each edge."""
    s = b
    for kx in range(3):
        if cols[kx, 0] <= o < cols[kx, 1]:
            ix = u64(o * stride - pl + kx * dw)
            s += w[0, kx] * r0[ix] + w[1, kx] * r1[ix] + w[2, kx] * r2[ix]
    dst[o] = s


@inlined
def _tap_spans(k: int, dilation: int, pad: int, stride: int, size: int, out: int) -> Any:
    """Per tap t of a window along one axis, the outputs [lo, hi) for which it is inside."""
    spans = np.empty((k, 2), np.int64)
    for t in range(k):
        spans[t, 0], spans[t, 1] = _span(t * dilation - pad, stride, size, out)
    return spans


@compiled
def depthwise_conv2d(x: Any, w: Any, bias: Any, res: Any, out: Any, n: int, c0: int, c1: int,
                     og: int, sh: int, sw: int, dh: int, dw: int, pt: int, pl: int, rn: int,
                     rc: int, ry: int, rx: int, has_res: bool, lo: Any, hi: Any) -> None:
    """out[n, c0:c1] = clamp(conv(x[n]) + bias + res, lo, hi) for groups == input channels.

    Output channel c reads input channel c // og with weight w[c, 0]; padding is the taps that
    fall outside x, skipped by each tap's valid output range. res is the residual operand in
    4-D with multipliers (rn, rc, ry, rx): 1 where it spans that axis, 0 where it broadcasts.
    A 3x3 kernel sums its 9 taps in one pass over the rows and columns its window never leaves
    the image from; elsewhere, and for other sizes, each tap adds to the row in its own pass.
    """
    height, width = x.shape[2], x.shape[3]
    kh, kw = w.shape[2], w.shape[3]
    oh, ow = out.shape[2], out.shape[3]
    cols = _tap_spans(kw, dw, pl, sw, width, ow)
    rows = _tap_spans(kh, dh, pt, sh, height, oh)
    # the outputs whose whole window is inside (first tap's start, last tap's end)
    inner_y0, inner_y1 = rows[0, 0], max(rows[0, 0], rows[kh - 1, 1])
    inner_x0, inner_x1 = cols[0, 0], max(cols[0, 0], cols[kw - 1, 1])
    fused = kh == 3 and kw == 3
    for c in range(c0, c1):
        ci = c // og
        wc = w[c, 0]
        b = bias[c]
        for oy in range(oh):
            row = out[n, c, oy]
            top = oy * sh - pt
            if fused and inner_y0 <= oy < inner_y1:
                r0, r1, r2 = x[n, ci, top], x[n, ci, top + dh], x[n, ci, top + 2 * dh]
                _row3x3(row, r0, r1, r2, wc, b, inner_x0, inner_x1, pl, sw, dw)
                for ox in range(inner_x0):
                    _edge3x3(row, r0, r1, r2, wc, b, ox, cols, pl, sw, dw)
                for ox in range(inner_x1, ow):
                    _edge3x3(row, r0, r1, r2, wc, b, ox, cols, pl, sw, dw)
            else:
                row[:] = b
                for ky in range(kh):
                    if not rows[ky, 0] <= oy < rows[ky, 1]:
                        continue
                    xrow = x[n, ci, top + ky * dh]
                    for kx in range(kw):
                        _add_tap(row, xrow, wc[ky, kx], cols[kx, 0], cols[kx, 1], kx * dw - pl,
                                 sw)
            if has_res:
                rrow = res[n * rn, c * rc, oy * ry]
                if rx:
                    for ox in range(ow):
                        row[ox] += rrow[ox]
                else:
                    r = rrow[0]
                    for ox in range(ow):
                        row[ox] += r
            # max then min, as np.clip; a NaN fails both tests and stays NaN, as in NumPy
            for ox in range(ow):
                v = row[ox]
                if v < lo:
                    v = lo
                if v > hi:
                    v = hi
                row[ox] = v


@inlined
def _fold_row(dst: Any, src: Any, first: bool, is_max: bool) -> None:
    """dst = src where first, else dst = max(dst, src) (NaN wins, as np.maximum) or dst + src."""
    if first:
        for i in range(dst.shape[0]):  # NOTE: dst[:] = src is slower here
            dst[u64(i)] = src[u64(i)]
    elif is_max:
        for i in range(dst.shape[0]):
            v = src[u64(i)]
            if v > dst[u64(i)] or np.isnan(v):
                dst[u64(i)] = v
    else:
        for i in range(dst.shape[0]):
            dst[u64(i)] += src[u64(i)]


@inlined
def _pool_row(x: Any, row: Any, folded: Any, rows: Any, cols: Any, n: int, c: int, oy: int,
              kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, pt: int, pl: int,
              is_max: bool, init: Any) -> None:
    """One output row of a pool, separably: the window's input rows folded into `folded`
    (whole rows, contiguous), then its columns into row; init where no tap is inside."""
    started = False
    for ky in range(kh):
        if not rows[ky, 0] <= oy < rows[ky, 1]:
            continue
        _fold_row(folded, x[n, c, oy * sh - pt + ky * dh], not started, is_max)
        started = True
    # NOTE: filling row before the row fold above made the whole loop markedly slower
    row[:] = init
    if not started:
        return
    for kx in range(kw):
        if is_max:
            _max_tap(row, folded, cols[kx, 0], cols[kx, 1], kx * dw - pl, sw)
        else:
            _add_tap(row, folded, x.dtype.type(1), cols[kx, 0], cols[kx, 1], kx * dw - pl, sw)


@compiled
def max_pool2d(x: Any, out: Any, n: int, c0: int, c1: int, kh: int, kw: int, sh: int, sw: int,
               dh: int, dw: int, pt: int, pl: int, lowest: Any) -> None:
    """out[n, c0:c1] = max over each window of x[n, c0:c1]; padding never wins, NaN does.

    Separable: per output row, the max over the window's input rows, then over its columns:
    kh + kw passes over a row instead of kh * kw strided ones, which is faster
    (docs/measurements.md). A window with no tap inside gives lowest.
    """
    height, width = x.shape[2], x.shape[3]
    oh, ow = out.shape[2], out.shape[3]
    cols = _tap_spans(kw, dw, pl, sw, width, ow)
    rows = _tap_spans(kh, dh, pt, sh, height, oh)
    folded = np.empty(width, x.dtype)
    for c in range(c0, c1):
        for oy in range(oh):
            _pool_row(x, out[n, c, oy], folded, rows, cols, n, c, oy, kh, kw, sh, sw, dh, dw, pt,
                      pl, True, lowest)


@compiled
def avg_pool2d(x: Any, out: Any, inv: Any, n: int, c0: int, c1: int, kh: int, kw: int, sh: int,
               sw: int, dh: int, dw: int, pt: int, pl: int) -> None:
    """out[n, c0:c1] = sum over each window of x[n, c0:c1] times inv, the (OH, OW) 1 / divisor;
    separable as max_pool2d."""
    height, width = x.shape[2], x.shape[3]
    oh, ow = out.shape[2], out.shape[3]
    cols = _tap_spans(kw, dw, pl, sw, width, ow)
    rows = _tap_spans(kh, dh, pt, sh, height, oh)
    folded = np.empty(width, x.dtype)
    zero = x.dtype.type(0)
    for c in range(c0, c1):
        for oy in range(oh):
            row = out[n, c, oy]
            _pool_row(x, row, folded, rows, cols, n, c, oy, kh, kw, sh, sw, dh, dw, pt, pl, False,
                      zero)
            irow = inv[oy]
            for ox in range(ow):
                row[ox] *= irow[ox]


def warm_depthwise(dtype: str) -> None:
    """Compile (or load from the cache) depthwise_conv2d for the array types its callers pass."""
    t = np.dtype(dtype).type
    x = np.zeros((1, 1, 1, 1), dtype)
    depthwise_conv2d(x, x, np.zeros(1, dtype), x, x, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0,
                     False, t(0), t(0))


def warm_pool(dtype: str, is_max: bool) -> None:
    """Compile (or load from the cache) max_pool2d or avg_pool2d for dtype's arrays."""
    x = np.zeros((1, 1, 1, 1), dtype)
    if is_max:
        max_pool2d(x, x, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, np.dtype(dtype).type(0))
    else:
        avg_pool2d(x, x, np.zeros((1, 1), dtype), 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0)


@compiled
def gather_axis(x: Any, idx: Any, out: Any, extent: int) -> int:
    """out[o, m, i] = x[o, idx[o, m, i], i] for x (O, extent, I) and idx, out (O, M, I), a
    negative index counting from the end (ONNX GatherElements on its axis as the middle one):
    one pass where NumPy's take_along_axis builds index grids first. Returns -1, or the flat
    position in idx of the first index out of [-extent, extent) (nothing past it written)."""
    outer, rows, inner = idx.shape
    for o in range(outer):
        for m in range(rows):
            for i in range(inner):
                j = idx[o, m, i]
                if j < 0:
                    j += extent
                if j < 0 or j >= extent:
                    return (o * rows + m) * inner + i
                out[o, m, i] = x[o, j, i]
    return -1
