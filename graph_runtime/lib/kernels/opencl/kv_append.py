"""kv_append on OpenCL (ops/kv_append.py): q rotated by the rotary kernel, then one work item per
element of present_k and present_v (the past's, or a new token's rotated k and copied v)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..gpu_common import compute_type
from .rotary import RotaryCl, rotated
from .source import ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param, cl_pointer, cl_store

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend


def present_source(dtype: str) -> str:
    """gr_kv_present for dtype: present_k and present_v, (batch, kv_heads, past + T, D)."""
    acc = compute_type(dtype, "opencl")
    return cl_header([dtype]) + f"""
#pragma OPENCL FP_CONTRACT OFF
// numpy counterpart: ops/kv_append.py's host kernel
__kernel void gr_kv_present({cl_param("pk", dtype, const=False)},
        {cl_param("pv", dtype, const=False)}, {cl_param("x", dtype)},
        {cl_param("past_k", dtype)}, {cl_param("past_v", dtype)}, {cl_param("cos", dtype)},
        {cl_param("sin", dtype)}, long n, long T, long H, long D, long R, long W, long P,
        long koff, long voff, long cb, long ct, long sb, long st) {{
    {cl_pointer("pk", dtype, const=False)}
    {cl_pointer("pv", dtype, const=False)}
    {cl_pointer("x", dtype)}
    {cl_pointer("past_k", dtype)}
    {cl_pointer("past_v", dtype)}
    {cl_pointer("cos", dtype)}
    {cl_pointer("sin", dtype)}
    long e = get_global_id(0);
    if (e >= n) return;
    long j = e % D;
    long r = (e / D) % (P + T);
    long bh = e / (D * (P + T));  // b * H + h
    if (r < P) {{
        long at = (bh * P + r) * D + j;
        {cl_store("pk", dtype, "e", cl_load("past_k", dtype, "at"))}
        {cl_store("pv", dtype, "e", cl_load("past_v", dtype, "at"))}
        return;
    }}
    long b = bh / H, h = bh % H, t = r - P;
    long src = (b * T + t) * W;
    long ks = src + koff + h * D;
    {acc} v = {cl_load("x", dtype, "ks + j")};
    {rotated(dtype, acc, "ks", "b * cb + t * ct + j", "b * sb + t * st + j")}
    {cl_store("pk", dtype, "e", "v")}
    {cl_store("pv", dtype, "e", cl_load("x", dtype, "src + voff + h * D + j"))}
}}
"""


class KvAppendCl:
    """run(qkv, past_k, past_v, cos, sin, q, present_k, present_v) on an OpenCL device."""

    def __init__(self, backend: OpenCLBackend, device_id: int, p: Mapping[str, Any],
                 shapes: Sequence[tuple[int, ...]]) -> None:
        dtype = str(p["dtype"])
        check_cl_dtypes("kv_append", backend, device_id, [dtype])
        qkv, past_k, _, cos, sin = shapes
        self.q = RotaryCl(backend, device_id, dtype, p["q_heads"], p["dim"], p["rot"],
                          p["q_offset"], qkv, cos, sin)
        self.kernel = ClKernel(backend, device_id, present_source(dtype), "gr_kv_present",
                               "kv_append")
        batch, tokens, width = qkv
        past, rot = past_k[2], p["rot"]
        self.n = batch * p["kv_heads"] * (past + tokens) * p["dim"]

        def strides(shape: tuple[int, ...]) -> tuple[np.int64, np.int64]:
            return (np.int64(shape[1] * rot if shape[0] > 1 else 0),
                    np.int64(rot if shape[1] > 1 else 0))
        self.scalars = (np.int64(self.n), np.int64(tokens), np.int64(p["kv_heads"]),
                        np.int64(p["dim"]), np.int64(rot), np.int64(width), np.int64(past),
                        np.int64(p["k_offset"]), np.int64(p["v_offset"]), *strides(cos),
                        *strides(sin))

    def __call__(self, qkv: Any, past_k: Any, past_v: Any, cos: Any, sin: Any, q: Any,
                 present_k: Any, present_v: Any) -> None:
        self.q(qkv, cos, sin, q)
        self.kernel.launch(self.n, None, present_k, present_v, qkv, past_k, past_v, cos, sin,
                           *self.scalars)
