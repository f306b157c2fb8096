"""Pooling standard ops in NCHW (max_pool2d, avg_pool2d, global_avg_pool2d, global_max_pool2d)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...backends import REGISTRY
from ..attrs import bool_attr, op_error
from ..conv_params import check_layout, out_size, padding_attr, positive_pair
from ..kernels.gpu import (
    ClKernel,
    check_cl_dtypes,
    cl_header,
    cl_load,
    cl_param,
    cl_pointer,
    cl_store,
    compute_type,
    device_array,
)
from ..kernels.host import array_module, host_kernel, wide_dtype
from ..library import TensorSpec
from ..registry import define_op, get_op, kernel
from ..shapes import FLOAT_DTYPES, check_dtype, check_num_inputs, check_rank, size_of

POOL_ATTRS = ("pool_size", "strides", "dilation", "padding", "layout", "out_layout", "ceil_mode")
AVG_ATTRS = POOL_ATTRS + ("count_include_pad",)
GLOBAL_ATTRS = ("layout", "out_layout")


@dataclass(frozen=True)
class PoolParams:
    """Sizes of one NCHW pooling; `pad` is the explicit (top, left, bottom, right) padding."""

    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    oh: int
    ow: int
    strides: tuple[int, int]
    pad: tuple[int, int, int, int]
    dilation: tuple[int, int]
    count_include_pad: bool
    dtype: str


def pool_params(op: str, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> PoolParams:
    check_num_inputs(op, inputs, 1)
    check_dtype(op, inputs[0], FLOAT_DTYPES)
    check_rank(op, inputs[0], (4,), "data")
    check_layout(op, attrs, "layout", "NCHW")
    check_layout(op, attrs, "out_layout", "NCHW")
    if "pool_size" not in attrs:
        raise op_error(op, "missing required attribute 'pool_size'")
    kh, kw = positive_pair(op, attrs, "pool_size", (1, 1))
    strides = positive_pair(op, attrs, "strides", (1, 1))
    dilation = positive_pair(op, attrs, "dilation", (1, 1))
    pad = padding_attr(op, attrs)
    ceil = bool_attr(op, attrs, "ceil_mode", False)
    include = bool_attr(op, attrs, "count_include_pad", False)
    n, c, h, w = inputs[0].shape
    # Relay's rule: ceil_mode rounds the window count up, letting the last window overhang.
    oh = out_size(op, "height", h, pad[0] + pad[2], kh, strides[0], dilation[0], ceil)
    ow = out_size(op, "width", w, pad[1] + pad[3], kw, strides[1], dilation[1], ceil)
    return PoolParams(n, c, h, w, kh, kw, oh, ow, strides, pad, dilation, include,
                      inputs[0].dtype)


def _pool_infer(op: str) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        p = pool_params(op, inputs, attrs)
        return [TensorSpec((p.n, p.c, p.oh, p.ow), p.dtype)]
    return infer


def _taps(out: int, k: int, stride: int, dilation: int, lo: int, hi: int,
          before: int) -> np.ndarray:
    """Per output index, how many window taps land in [lo, hi) (input coordinates)."""
    starts = np.arange(out) * stride - before
    taps = starts[:, None] + np.arange(k)[None, :] * dilation
    return ((taps >= lo) & (taps < hi)).sum(axis=1)


def avg_divisor(p: PoolParams) -> np.ndarray:
    """The (OH, OW) divisor: taps inside the data, or inside data plus explicit padding.

    The ceil_mode overhang never counts; a window with no counted tap gets divisor 1.
    """
    pt, pl, pb, pr = p.pad
    lo_h, hi_h = (-pt, p.h + pb) if p.count_include_pad else (0, p.h)
    lo_w, hi_w = (-pl, p.w + pr) if p.count_include_pad else (0, p.w)
    rows = _taps(p.oh, p.kh, p.strides[0], p.dilation[0], lo_h, hi_h, pt)
    cols = _taps(p.ow, p.kw, p.strides[1], p.dilation[1], lo_w, hi_w, pl)
    return np.maximum(np.outer(rows, cols), 1).astype(np.float64)


# -- cpu / cuda ---------------------------------------------------------------------------------

def _pool_host(op: str) -> Callable[..., Callable[..., None]]:
    is_max = op == "max_pool2d"

    def factory(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        p = pool_params(op, inputs, attrs)
        xp = array_module(backend)
        pt, pl = p.pad[0], p.pad[1]
        sh, sw = p.strides
        dh, dw = p.dilation
        # Workspace made once: the data inside a border of lowest (max) or 0 (avg) that also
        # covers the ceil_mode overhang; only the interior is rewritten per call.
        hp = max(pt + p.h, (p.oh - 1) * sh + (p.kh - 1) * dh + 1)
        wp = max(pl + p.w, (p.ow - 1) * sw + (p.kw - 1) * dw + 1)
        work = p.dtype if is_max else wide_dtype(p.dtype)
        padded = xp.full((p.n, p.c, hp, wp), _lowest(work) if is_max else 0, work)
        acc = xp.empty(outputs[0].shape, work) if work != p.dtype else None
        inv = None
        if not is_max:
            inv = xp.asarray((1.0 / avg_divisor(p)).astype(work))
        # One strided (N, C, OH, OW) view of the workspace per window tap, made once. Folding the
        # taps with maximum/add is ~20x faster in NumPy than max/sum over a 6-D window view.
        s_n, s_c, s_h, s_w = padded.strides
        taps = [xp.lib.stride_tricks.as_strided(
                    padded[:, :, i * dh:, j * dw:], shape=(p.n, p.c, p.oh, p.ow),
                    strides=(s_n, s_c, sh * s_h, sw * s_w))
                for i in range(p.kh) for j in range(p.kw)]
        fold = xp.maximum if is_max else xp.add

        def run(data: Any, out: Any) -> None:
            padded[:, :, pt:pt + p.h, pl:pl + p.w] = data
            target = out if acc is None else acc
            xp.copyto(target, taps[0])
            for tap in taps[1:]:
                fold(target, tap, out=target)
            if not is_max:
                xp.multiply(target, inv, out=target)
            if acc is not None:
                xp.copyto(out, acc, casting="unsafe")
        return host_kernel(backend, device_id, run)
    return factory


# -- opencl -------------------------------------------------------------------------------------

def _lowest(dtype: str) -> float:
    """What max pooling pads with: the dtype's lowest finite value, as TVM pads."""
    return float(np.finfo(dtype).min)


