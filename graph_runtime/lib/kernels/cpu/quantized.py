"""CPU kernels of the quantized ops without oneDNN: qconv2d, qdense and the integer ops as
exact float64 products plus float32 requantization, and qadd (the QDQ Add) as a table lookup.

The accumulators are exact: (x - x_zero) * w summed in float64, whose 53-bit mantissa holds
every u8/s8 product sum of up to 2^37 terms. The requantization is the op's definition
(lib/ops/quantized.py) in float32: float32(acc) * m + b, relu, rint (half to even), + y_zero,
saturate. qadd is DequantizeLinear, Add, Relu and QuantizeLinear as ONNX defines them, in
float32 and in that order (the unfused QDQ graph's values exactly), made once for all 65,536
pairs of byte values: a run is one table lookup per element.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...conv_params import ConvParams
from . import jit_setup
from .conv_choice import conv2d_cpu
from ..conv_epilogue import Epilogue
from .loops_jit import compiled
from ..threads import num_threads, parallel_items

QUANT_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}
ADD_SPLIT = 1 << 17  # elements per work item of qadd


def requantize(acc: np.ndarray, m: np.ndarray, b: np.ndarray, y_zero: int, relu: bool,
               out: np.ndarray) -> None:
    """out = saturate(rint(relu?(float32(acc) * m + b)) + y_zero), m and b per axis 1."""
    shape = (1, -1) + (1,) * (acc.ndim - 2)
    t = acc.astype(np.float32) * m.reshape(shape) + b.reshape(shape)
    if relu:
        np.maximum(t, np.float32(0), out=t)
    lo, hi = QUANT_RANGES[str(out.dtype)]
    np.copyto(out, np.clip(np.rint(t) + np.float32(y_zero), lo, hi), casting="unsafe")


def qconv2d_reference(p64: ConvParams, x_zero: int, y_zero: int,
                      relu: bool) -> Callable[..., None]:
    """run(x, w, m, b, out) with the accumulator from a float64 conv2d kernel (exact)."""
    conv = conv2d_cpu(p64, Epilogue((), (p64.n, p64.o, p64.oh, p64.ow)), "im2col")
    centered = np.empty((p64.n, p64.c, p64.h, p64.w), np.float64)
    acc = np.empty((p64.n, p64.o, p64.oh, p64.ow), np.float64)

    def run(x: Any, w: Any, m: Any, b: Any, out: Any) -> None:
        np.subtract(x, np.float64(x_zero), out=centered)
        conv(centered, w.astype(np.float64), acc)
        requantize(acc, m, b, y_zero, relu, out)
    return run


def conv2d_integer_reference(p64: ConvParams) -> Callable[..., None]:
    """run(x, x_zero, w, out): out (int32) = conv(x - x_zero, w), exact in float64."""
    conv = conv2d_cpu(p64, Epilogue((), (p64.n, p64.o, p64.oh, p64.ow)), "im2col")
    centered = np.empty((p64.n, p64.c, p64.h, p64.w), np.float64)
    acc = np.empty((p64.n, p64.o, p64.oh, p64.ow), np.float64)

    def run(x: Any, x_zero: Any, w: Any, out: Any) -> None:
        np.subtract(x, x_zero.reshape(()).astype(np.float64), out=centered)
        conv(centered, w.astype(np.float64), acc)
        np.copyto(out, np.rint(acc), casting="unsafe")
    return run


def dense_integer_reference() -> Callable[..., None]:
    """run(x, x_zero, w, out): out (int32) = (x - x_zero) @ w, exact in float64."""
    def run(x: Any, x_zero: Any, w: Any, out: Any) -> None:
        acc = (x.astype(np.float64) - x_zero.reshape(()).astype(np.float64)) @ w.astype(
            np.float64)
        np.copyto(out, acc, casting="unsafe")
    return run


def conv2d_integer_scaled_reference(p64: ConvParams) -> Callable[..., None]:
    """run(x, x_zero, w, x_scale, w_scale, bias, out): conv2d_integer's exact accumulator, then
    float32(acc) * float32(x_scale * w_scale[o]) + bias[o]."""
    integer = conv2d_integer_reference(p64)
    acc = np.empty((p64.n, p64.o, p64.oh, p64.ow), np.int32)

    def run(x: Any, x_zero: Any, w: Any, x_scale: Any, w_scale: Any, bias: Any,
            out: Any) -> None:
        integer(x, x_zero, w, acc)
        scale = (np.float32(x_scale) * w_scale.astype(np.float32)).reshape(1, -1, 1, 1)
        np.add(acc.astype(np.float32) * scale, bias.reshape(1, -1, 1, 1), out=out)
    return run


def dense_integer_scaled_reference() -> Callable[..., None]:
    """run(x, x_zero, w, x_scale, w_scale, bias, out): the exact accumulator, then the graph's
    float32 steps: float32(acc) * float32(x_scale * w_scale) + bias."""
    integer = dense_integer_reference()

    def run(x: Any, x_zero: Any, w: Any, x_scale: Any, w_scale: Any, bias: Any,
            out: Any) -> None:
        acc = np.empty(out.shape, np.int32)
        integer(x, x_zero, w, acc)
        scale = np.float32(x_scale) * w_scale.astype(np.float32)
        np.add(acc.astype(np.float32) * scale, bias, out=out)
    return run


def qdense_reference(x_zero: int, y_zero: int, relu: bool) -> Callable[..., None]:
    """run(x, w, m, b, out) on 2-D operands, the accumulator a float64 product (exact)."""
    def run(x: Any, w: Any, m: Any, b: Any, out: Any) -> None:
        acc = (x.astype(np.float64) - np.float64(x_zero)) @ w.astype(np.float64)
        requantize(acc, m, b, y_zero, relu, out)
    return run


def qadd_table(scales: tuple[float, float, float], zeros: tuple[int, int, int], relu: bool,
               a_dtype: str, b_dtype: str, out_dtype: str) -> np.ndarray:
    """Q(relu?(DQ(a) + DQ(b))) for every pair of byte values, indexed by a's byte * 256 + b's:
    ONNX's float32 steps once per pair, so a lookup is the same value as computing it."""
    a_s, b_s, y_s = (np.float32(v) for v in scales)
    a_z, b_z, y_z = (np.float32(z) for z in zeros)
    a = np.arange(256, dtype=np.uint8).view(a_dtype).astype(np.float32)
    b = np.arange(256, dtype=np.uint8).view(b_dtype).astype(np.float32)
    y = ((a - a_z) * a_s)[:, None] + ((b - b_z) * b_s)[None, :]
    if relu:
        y = np.maximum(y, np.float32(0))
    lo, hi = QUANT_RANGES[out_dtype]
    q = np.clip(np.rint(y / y_s) + y_z, lo, hi)
    return q.astype(out_dtype).reshape(-1)


