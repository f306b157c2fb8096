"""Convolution standard ops (conv2d, conv2d_transpose) in NCHW: im2col / col2im around a GEMM."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..module import TensorSpec
from ..opencl_gemm import GemmShape, make_gemm
from ..registry import define_op, kernel
from ._conv_shapes import CONV_ATTRS, ConvParams, conv2d_params, conv2d_transpose_params
from ._gpu import (ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param, cl_pointer, cl_store,
                   compute_type)
from ._host import array_module, host_kernel, wide_dtype
from ._shapes import size_of


def _conv2d_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = conv2d_params(inputs, attrs)
    return [TensorSpec((p.n, p.o, p.oh, p.ow), p.dtype)]


def _conv2d_transpose_infer(inputs: Sequence[TensorSpec],
                            attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = conv2d_transpose_params(inputs, attrs)
    return [TensorSpec((p.n, p.o, p.oh, p.ow), p.dtype)]


# -- cpu / cuda ---------------------------------------------------------------------------------

def _work_dtype(backend: Any, dtype: str) -> str:
    """NumPy has no float16 BLAS: the CPU computes float16 convolutions in float32."""
    return wide_dtype(dtype) if backend.name == "cpu" else dtype


def _staged(xp: Any, arr: Any, buf: Any) -> Any:
    """arr itself, or arr copied into buf (a float32 stand-in for float16)."""
    if buf is None:
        return arr
    xp.copyto(buf, arr, casting="unsafe")
    return buf


def _conv2d_host(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = conv2d_params(inputs, attrs)
    xp = array_module(backend)
    work = _work_dtype(backend, p.dtype)
    staged = work != p.dtype
    pt, pl, pb, pr = p.pad
    sh, sw = p.strides
    dh, dw = p.dilation
    direct = p.kh == p.kw == 1 and p.strides == (1, 1) and not any(p.pad)
    # Workspace, allocated once: a zero-bordered copy of the data and the im2col matrix.
    padded = None
    if any(p.pad) or staged:
        padded = xp.zeros((p.n, p.c, p.h + pt + pb, p.w + pl + pr), work)
    col_shape = (p.n, p.groups, p.cg, p.kh, p.kw, p.oh, p.ow)
    col = xp.empty((0,) if direct else col_shape, work)
    w_buf = xp.empty(inputs[1].shape, work) if staged else None
    out_buf = xp.empty(outputs[0].shape, work) if staged else None
    kk = p.cg * p.kh * p.kw
    as_strided = xp.lib.stride_tricks.as_strided

    def run(data: Any, weight: Any, out: Any) -> None:
        if kk == 0:
            # NOTE: no input channels: an empty sum; cuBLAS is not asked to multiply with K = 0.
            out.fill(0)
            return
        src = data
        if padded is not None:
            padded[:, :, pt:pt + p.h, pl:pl + p.w] = data
            src = padded
        if direct:
            cols = src.reshape(p.n, p.groups, kk, p.oh * p.ow)
        else:
            s_n, s_c, s_h, s_w = src.strides
            windows = as_strided(src, shape=col_shape,
                                 strides=(s_n, p.cg * s_c, s_c, dh * s_h, dw * s_w, sh * s_h,
                                          sw * s_w))
            xp.copyto(col, windows)
            cols = col.reshape(p.n, p.groups, kk, p.oh * p.ow)
        w = _staged(xp, weight, w_buf).reshape(p.groups, p.og, kk)
        target = out if out_buf is None else out_buf
        xp.matmul(w, cols, out=target.reshape(p.n, p.groups, p.og, p.oh * p.ow))
        if out_buf is not None:
            xp.copyto(out, out_buf, casting="unsafe")
    return host_kernel(backend, device_id, run)


def _conv2d_transpose_host(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                           outputs: Sequence[TensorSpec],
                           attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = conv2d_transpose_params(inputs, attrs)
    xp = array_module(backend)
    work = _work_dtype(backend, p.dtype)
    staged = work != p.dtype
    pt, pl = p.pad[0], p.pad[1]
    sh, sw = p.strides
    dh, dw = p.dilation
    taps = p.og * p.kh * p.kw
    # The uncropped output every tap scatters into, big enough for the cropped window.
    full_h = max((p.h - 1) * sh + dh * (p.kh - 1) + 1, pt + p.oh)
    full_w = max((p.w - 1) * sw + dw * (p.kw - 1) + 1, pl + p.ow)
    full = xp.empty((p.n, p.o, full_h, full_w), work)
    cols = xp.empty((p.n, p.groups, taps, p.h * p.w), work)
    d_buf = xp.empty(inputs[0].shape, work) if staged else None
    w_buf = xp.empty(inputs[1].shape, work) if staged else None
    span_h = (p.h - 1) * sh + 1
    span_w = (p.w - 1) * sw + 1

    def run(data: Any, weight: Any, out: Any) -> None:
        if p.cg == 0:
            out.fill(0)
            return
        x = _staged(xp, data, d_buf).reshape(p.n, p.groups, p.cg, p.h * p.w)
        w = _staged(xp, weight, w_buf).reshape(p.groups, p.cg, taps).swapaxes(1, 2)
        xp.matmul(w, x, out=cols)
        taps6 = cols.reshape(p.n, p.o, p.kh, p.kw, p.h, p.w)
        full.fill(0)
        for i in range(p.kh):
            for j in range(p.kw):
                y0 = i * dh
                x0 = j * dw
                full[:, :, y0:y0 + span_h:sh, x0:x0 + span_w:sw] += taps6[:, :, i, j]
        xp.copyto(out, full[:, :, pt:pt + p.oh, pl:pl + p.ow], casting="unsafe")
    return host_kernel(backend, device_id, run)


# -- opencl -------------------------------------------------------------------------------------

def _cl_source(dtype: str) -> str:
    """im2col (conv2d) and col2im (conv2d_transpose) for one dtype; sizes are arguments."""
    acc = compute_type(dtype, "opencl")
    sizes = ("long total, int C, int H, int W, int KH, int KW, int OH, int OW, int SH, int SW, "
             "int PT, int PL, int DH, int DW")
    return cl_header([dtype]) + f"""