def _inv_dtype(dtype: str) -> str:
    """Reciprocal divisors are stored in the compute type (float for half)."""
    return "float64" if dtype == "float64" else "float32"


def _cl_pool_source(dtype: str, is_max: bool) -> str:
    acc = compute_type(dtype, "opencl")
    init = repr(_lowest(dtype)) if is_max else "0"
    merge = "if (v > s || v != v) s = v;" if is_max else "s += v;"
    result = "s" if is_max else "s * inv[(long)oh * OW + ow]"
    inv_dtype = _inv_dtype(dtype)
    extra = "" if is_max else f", {cl_param('inv', inv_dtype)}"
    inv_ptr = "" if is_max else cl_pointer("inv", inv_dtype)
    return cl_header([dtype]) + f"""
// numpy counterpart: _pool_host (max or mean over each strided, padded window)
__kernel void gr_pool({cl_param("out", dtype, const=False)}, {cl_param("data", dtype)}{extra},
                      long total, int H, int W, int KH, int KW, int OH, int OW, int SH, int SW,
                      int PT, int PL, int DH, int DW) {{
    long i = get_global_id(0);
    if (i >= total) return;
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("data", dtype)}
    {inv_ptr}
    long t = i;
    int ow = t % OW; t /= OW;
    int oh = t % OH; t /= OH;
    {acc} s = {init};
    for (int kh = 0; kh < KH; ++kh) {{
        int y = oh * SH - PT + kh * DH;
        if (y < 0 || y >= H) continue;
        for (int kw = 0; kw < KW; ++kw) {{
            int x = ow * SW - PL + kw * DW;
            if (x < 0 || x >= W) continue;
            {acc} v = {cl_load("data", dtype, "(t * H + y) * W + x")};
            {merge}
        }}
    }}
    {cl_store("out", dtype, "i", result)}
}}
"""


def _pool_cl(op: str) -> Callable[..., Callable[..., None]]:
    is_max = op == "max_pool2d"

    def factory(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        p = pool_params(op, inputs, attrs)
        check_cl_dtypes(op, backend, device_id, [p.dtype])
        knl = ClKernel(backend, device_id, _cl_pool_source(p.dtype, is_max), "gr_pool", op)
        total = size_of((p.n, p.c, p.oh, p.ow))
        sizes = [np.int64(total)] + [np.int32(v) for v in (
            p.h, p.w, p.kh, p.kw, p.oh, p.ow, p.strides[0], p.strides[1], p.pad[0], p.pad[1],
            p.dilation[0], p.dilation[1])]
        if is_max:
            return lambda data, out: knl.launch(total, None, out, data, *sizes)
        inv = device_array(backend, device_id, (1.0 / avg_divisor(p)).astype(_inv_dtype(p.dtype)))
        return lambda data, out: knl.launch(total, None, out, data, inv, *sizes)
    return factory


# -- global pools: a mean / max over H and W --------------------------------------------------

GLOBAL_REDUCE = {"global_avg_pool2d": "mean", "global_max_pool2d": "max"}


def _global_infer(op: str) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        check_num_inputs(op, inputs, 1)
        check_dtype(op, inputs[0], FLOAT_DTYPES)
        check_rank(op, inputs[0], (4,), "data")
        check_layout(op, attrs, "layout", "NCHW")
        check_layout(op, attrs, "out_layout", "NCHW")
        n, c, h, w = inputs[0].shape
        if h * w == 0 and n * c > 0:
            raise op_error(op, f"data {inputs[0]} has an empty {h}x{w} image to pool")
        return [TensorSpec((n, c, 1, 1), inputs[0].dtype)]
    return infer


def _global_factory(op: str) -> Callable[..., Callable[..., None]]:
    def factory(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        reduce_op = get_op(GLOBAL_REDUCE[op])
        return reduce_op.kernels[backend.name](backend, device_id, inputs, outputs,
                                               {"axis": [2, 3], "keepdims": True})
    return factory


for _op, _attrs in (("max_pool2d", POOL_ATTRS), ("avg_pool2d", AVG_ATTRS)):
    define_op(_op, _pool_infer(_op), 1, _attrs)
    kernel(_op, "cpu")(_pool_host(_op))
    kernel(_op, "cuda")(_pool_host(_op))
    kernel(_op, "opencl")(_pool_cl(_op))
for _op in GLOBAL_REDUCE:
    define_op(_op, _global_infer(_op), 1, GLOBAL_ATTRS)
    for _kind in REGISTRY:
        kernel(_op, _kind)(_global_factory(_op))

__all__ = ["PoolParams", "pool_params", "avg_divisor"]