def _lookup(a: Any, b: Any, table: Any, out: Any, start: int, stop: int) -> None:
    # NOTE: over slices: a non-negative index lets LLVM vectorize (dynamic_quantize.py)
    sa, sb, so = a[start:stop], b[start:stop], out[start:stop]
    for i in range(sa.shape[0]):
        so[i] = table[(np.int32(sa[i]) << 8) | np.int32(sb[i])]


def _lookup_rows(a: Any, b: Any, table: Any, out: Any, start: int, stop: int) -> None:
    """Rows start..stop of a (rows, len(b)) operand against b repeated along every row."""
    n = b.shape[0]
    for r in range(start, stop):
        row_a = a[r * n:(r + 1) * n]
        row_out = out[r * n:(r + 1) * n]
        for j in range(n):
            row_out[j] = table[(np.int32(row_a[j]) << 8) | np.int32(b[j])]


def _lookup_one(a: Any, row: Any, out: Any) -> None:
    """out = row[a]: the table's row for a one-value operand."""
    for i in range(a.shape[0]):
        out[i] = row[np.int32(a[i])]


_lookup_compiled = compiled(_lookup)
_lookup_rows_compiled = compiled(_lookup_rows)
_lookup_one_compiled = compiled(_lookup_one)


def lookup_kernel() -> Callable[..., None]:
    """run(x, table, out): out = table[x's byte] (qlookup), one compiled gather over flat
    memory where x and out are C-contiguous, NumPy's take otherwise."""
    jit_setup.start()
    last: list[Any] = [None, None, None]  # x, out, and their flat views (or None)

    def run(x: Any, table: Any, out: Any) -> None:
        if x is not last[0] or out is not last[1]:
            views = None
            if x.flags.c_contiguous and out.flags.c_contiguous:
                views = (x.reshape(-1).view(np.uint8), out.reshape(-1))
            last[:] = [x, out, views]
        if last[2] is None:
            np.take(table, x.view(np.uint8), out=out)
            return
        _lookup_one_compiled(last[2][0], table, last[2][1])
    return run


