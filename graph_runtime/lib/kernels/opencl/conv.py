"""OpenCL conv kernels: direct, im2col into GEMM panels, Winograd, and col2im for the transpose."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ...attrs import op_error
from ...conv_params import ConvParams
from ...shapes import size_of
from ..gpu_common import CL_TYPES, compute_type
from ..winograd_math import winograd_applies
from .args import ARRAY, BUFFER, buf, typed_kernel
from .conv_choice import CHOICE, WINOGRAD, pick_method
from .gemm import GemmShape, make_gemm
from .gemm_cpu import blocking, blocks, packed_gemm
from .source import cl_header, cl_load, cl_param, cl_pointer, cl_store
from .winograd import WinogradCl

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend

# conv2d_cl's methods: "direct" (one output per work-item), "panel" (im2col writes the packed
# GEMM's B panel; CPU devices), "im2col" (im2col, then make_gemm's GEMM), "winograd" and
# "winograd4" (F(2x2,3x3) and F(4x4,3x3), winograd.py; 3x3 stride-1 convs only).
METHODS = CHOICE.setting.choices  # settings.OPENCL_CONV lists them
# Outputs along a row per work-item of the direct kernel.
STRIP = 16

# The sizes every kernel here takes after its arrays.
SIZES = ("long total, int C, int H, int W, int KH, int KW, int OH, int OW, int SH, int SW, "
         "int PT, int PL, int DH, int DW")
SIZE_TYPES = [np.int64] + [np.int32] * 13


def _source(dtype: str, panel: int) -> str:
    """Kernels for one dtype; panel is the packed GEMM's panel width NB."""
    acc = compute_type(dtype, "opencl")
    ctype = CL_TYPES[dtype]
    return cl_header([dtype]) + f"""
// numpy counterpart: col[n, c, kh, kw, oh, ow] = padded[n, c, oh*SH + kh*DH, ow*SW + kw*DW]
__kernel void gr_im2col({cl_param("col", dtype, const=False)}, {cl_param("data", dtype)},
                        {SIZES}) {{
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

// The same columns written as the packed GEMM's B panel: panel[b][j][k][s] = col[b](k, j*NB + s)
// with b = n * groups + g, k = (c, kh, kw) within the group, zeros past OH * OW. A work-item
// fills one k row of one b (its (j, s) run is the output image in order; NB is a power of 2).
__kernel void gr_im2col_panel(__global {acc}* panel, {cl_param("data", dtype)}, {SIZES}) {{
    const int k = get_global_id(0);
    const long b = get_global_id(1);
    {cl_pointer("data", dtype)}
    const int K = get_global_size(0);
    const int kw = k % KW;
    const int kh = k / KW % KH;
    const int c = k / (KW * KH);
    const int blocks = (OH * OW + {panel} - 1) / {panel};
    // C is the channels per group here, so channel c of batch b starts at (b * C + c) * H * W.
    __global const {ctype}* src = data + (b * C + c) * H * W;
    __global {acc}* dst = panel + (b * blocks * K + k) * {panel};
    // The valid ox run [lo, hi): x = ox * SW - PL + kw * DW within [0, W).
    const int x0 = kw * DW - PL;
    const int lo = clamp((-x0 + SW - 1) / SW, 0, OW);
    const int hi = clamp((W - x0 + SW - 1) / SW, lo, OW);
    int e = 0;
    for (int oy = 0; oy < OH; ++oy) {{
        const int y = oy * SH - PT + kh * DH;
        const bool row_in = y >= 0 && y < H;
        __global const {ctype}* row = src + (long)y * W + x0;
        for (int ox = 0; ox < OW; ++ox) {{
            {acc} v = 0;
            if (row_in && ox >= lo && ox < hi)
                v = {cl_load("row", dtype, "ox * SW")};
            dst[e] = v;
            if (++e == {panel}) {{
                e = 0;
                dst += K * {panel};
            }}
        }}
    }}
    if (e > 0)
        for (; e < {panel}; ++e)
            dst[e] = 0;
}}

// numpy counterpart: ref_conv2d's definition; each work-item sums a strip of STRIP outputs
// out[n, o, y, xs:xs + STRIP] (a work-item per output costs PoCL more than a short window).
// C is the channels per group, total the output channels O.
__kernel void gr_conv_direct({cl_param("out", dtype, const=False)}, {cl_param("data", dtype)},
                             {cl_param("weight", dtype)}, {SIZES}, int OG) {{
    const int xs = get_global_id(0) * {STRIP};
    const int y = get_global_id(1);
    const int no = get_global_id(2);
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("data", dtype)}
    {cl_pointer("weight", dtype)}
    const int o = no % (int)total;
    const int n = no / (int)total;
    const int groups = (int)total / OG;
    __global const {ctype}* src = data + (long)(n * groups + o / OG) * C * H * W;
    __global const {ctype}* w = weight + (long)o * C * KH * KW;
    {acc} sum[{STRIP}];
    for (int e = 0; e < {STRIP}; ++e)
        sum[e] = 0;
    for (int c = 0; c < C; ++c) {{
        for (int i = 0; i < KH; ++i) {{
            const int yy = y * SH - PT + i * DH;
            if (yy < 0 || yy >= H) continue;
            __global const {ctype}* row = src + ((long)c * H + yy) * W;
            for (int j = 0; j < KW; ++j) {{
                const {acc} wv = {cl_load("w", dtype, "(c * KH + i) * KW + j")};
                const int x0 = xs * SW - PL + j * DW;
                for (int e = 0; e < {STRIP}; ++e) {{
                    const int x = x0 + e * SW;
                    sum[e] += (x >= 0 && x < W ? ({acc}){cl_load("row", dtype, "x")} : 0) * wv;
                }}
            }}
        }}
    }}
    __global {ctype}* dst = out + ((long)no * OH + y) * OW;
    for (int e = 0; e < {STRIP} && xs + e < OW; ++e) {{
        {cl_store("dst", dtype, "xs + e", "sum[e]")}
    }}
}}

// numpy counterpart: the tap loop of _conv2d_transpose_host, gathered per output element;
// here H, W are the data's and OH, OW the output's sizes, cols is [N, O, KH, KW, H, W].
__kernel void gr_col2im({cl_param("out", dtype, const=False)}, {cl_param("cols", dtype)},
                        {SIZES}) {{
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


class _Kernels:
    """The kernels of _source for one dtype on one device, with their argument types."""

    def __init__(self, backend: OpenCLBackend, device_id: int, dtype: str, name: str) -> None:
        self.queue = backend.queue(device_id)
        panel = blocking(backend, device_id, dtype).nb
        program = backend.program(device_id, _source(dtype, panel), name=name)
        self.program = program
        # NOTE: a zero-size array may have no buffer; OpenCL still wants one in every slot.
        self.dummy = backend.alloc(device_id, 1)

    def get(self, entry: str, arrays: int, extra: Sequence[Any] = (), buffers: int = 0) -> Any:
        """Kernel entry taking `buffers` plain buffers, `arrays` arrays, the sizes, then extra."""
        types = [BUFFER] * buffers + [*ARRAY] * arrays + SIZE_TYPES + list(extra)
        return typed_kernel(self.program, entry, types)

    def array(self, arr: Any) -> list[Any]:
        return [buf(arr, self.dummy), arr.offset]


def _sizes(p: ConvParams, total: int, channels: int) -> list[int]:
    return [total, channels, p.h, p.w, p.kh, p.kw, p.oh, p.ow, p.strides[0], p.strides[1],
            p.pad[0], p.pad[1], p.dilation[0], p.dilation[1]]


def conv2d_cl(backend: OpenCLBackend, device_id: int, p: ConvParams,
              method: str | None = None) -> Callable[[Any, Any, Any], None]:
    """run(data, weight, out) for conv2d on OpenCL; method (METHODS) None takes the one
    GRAPH_RUNTIME_OPENCL_CONV forces where it applies, else pick_method's.

    A 1x1 unit-stride convolution is a GEMM on the data itself under "panel" and "im2col".
    """
    kk = p.cg * p.kh * p.kw
    spatial = p.oh * p.ow
    shape = GemmShape(p.og, spatial, kk, p.dtype, batch=p.n * p.groups, a_batches=p.groups,
                      b_batches=p.n * p.groups, a_stride=p.og * kk, b_stride=kk * spatial,
                      c_stride=p.og * spatial)
    if method is None:
        method = CHOICE.forced()
        if method in WINOGRAD and not winograd_applies(p):
            method = None
        if method is None:
            method = pick_method(backend, device_id, p, shape,
                                 lambda name: conv2d_cl(backend, device_id, p, name))
    if method not in METHODS:
        raise op_error("conv2d", f"method {method!r}: expected one of {', '.join(METHODS)}")
    if method in WINOGRAD and not winograd_applies(p):
        raise op_error("conv2d", f"method {method!r} takes a 3x3 kernel with stride 1, dilation "
                                 f"1, groups 1 and float32 or float64; got {p.kh}x{p.kw}, "
                                 f"strides {p.strides}, dilation {p.dilation}, groups "
                                 f"{p.groups}, {p.dtype}")
    if p.n * p.o * spatial == 0:
        return lambda data, weight, out: None
    if method in WINOGRAD:
        return WinogradCl(backend, device_id, p, WINOGRAD[method])
    kernels = _Kernels(backend, device_id, p.dtype, "conv2d")
    if method == "direct":
        return _direct(kernels, p)
    one_by_one = p.kh == p.kw == 1 and p.strides == (1, 1) and not any(p.pad)
    if method == "panel":
        pack_b = None if one_by_one else _im2col_panel(kernels, p)
        gemm = packed_gemm(backend, device_id, shape.with_defaults(), pack_b)
        return lambda data, weight, out: gemm(weight, data, out)
    gemm = make_gemm(backend, device_id, shape)
    if one_by_one:
        return lambda data, weight, out: gemm(weight, data, out)
    total = p.n * p.c * p.kh * p.kw * spatial
    im2col = kernels.get("gr_im2col", 2)
    col = backend.empty(device_id, (total,), np.dtype(p.dtype))
    sizes = _sizes(p, total, p.c)
    padded = (blocks(total, 64) * 64,)

    def run(data: Any, weight: Any, out: Any) -> None:
        im2col(kernels.queue, padded, None, *kernels.array(col), *kernels.array(data), *sizes)
        gemm(weight, col, out)
    return run


def _direct(kernels: _Kernels, p: ConvParams) -> Callable[[Any, Any, Any], None]:
    direct = kernels.get("gr_conv_direct", 3, [np.int32])
    grid = (blocks(p.ow, STRIP), p.oh, p.n * p.o)
    sizes = _sizes(p, p.o, p.cg)

    def run(data: Any, weight: Any, out: Any) -> None:
        direct(kernels.queue, grid, (1, 1, 1), *kernels.array(out), *kernels.array(data),
               *kernels.array(weight), *sizes, p.og)
    return run


def _im2col_panel(kernels: _Kernels, p: ConvParams) -> Callable[[Any, Any], None]:
    """pack_b(data, panel) for packed_gemm: im2col straight into the B panel."""
    im2col_panel = kernels.get("gr_im2col_panel", 1, buffers=1)
    grid = (p.cg * p.kh * p.kw, p.n * p.groups)
    sizes = _sizes(p, 0, p.cg)

    def pack_b(data: Any, panel: Any) -> None:
        im2col_panel(kernels.queue, grid, (1, 1), panel, *kernels.array(data), *sizes)
    return pack_b


def conv2d_transpose_cl(backend: OpenCLBackend, device_id: int,
                        p: ConvParams) -> Callable[[Any, Any, Any], None]:
    """run(data, weight, out) for conv2d_transpose: a GEMM into columns, then col2im."""
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
    kernels = _Kernels(backend, device_id, p.dtype, "conv2d_transpose")
    col2im = kernels.get("gr_col2im", 2)
    sizes = _sizes(p, total, p.c)
    padded = (blocks(total, 64) * 64,)

    def run(data: Any, weight: Any, out: Any) -> None:
        gemm(weight, data, cols)
        if total:
            col2im(kernels.queue, padded, None, *kernels.array(out), *kernels.array(cols),
                   *sizes)
    return run
