"""OpenCL row kernels (one work-group per row of an axis): softmax, layer_norm and rms_norm."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ...library import TensorSpec
from ...shapes import size_of
from ..gpu_common import compute_type
from .source import ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param, cl_pointer, cl_store

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend

_GROUP = 256


def rows(shape: Sequence[int], axis: int) -> tuple[int, int, int]:
    """(outer, length, inner): the axis as rows of a C-contiguous array."""
    return (size_of(shape[:axis]), int(shape[axis]), size_of(shape[axis + 1:]))


def _group_reduce(acc: str, name: str, merge: str) -> str:
    """C function folding one value per work item into one (NaN wins a max, as in NumPy)."""
    return f"""{acc} {name}(__local {acc}* buf, {acc} v) {{
    int lid = get_local_id(0);
    buf[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {{
        if (lid < s) {{ {merge} }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    {acc} r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}}"""


def row_source(dtype: str) -> str:
    """softmax, layer_norm and rms_norm kernels for dtype, with their work-group sum and max."""
    acc = compute_type(dtype, "opencl")
    load = cl_load("x", dtype, "base + k * inner")
    rms = f"{load} * inv * {cl_load('gamma', dtype, 'k')}"
    # Work-group r takes row r: its L values sit inner apart, from base on.
    row = "\n    ".join([f"__local {acc} buf[{_GROUP}];", "long r = get_group_id(0);",
                         "int G = get_local_size(0);",
                         "long base = (r / inner) * L * inner + r % inner;"])
    return cl_header([dtype]) + f"""
{_group_reduce(acc, "gr_group_sum", "buf[lid] += buf[lid + s];")}

{_group_reduce(acc, "gr_group_max", "if (buf[lid + s] > buf[lid] || buf[lid + s] != buf[lid + s]) "
                                    "buf[lid] = buf[lid + s];")}

// numpy counterpart: _softmax_host (max, exp, sum, divide along the axis)
__kernel void gr_softmax({cl_param("out", dtype, const=False)}, {cl_param("x", dtype)},
                         long L, long inner, int log_mode) {{
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("x", dtype)}
    {row}
    {acc} m = -INFINITY;
    for (long k = get_local_id(0); k < L; k += G) {{
        {acc} v = {load};
        if (v > m || v != v) m = v;
    }}
    m = gr_group_max(buf, m);
    {acc} s = 0;
    for (long k = get_local_id(0); k < L; k += G) s += exp({load} - m);
    s = gr_group_sum(buf, s);
    {acc} ls = log(s);
    for (long k = get_local_id(0); k < L; k += G) {{
        {acc} v = {load} - m;
        {cl_store("out", dtype, "base + k * inner", "log_mode ? v - ls : exp(v) / s")}
    }}
}}

// numpy counterpart: _layer_norm_host ((x - mean) / sqrt(var + eps) * gamma + beta)
__kernel void gr_layer_norm({cl_param("out", dtype, const=False)}, {cl_param("x", dtype)},
                            {cl_param("gamma", dtype)}, {cl_param("beta", dtype)},
                            long L, long inner, {acc} eps, int center, int scale) {{
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("x", dtype)}
    {cl_pointer("gamma", dtype)}
    {cl_pointer("beta", dtype)}
    {row}
    {acc} s = 0;
    for (long k = get_local_id(0); k < L; k += G) s += {load};
    {acc} mean = gr_group_sum(buf, s) / L;
    {acc} q = 0;
    for (long k = get_local_id(0); k < L; k += G) {{
        {acc} d = {load} - mean;
        q += d * d;
    }}
    {acc} inv = 1 / sqrt(gr_group_sum(buf, q) / L + eps);
    for (long k = get_local_id(0); k < L; k += G) {{
        {acc} v = ({load} - mean) * inv;
        if (scale) v *= {cl_load("gamma", dtype, "k")};
        if (center) v += {cl_load("beta", dtype, "k")};
        {cl_store("out", dtype, "base + k * inner", "v")}
    }}
}}

// numpy counterpart: _rms_norm_host (x / sqrt(mean(x^2) + eps) * gamma)
__kernel void gr_rms_norm({cl_param("out", dtype, const=False)}, {cl_param("x", dtype)},
                          {cl_param("gamma", dtype)}, long L, long inner, {acc} eps) {{
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("x", dtype)}
    {cl_pointer("gamma", dtype)}
    {row}
    {acc} q = 0;
    for (long k = get_local_id(0); k < L; k += G) {{
        {acc} d = {load};
        q += d * d;
    }}
    {acc} inv = 1 / sqrt(gr_group_sum(buf, q) / L + eps);
    for (long k = get_local_id(0); k < L; k += G) {{
        {cl_store("out", dtype, "base + k * inner", rms)}
    }}
}}
"""


def _group_size(length: int) -> int:
    group = 1
    while group < min(length, _GROUP):
        group *= 2
    return group


class RowKernel:
    """Kernel `entry` of row_source launched with one work-group per row of spec along axis.

    Its arguments: the arrays, then the row length and the inner stride, then extra scalars.
    """

    def __init__(self, backend: OpenCLBackend, device_id: int, spec: TensorSpec, axis: int,
                 entry: str, name: str) -> None:
        check_cl_dtypes(name, backend, device_id, [spec.dtype])
        outer, length, inner = rows(spec.shape, axis)
        self.kernel = ClKernel(backend, device_id, row_source(spec.dtype), entry, name)
        self.group = _group_size(length)
        self.work_items = (outer * inner if length else 0) * self.group
        self.sizes = (np.int64(length), np.int64(inner))

    def launch(self, arrays: Sequence[Any], *extra: Any) -> None:
        self.kernel.launch(self.work_items, self.group, *arrays, *self.sizes, *extra)