// numpy counterpart: col[n, c, kh, kw, oh, ow] = padded[n, c, oh*SH + kh*DH, ow*SW + kw*DW]
__kernel void gr_im2col({cl_param("col", dtype, const=False)}, {cl_param("data", dtype)},
                        {sizes}) {{
    long i = get_global_id(0);
    if (i >= total) return;
    {cl_pointer("col", dtype, const=False)}
    {cl_pointer("data", dtype)}
    long t = i;
    int ow = t % OW; t /= OW;
    int oh = t % OH; t /= OH;
    int kw = t % KW; t /= KW;
    int kh = t % KH; t /= KH;
    int y = oh * SH - PT + kh * DH;
    int x = ow * SW - PL + kw * DW;
    {acc} v = 0;
    if (y >= 0 && y < H && x >= 0 && x < W) v = {cl_load("data", dtype, "(t * H + y) * W + x")};
    {cl_store("col", dtype, "i", "v")}
}}

// numpy counterpart: the tap loop of _conv2d_transpose_host, gathered per output element;
// here H, W are the data's and OH, OW the output's sizes, cols is [N, O, KH, KW, H, W].
__kernel void gr_col2im({cl_param("out", dtype, const=False)}, {cl_param("cols", dtype)},
                        {sizes}) {{
    long i = get_global_id(0);
    if (i >= total) return;
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("cols", dtype)}
    long t = i;
    int x = t % OW; t /= OW;
    int y = t % OH; t /= OH;
    {acc} sum = 0;
    for (int kh = 0; kh < KH; ++kh) {{
        int yy = y + PT - kh * DH;
        if (yy < 0 || yy % SH) continue;
        int iy = yy / SH;
        if (iy >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {{
            int xx = x + PL - kw * DW;
            if (xx < 0 || xx % SW) continue;
            int ix = xx / SW;
            if (ix >= W) continue;
            sum += {cl_load("cols", dtype, "((t * KH + kh) * KW + kw) * H * W + iy * W + ix")};
        }}
    }}
    {cl_store("out", dtype, "i", "sum")}
}}
"""


def _cl_sizes(p: ConvParams, total: int) -> list[Any]:
    return [total, p.c, p.h, p.w, p.kh, p.kw, p.oh, p.ow, p.strides[0], p.strides[1], p.pad[0],
            p.pad[1], p.dilation[0], p.dilation[1]]


def _ints(values: Sequence[int]) -> list[Any]:
    return [np.int64(values[0])] + [np.int32(v) for v in values[1:]]


def _conv2d_cl(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
               outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = conv2d_params(inputs, attrs)
    check_cl_dtypes("conv2d", backend, device_id, [p.dtype])
    direct = p.kh == p.kw == 1 and p.strides == (1, 1) and not any(p.pad)
    kk = p.cg * p.kh * p.kw
    spatial = p.oh * p.ow
    gemm = make_gemm(backend, device_id, GemmShape(
        p.og, spatial, kk, p.dtype, batch=p.n * p.groups, a_batches=p.groups,
        b_batches=p.n * p.groups, a_stride=p.og * kk, b_stride=kk * spatial,
        c_stride=p.og * spatial))
    if direct:
        return lambda data, weight, out: gemm(weight, data, out)
    total = p.n * p.c * p.kh * p.kw * spatial
    im2col = ClKernel(backend, device_id, _cl_source(p.dtype), "gr_im2col", "conv2d")
    col = backend.empty(device_id, (total,), np.dtype(p.dtype))
    sizes = _ints(_cl_sizes(p, total))

    def run(data: Any, weight: Any, out: Any) -> None:
        im2col.launch(total, None, col, data, *sizes)
        gemm(weight, col, out)
    return run


def _conv2d_transpose_cl(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                         outputs: Sequence[TensorSpec],
                         attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = conv2d_transpose_params(inputs, attrs)
    check_cl_dtypes("conv2d_transpose", backend, device_id, [p.dtype])
    taps = p.og * p.kh * p.kw
    spatial = p.h * p.w
    # cols[n, g] = weight[g]^T @ data[n, g]: weight[g] is stored (cg, taps), hence trans_a.
    gemm = make_gemm(backend, device_id, GemmShape(
        taps, spatial, p.cg, p.dtype, trans_a=True, batch=p.n * p.groups, a_batches=p.groups,
        b_batches=p.n * p.groups, a_stride=p.cg * taps, b_stride=p.cg * spatial,
        c_stride=taps * spatial))
    cols = backend.empty(device_id, (max(p.n * p.groups * taps * spatial, 1),),
                         np.dtype(p.dtype))
    total = size_of((p.n, p.o, p.oh, p.ow))
    col2im = ClKernel(backend, device_id, _cl_source(p.dtype), "gr_col2im", "conv2d_transpose")
    sizes = _ints(_cl_sizes(p, total))

    def run(data: Any, weight: Any, out: Any) -> None:
        gemm(weight, data, cols)
        col2im.launch(total, None, out, cols, *sizes)
    return run


define_op("conv2d", _conv2d_infer, 2, CONV_ATTRS)
define_op("conv2d_transpose", _conv2d_transpose_infer, 2, CONV_ATTRS + ("output_padding",))
for _kind in ("cpu", "cuda"):
    kernel("conv2d", _kind)(_conv2d_host)
    kernel("conv2d_transpose", _kind)(_conv2d_transpose_host)
kernel("conv2d", "opencl")(_conv2d_cl)
kernel("conv2d_transpose", "opencl")(_conv2d_transpose_cl)

__all__ = ["ConvParams", "conv2d_params", "conv2d_transpose_params"]