def _tail(small: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether an operand of shape `small` is shape's trailing dims (leading ones dropped)."""
    dims = list(small)
    while dims and dims[0] == 1:
        dims.pop(0)
    return tuple(dims) == tuple(shape[len(shape) - len(dims):]) if dims else True


def qadd_kernel(table: np.ndarray, a_shape: tuple[int, ...], b_shape: tuple[int, ...],
                out_shape: tuple[int, ...]) -> Callable[..., None]:
    """run(a, b, out): out = table[a, b] over the operands' bytes: one pass over flat memory
    when a, b and out share one shape and one layout, or when one operand is the other's
    trailing dims (a bias, a scalar); NumPy's broadcasting otherwise."""
    jit_setup.start()
    workers = max(1, num_threads())
    same = a_shape == b_shape == out_shape

    def broadcast(a: Any, b: Any, out: Any) -> None:
        index = (a.view(np.uint8).astype(np.int32) << 8) | b.view(np.uint8)
        np.take(table, index, out=out)

    if not same and a_shape == out_shape and _tail(b_shape, out_shape):
        return _rows_kernel(table, False, broadcast)
    if not same and b_shape == out_shape and _tail(a_shape, out_shape):
        swapped = table.reshape(256, 256).T.copy().reshape(-1)  # by b's byte * 256 + a's
        return _rows_kernel(swapped, True, broadcast)

    def flat(fa: Any, fb: Any, fo: Any) -> None:
        size = fo.shape[0]
        if size <= ADD_SPLIT or workers == 1:
            _lookup_compiled(fa, fb, table, fo, 0, size)
            return
        parts = -(-size // ADD_SPLIT)
        parallel_items(parts, workers, lambda worker, i: _lookup_compiled(
            fa, fb, table, fo, i * ADD_SPLIT, min(size, (i + 1) * ADD_SPLIT)))

    last: list[Any] = [None, None, None, None]  # a, b, out, and their flat views (or None)

    def run(a: Any, b: Any, out: Any) -> None:
        # NOTE: the pool hands the same arrays every run: their flat views are made once
        if a is not last[0] or b is not last[1] or out is not last[2]:
            views = None
            if same and a.strides == b.strides == out.strides:
                fa, fb, fo = _flat(a), _flat(b), _flat(out)
                if fa is not None and fb is not None and fo is not None:
                    views = (fa.view(np.uint8), fb.view(np.uint8), fo)
            last[:] = [a, b, out, views]
        if last[3] is None:
            broadcast(a, b, out)
            return
        flat(*last[3])
    return run


def _rows_kernel(table: np.ndarray, swap: bool,
                 broadcast: Callable[..., None]) -> Callable[..., None]:
    """run(a, b, out) where one operand (b, or a with swap) repeats along the other's rows."""
    last: list[Any] = [None, None, None, None]  # a, b, out, and the flat views made for them
    table2d = table.reshape(256, 256)

    def run(a: Any, b: Any, out: Any) -> None:
        # NOTE: the pool hands the same arrays every run; their flat views are made once (a
        # BERT-tiny bias add is ~10 us, half of it Python around the compiled loop)
        if a is not last[0] or b is not last[1] or out is not last[2]:
            whole, part = (b, a) if swap else (a, b)
            views = None
            if whole.flags.c_contiguous and part.flags.c_contiguous and out.flags.c_contiguous:
                fw, fp = whole.reshape(-1).view(np.uint8), part.reshape(-1).view(np.uint8)
                views = (fw, fp, table, out.reshape(-1), 0, fw.shape[0] // max(fp.shape[0], 1))
            last[:] = [a, b, out, views]
        views = last[3]
        if views is None:
            broadcast(a, b, out)
        elif views[1].shape[0] == 1:
            # one value (a scalar's add or multiply): that value's 256 entries, one gather
            row = np.ascontiguousarray(table2d[:, views[1][0]])
            _lookup_one_compiled(views[0], row, views[3])
        else:
            _lookup_rows_compiled(*views)
    return run


def _flat(array: Any) -> Any:
    """The 1-D view of an array's bytes in memory order (C or NHWC-strided), else None."""
    if array.flags.c_contiguous:
        return array.reshape(-1)
    if array.ndim == 4:
        n, c, h, w = array.shape
        nhwc = array.transpose(0, 2, 3, 1)
        if nhwc.flags.c_contiguous:
            return nhwc.reshape(-1)
    return None
