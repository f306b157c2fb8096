"""Convolution standard ops (conv2d, conv2d_transpose) in NCHW: im2col / col2im around a GEMM."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..module import TensorSpec
from ..opencl_gemm import GemmShape, make_gemm
from ..registry import define_op, kernel
from ._common import (FLOAT_DTYPES, ClKernel, array_module, attr_error, check_cl_dtypes,
                      check_dtype, check_num_inputs, check_rank, check_same_dtype, cl_header,
                      cl_load, cl_param, cl_pointer, cl_store, compute_type, host_kernel,
                      int_attr, int_tuple, op_error, size_of, str_attr)
from .linalg import check_out_dtype

CONV_ATTRS = ("strides", "padding", "dilation", "groups", "channels", "kernel_size",
              "data_layout", "kernel_layout", "out_layout", "out_dtype")


def padding_attr(op: str, attrs: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """Relay's padding: 1 value (all sides), 2 (top/bottom, left/right) or 4 (t, l, b, r)."""
    pad = int_tuple(op, attrs, "padding", None, (0, 0))
    if len(pad) == 1:
        pad = pad * 4
    elif len(pad) == 2:
        pad = (pad[0], pad[1], pad[0], pad[1])
    if len(pad) != 4 or min(pad) < 0:
        raise attr_error(op, "padding", list(pad), "1, 2 or 4 non-negative integers "
                                                   "(top, left, bottom, right)")
    return (pad[0], pad[1], pad[2], pad[3])


def positive_pair(op: str, attrs: Mapping[str, Any], name: str,
                  default: tuple[int, int]) -> tuple[int, int]:
    value = int_tuple(op, attrs, name, 2, default)
    if min(value) < 1:
        raise attr_error(op, name, list(value), "2 positive integers")
    return (value[0], value[1])


def check_layout(op: str, attrs: Mapping[str, Any], name: str, supported: str) -> None:
    """Only one layout per argument is implemented; say which."""
    value = str_attr(op, attrs, name, supported)
    if value not in (supported, ""):
        raise attr_error(op, name, value, f"{supported!r} (the only {name} supported)")


@dataclass(frozen=True)
class ConvParams:
    """Every size of one NCHW convolution (for transpose: data is the small side)."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    groups: int
    oh: int
    ow: int
    strides: tuple[int, int]
    pad: tuple[int, int, int, int]
    dilation: tuple[int, int]
    dtype: str

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def og(self) -> int:
        return self.o // self.groups


def _common_checks(op: str, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
                   kernel_layout: str) -> tuple[str, int, tuple, tuple, tuple]:
    check_num_inputs(op, inputs, 2)
    dtype = check_same_dtype(op, inputs)
    check_dtype(op, inputs[0], FLOAT_DTYPES)
    check_rank(op, inputs[0], (4,), "data")
    check_rank(op, inputs[1], (4,), "weight")
    check_layout(op, attrs, "data_layout", "NCHW")
    check_layout(op, attrs, "kernel_layout", kernel_layout)
    check_layout(op, attrs, "out_layout", "NCHW")
    check_out_dtype(op, attrs, dtype)
    groups = int_attr(op, attrs, "groups", 1)
    if groups < 1:
        raise attr_error(op, "groups", groups, "a positive integer")
    return (dtype, groups, positive_pair(op, attrs, "strides", (1, 1)), padding_attr(op, attrs),
            positive_pair(op, attrs, "dilation", (1, 1)))


def _check_optional(op: str, attrs: Mapping[str, Any], channels: int, kernel: tuple) -> None:
    want = int_attr(op, attrs, "channels", None)
    if want is not None and want != channels:
        raise attr_error(op, "channels", want, f"{channels} (the weight's output channels)")
    size = int_tuple(op, attrs, "kernel_size", 2, None)
    if size is not None and tuple(size) != tuple(kernel):
        raise attr_error(op, "kernel_size", list(size), f"{list(kernel)} (the weight's HW)")


def out_size(op: str, what: str, size: int, pad: int, k: int, stride: int, dilation: int,
             ceil: bool = False) -> int:
    """Sliding-window output length; LibraryError when the window does not fit."""
    span = dilation * (k - 1) + 1
    if size + pad < span:
        raise op_error(op, f"the {what} window ({k} taps, dilation {dilation}) spans {span} but "
                           f"the padded input has only {size + pad}")
    extra = stride - 1 if ceil else 0
    return (size + pad - span + extra) // stride + 1


def conv2d_params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> ConvParams:
    op = "conv2d"
    dtype, groups, strides, pad, dilation = _common_checks(op, inputs, attrs, "OIHW")
    n, c, h, w = inputs[0].shape
    o, cg, kh, kw = inputs[1].shape
    if c % groups:
        raise op_error(op, f"data has {c} channels, not divisible by groups {groups}")
    if cg != c // groups:
        raise op_error(op, f"weight has {cg} input channels per group but data has {c} "
                           f"channels / groups {groups} = {c // groups}")
    if o % groups:
        raise op_error(op, f"weight has {o} output channels, not divisible by groups {groups}")
    _check_optional(op, attrs, o, (kh, kw))
    oh = out_size(op, "height", h, pad[0] + pad[2], kh, strides[0], dilation[0])
    ow = out_size(op, "width", w, pad[1] + pad[3], kw, strides[1], dilation[1])
    return ConvParams(n, c, h, w, o, kh, kw, groups, oh, ow, strides, pad, dilation, dtype)


def conv2d_transpose_params(inputs: Sequence[TensorSpec],
                            attrs: Mapping[str, Any]) -> ConvParams:
    """Sizes with oh/ow the (large) output; weight is IOHW = (C, O / groups, KH, KW)."""
    op = "conv2d_transpose"
    dtype, groups, strides, pad, dilation = _common_checks(op, inputs, attrs, "IOHW")
    n, c, h, w = inputs[0].shape
    ci, og, kh, kw = inputs[1].shape
    if ci != c:
        raise op_error(op, f"weight (IOHW) has {ci} input channels but data has {c}")
    if c % groups:
        raise op_error(op, f"data has {c} channels, not divisible by groups {groups}")
    outpad = int_tuple(op, attrs, "output_padding", 2, (0, 0))
    for i, what in enumerate(("height", "width")):
        if not 0 <= outpad[i] < max(strides[i], dilation[i]):
            raise attr_error(op, "output_padding", list(outpad),
                             f"values in [0, max(stride, dilation)) = [0, "
                             f"{max(strides[i], dilation[i])}) for the {what}")
    _check_optional(op, attrs, og * groups, (kh, kw))
    size = []
    for i, (what, k, extent) in enumerate((("height", kh, h), ("width", kw, w))):
        length = ((extent - 1) * strides[i] - pad[i] - pad[i + 2] + dilation[i] * (k - 1) + 1
                  + outpad[i])
        if extent < 1 or length < 1:
            raise op_error(op, f"output {what} would be {length} (data {what} {extent}, "
                               f"stride {strides[i]}, padding {pad[i]}+{pad[i + 2]}, kernel {k}, "
                               f"dilation {dilation[i]}, output_padding {outpad[i]})")
        size.append(length)
    return ConvParams(n, c, h, w, og * groups, kh, kw, groups, size[0], size[1], strides, pad,
                      dilation, dtype)


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
    return "float32" if dtype == "float16" and backend.name == "cpu" else dtype


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

__all__ = ["ConvParams", "conv2d_params", "conv2d_transpose_params", "padding_attr",
           "positive_pair", "check_layout", "out_size"]
