"""Rotary position embedding on OpenCL: one work item per output element, token layout in and
out."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..gpu_common import compute_type
from .source import ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param, cl_pointer, cl_store

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend


def rotated(dtype: str, acc: str, src: str, cos_at: str, sin_at: str) -> str:
    """OpenCL C statements rotating v (x[src + j] read as acc) for j < R: half = R / 2,
    v * cos - x[j + half] * sin below half, v * cos + x[j - half] * sin above (cos and sin
    read at cos_at and sin_at)."""
    return f"""if (j < R) {{
        long hr = R / 2;
        {acc} c = {cl_load("cos", dtype, cos_at)};
        {acc} s = {cl_load("sin", dtype, sin_at)};
        {acc} other = j < hr ? -{cl_load("x", dtype, f"{src} + j + hr")}
                               : {cl_load("x", dtype, f"{src} + j - hr")};
        v = v * c + other * s;
    }}"""


def rotary_source(dtype: str) -> str:
    """gr_rotary for dtype, computing in its compute type."""
    acc = compute_type(dtype, "opencl")
    # NOTE: no fused multiply-add: each product rounded before the sum, as the exporters' Mul
    # and Add are (OpenCL C may contract a * b + c by default)
    return cl_header([dtype]) + f"""
#pragma OPENCL FP_CONTRACT OFF
// numpy counterpart: ops/rotary.py's host kernel (x * cos + rotate_half(x) * sin per head)
__kernel void gr_rotary({cl_param("out", dtype, const=False)}, {cl_param("x", dtype)},
        {cl_param("cos", dtype)}, {cl_param("sin", dtype)}, long n, long T, long H, long D,
        long R, long W, long off, long cb, long ct, long sb, long st) {{
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("x", dtype)}
    {cl_pointer("cos", dtype)}
    {cl_pointer("sin", dtype)}
    long e = get_global_id(0);
    if (e >= n) return;
    long j = e % D;
    long row = e / (H * D);  // b * T + t
    long h = (e / D) % H;
    long src = row * W + off + h * D;
    {acc} v = {cl_load("x", dtype, "src + j")};
    long b = row / T, t = row % T;
    {rotated(dtype, acc, "src", "b * cb + t * ct + j", "b * sb + t * st + j")}
    {cl_store("out", dtype, "e", "v")}
}}
"""


class RotaryCl:
    """run(x, cos, sin, out) on an OpenCL device; cos and sin (cb, ct, rot) read with stride 0
    along an axis of size 1."""

    def __init__(self, backend: OpenCLBackend, device_id: int, dtype: str, heads: int, dim: int,
                 rot: int, offset: int, x_shape: tuple[int, ...], cos_shape: tuple[int, ...],
                 sin_shape: tuple[int, ...]) -> None:
        check_cl_dtypes("rotary", backend, device_id, [dtype])
        self.kernel = ClKernel(backend, device_id, rotary_source(dtype), "gr_rotary", "rotary")
        batch, tokens, width = x_shape
        self.n = batch * tokens * heads * dim

        def strides(shape: tuple[int, ...]) -> tuple[np.int64, np.int64]:
            return (np.int64(shape[1] * rot if shape[0] > 1 else 0),
                    np.int64(rot if shape[1] > 1 else 0))
        self.scalars = (np.int64(self.n), np.int64(tokens), np.int64(heads), np.int64(dim),
                        np.int64(rot), np.int64(width), np.int64(offset), *strides(cos_shape),
                        *strides(sin_shape))

    def __call__(self, x: Any, cos: Any, sin: Any, out: Any) -> None:
        self.kernel.launch(self.n, None, out, x, cos, sin, *self.scalars)
