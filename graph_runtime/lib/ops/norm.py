"""ONNX-style normalizations: instance_norm, group_norm, lrn and lp_normalization, every backend.

instance_norm is group_norm with one channel per group, so both share one kernel: statistics
over each (n, group) row of (C / G) * spatial elements, then a per-channel scale and bias
(ONNX GroupNormalization opset 21: scale and bias have C entries).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import attr_error, float_attr, int_attr, op_error, single_axis
from ..kernels.cpu.rows_jit import group_norm_rows
from ..kernels.gpu_common import compute_type
from ..kernels.host import host_factory, wide_dtype
from ..kernels.opencl.source import (ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param,
                                     cl_pointer, cl_store)
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import FLOAT_DTYPES, check_dtype, check_num_inputs, check_same_dtype, size_of

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend


def _cl_kernel(backend: OpenCLBackend, device_id: int, op: str, dtype: str, source: str,
               entry: str) -> ClKernel:
    check_cl_dtypes(op, backend, device_id, [dtype])
    return ClKernel(backend, device_id, cl_header([dtype]) + source, entry, op)


def _cl_scalar(dtype: str, value: float) -> Any:
    """A float kernel argument in the compute type (double only for float64)."""
    return np.float64(value) if dtype == "float64" else np.float32(value)


_GROUP = 256  # work items per row (a power of two; rows shorter than that use fewer)


def _group_size(length: int) -> int:
    group = 1
    while group < min(length, _GROUP):
        group *= 2
    return group


def _cl_group_sum(acc: str) -> str:
    """C function summing one value per work item of a work-group (tree reduction)."""
    return f"""{acc} gr_norm_group_sum(__local {acc}* buf, {acc} v) {{
    int lid = get_local_id(0);
    buf[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {{
        if (lid < s) buf[lid] += buf[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    {acc} r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}}
"""


def _epsilon(op: str, attrs: Mapping[str, Any]) -> float:
    epsilon = float_attr(op, attrs, "epsilon", 1e-5)
    if epsilon < 0:
        raise attr_error(op, "epsilon", epsilon, "a non-negative number")
    return epsilon


# -- group_norm / instance_norm -----------------------------------------------------------------

@dataclass(frozen=True)
class GroupNormParams:
    n: int
    c: int
    groups: int
    spatial: int  # product of the axes after C
    epsilon: float
    dtype: str

    @property
    def row(self) -> int:
        """Elements per (n, group) row."""
        return self.c // self.groups * self.spatial


def group_norm_params(op: str, inputs: Sequence[TensorSpec],
                      attrs: Mapping[str, Any]) -> GroupNormParams:
    check_num_inputs(op, inputs, 3)
    dtype = check_same_dtype(op, inputs)
    check_dtype(op, inputs[0], FLOAT_DTYPES)
    shape = tuple(inputs[0].shape)
    if len(shape) < 3:
        raise op_error(op, f"input 0 {inputs[0]} needs rank 3 or more (N, C, spatial...)")
    c = shape[1]
    for spec, name in zip(inputs[1:], ("scale", "bias")):
        if tuple(spec.shape) != (c,):
            raise op_error(op, f"{name} has shape {tuple(spec.shape)} but data {inputs[0]} "
                               f"needs ({c},): one value per channel")
    if op == "instance_norm":
        groups = c
    else:
        groups = int_attr(op, attrs, "num_groups")
        if groups < 1 or c % groups:
            raise attr_error(op, "num_groups", groups,
                             f"a positive divisor of the {c} channels of input 0 {inputs[0]}")
    return GroupNormParams(shape[0], c, groups, size_of(shape[2:]), _epsilon(op, attrs), dtype)


def _group_norm_infer(op: str) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        group_norm_params(op, inputs, attrs)
        return [TensorSpec(tuple(inputs[0].shape), inputs[0].dtype)]
    return infer


def _group_norm_host(op: str) -> Callable[..., Callable[..., None]]:
    def make(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        p = group_norm_params(op, inputs, attrs)
        work = wide_dtype(p.dtype)
        # Workspace made once: the data in the work dtype, its squares and the row statistics.
        buf = xp.empty((p.n, p.groups, p.row), work)
        squares = xp.empty((p.n, p.groups, p.row), work)
        stat = xp.empty((p.n, p.groups, 1), work)
        by_channel = (p.n, p.c, p.spatial)

        def run(x: Any, scale: Any, bias: Any, out: Any) -> None:
            if p.row == 0 or p.n == 0:
                return
            xp.copyto(buf, x.reshape(buf.shape), casting="unsafe")
            xp.mean(buf, axis=2, keepdims=True, out=stat)
            xp.subtract(buf, stat, out=buf)
            xp.multiply(buf, buf, out=squares)
            xp.mean(squares, axis=2, keepdims=True, out=stat)
            xp.add(stat, p.epsilon, out=stat)
            xp.sqrt(stat, out=stat)
            xp.divide(buf, stat, out=buf)
            y = buf.reshape(by_channel)
            xp.multiply(y, scale.reshape(p.c, 1), out=y)
            xp.add(y, bias.reshape(p.c, 1), out=y)
            xp.copyto(out.reshape(by_channel), y, casting="unsafe")
        return run
    return make


def _cl_group_norm_source(dtype: str) -> str:
    acc = compute_type(dtype, "opencl")
    load = cl_load("x", dtype, "base + k")
    return _cl_group_sum(acc) + f"""
// numpy counterpart: _group_norm_host. Work-group r takes the (n, group) row r: mean, then the
// mean of squared deviations, then every element with its channel's scale and bias.
__kernel void gr_group_norm({cl_param("out", dtype, const=False)}, {cl_param("x", dtype)},
        {cl_param("scale", dtype)}, {cl_param("bias", dtype)}, long len, long groups,
        long per_group, long spatial, {acc} eps) {{
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("x", dtype)}
    {cl_pointer("scale", dtype)}
    {cl_pointer("bias", dtype)}
    __local {acc} buf[{_GROUP}];
    long r = get_group_id(0);
    int G = get_local_size(0);
    long base = r * len;
    {acc} s = 0;
    for (long k = get_local_id(0); k < len; k += G) s += {load};
    {acc} mean = gr_norm_group_sum(buf, s) / ({acc})len;
    {acc} q = 0;
    for (long k = get_local_id(0); k < len; k += G) {{
        {acc} d = {load} - mean;
        q += d * d;
    }}
    {acc} inv = ({acc})1 / sqrt(gr_norm_group_sum(buf, q) / ({acc})len + eps);
    long c0 = (r % groups) * per_group;
    for (long k = get_local_id(0); k < len; k += G) {{
        long c = c0 + k / spatial;
        {acc} v = ({load} - mean) * inv;
        v = v * {cl_load("scale", dtype, "c")} + {cl_load("bias", dtype, "c")};
        {cl_store("out", dtype, "base + k", "v")}
    }}
}}
"""


def _group_norm_cl(op: str) -> Callable[..., Callable[..., None]]:
    def factory(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        p = group_norm_params(op, inputs, attrs)
        knl = _cl_kernel(backend, device_id, op, p.dtype, _cl_group_norm_source(p.dtype),
                         "gr_group_norm")
        group = _group_size(p.row)
        work_items = (p.n * p.groups if p.row else 0) * group
        args = (p.row, p.groups, p.c // p.groups, max(p.spatial, 1),
                _cl_scalar(p.dtype, p.epsilon))

        def run(x: Any, scale: Any, bias: Any, out: Any) -> None:
            knl.launch(work_items, group, out, x, scale, bias, *args)
        return run
    return factory


def _group_norm_cpu(op: str) -> Callable[..., Callable[..., None]]:
    """float32/float64: the compiled two-pass rows (kernels/cpu/rows_jit.py); else NumPy's."""
    numpy_path = host_factory(_group_norm_host(op))

    def make(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        p = group_norm_params(op, inputs, attrs)
        if p.dtype not in ("float32", "float64") or p.row == 0 or p.n == 0:
            return numpy_path(backend, device_id, inputs, outputs, attrs)
        return group_norm_rows(p.n, p.c, p.groups, p.spatial, p.epsilon)
    return make


for _op, _attrs in (("instance_norm", ("epsilon",)), ("group_norm", ("num_groups", "epsilon"))):
    define_op(_op, _group_norm_infer(_op), 3, _attrs)
    kernel(_op, "cpu")(_group_norm_cpu(_op))
    kernel(_op, "cuda")(host_factory(_group_norm_host(_op)))
    kernel(_op, "opencl")(_group_norm_cl(_op))


# -- lrn ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LrnParams:
    n: int
    c: int
    spatial: int
    size: int
    alpha: float
    beta: float
    bias: float
    dtype: str

    @property
    def before(self) -> int:
        """Channels summed below c: floor((size - 1) / 2); above: ceil((size - 1) / 2)."""
        return (self.size - 1) // 2

    @property
    def after(self) -> int:
        return self.size - 1 - self.before


def lrn_params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> LrnParams:
    op = "lrn"
    check_num_inputs(op, inputs, 1)
    check_dtype(op, inputs[0], FLOAT_DTYPES)
    shape = tuple(inputs[0].shape)
    if len(shape) < 2:
        raise op_error(op, f"input 0 {inputs[0]} needs rank 2 or more (N, C, spatial...)")
    size = int_attr(op, attrs, "size")
    if size < 1:
        raise attr_error(op, "size", size, "a positive number of channels")
    bias = float_attr(op, attrs, "bias", 1.0)
    return LrnParams(shape[0], shape[1], size_of(shape[2:]), size,
                     float_attr(op, attrs, "alpha", 1e-4), float_attr(op, attrs, "beta", 0.75),
                     bias, inputs[0].dtype)


def _lrn_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    lrn_params(inputs, attrs)
    return [TensorSpec(tuple(inputs[0].shape), inputs[0].dtype)]


def _lrn_host(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
              outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = lrn_params(inputs, attrs)
    work = wide_dtype(p.dtype)
    shape = (p.n, p.c, p.spatial)
    squares = xp.empty(shape, work)
    total = xp.empty(shape, work)
    # (destination channels, source channels) of each window offset, clipped to [0, C).
    spans = []
    # NOTE: offsets past the channel count add nothing; clipping them keeps a huge size bounded.
    for off in range(max(-p.before, -p.c), min(p.after, p.c) + 1):
        lo = max(0, -off)
        hi = min(p.c, p.c - off)
        if lo < hi:
            spans.append((slice(lo, hi), slice(lo + off, hi + off)))

    def run(x: Any, out: Any) -> None:
        x3 = x.reshape(shape)
        xp.multiply(x3, x3, out=squares, casting="unsafe")
        total.fill(0)
        for dst, src in spans:
            xp.add(total[:, dst], squares[:, src], out=total[:, dst])
        xp.multiply(total, p.alpha / p.size, out=total)
        xp.add(total, p.bias, out=total)
        xp.power(total, p.beta, out=total)
        xp.divide(x3, total, out=total, casting="unsafe")
        xp.copyto(out.reshape(shape), total, casting="unsafe")
    return run


def _cl_lrn_source(dtype: str) -> str:
    acc = compute_type(dtype, "opencl")
    return f"""
// numpy counterpart: _lrn_host (x / (bias + alpha / size * window sum of x^2) ^ beta)
__kernel void gr_lrn({cl_param("out", dtype, const=False)}, {cl_param("x", dtype)}, long total,
        long C, long S, long before, long after, {acc} alpha_n, {acc} beta, {acc} bias) {{
    long i = get_global_id(0);
    if (i >= total) return;
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("x", dtype)}
    long s = i % S;
    long c = (i / S) % C;
    long base = i - c * S;
    long lo = c - before < 0 ? 0 : c - before;
    long hi = c + after > C - 1 ? C - 1 : c + after;
    {acc} sum = 0;
    for (long k = lo; k <= hi; ++k) {{
        {acc} v = {cl_load("x", dtype, "base + k * S")};
        sum += v * v;
    }}
    {acc} v = {cl_load("x", dtype, "i")} / pow(bias + alpha_n * sum, beta);
    {cl_store("out", dtype, "i", "v")}
}}
"""


def _lrn_cl(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
            outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = lrn_params(inputs, attrs)
    knl = _cl_kernel(backend, device_id, "lrn", p.dtype, _cl_lrn_source(p.dtype), "gr_lrn")
    total = p.n * p.c * p.spatial
    args = (total, p.c, max(p.spatial, 1), p.before, p.after,
            *(_cl_scalar(p.dtype, v) for v in (p.alpha / p.size, p.beta, p.bias)))
    return lambda x, out: knl.launch(total, None, out, x, *args)


define_op("lrn", _lrn_infer, 1, ("size", "alpha", "beta", "bias"))
kernel("lrn", "cpu")(host_factory(_lrn_host))
kernel("lrn", "cuda")(host_factory(_lrn_host))
kernel("lrn", "opencl")(_lrn_cl)


# -- lp_normalization ---------------------------------------------------------------------------

def lp_params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> tuple[int, int]:
    """(axis, p) of an lp_normalization."""
    op = "lp_normalization"
    check_num_inputs(op, inputs, 1)
    check_dtype(op, inputs[0], FLOAT_DTYPES)
    if len(inputs[0].shape) == 0:
        raise op_error(op, f"input 0 {inputs[0]} is a scalar; it needs an axis")
    axis = single_axis(op, attrs, "axis", len(inputs[0].shape), -1)
    p = int_attr(op, attrs, "p", 2)
    if p not in (1, 2):
        raise attr_error(op, "p", p, "1 or 2")
    return axis, p


def _lp_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    lp_params(inputs, attrs)
    return [TensorSpec(tuple(inputs[0].shape), inputs[0].dtype)]


def _lp_host(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    axis, p = lp_params(inputs, attrs)
    spec = inputs[0]
    work = wide_dtype(spec.dtype)
    buf = xp.empty(spec.shape, work)
    norm = xp.empty(tuple(1 if i == axis else d for i, d in enumerate(spec.shape)), work)

    def run(x: Any, out: Any) -> None:
        if p == 1:
            xp.absolute(x, out=buf, casting="unsafe")
        else:
            xp.multiply(x, x, out=buf, casting="unsafe")
        xp.sum(buf, axis=axis, keepdims=True, out=norm)
        if p == 2:
            xp.sqrt(norm, out=norm)
        # An all-zero line stays zero (ONNX's backend tests), not 0 / 0.
        xp.add(norm, norm == 0, out=norm)
        xp.divide(x, norm, out=buf, casting="unsafe")
        xp.copyto(out, buf, casting="unsafe")
    return run


def _cl_lp_source(dtype: str) -> str:
    acc = compute_type(dtype, "opencl")
    load = cl_load("x", dtype, "base + k * inner")
    return _cl_group_sum(acc) + f"""
// numpy counterpart: _lp_host. Work-group r takes line r along the axis (its values inner
// apart); an all-zero line stays zero.
__kernel void gr_lp_norm({cl_param("out", dtype, const=False)}, {cl_param("x", dtype)},
        long len, long inner, int p) {{
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("x", dtype)}
    __local {acc} buf[{_GROUP}];
    long r = get_group_id(0);
    int G = get_local_size(0);
    long base = (r / inner) * len * inner + r % inner;
    {acc} s = 0;
    for (long k = get_local_id(0); k < len; k += G) {{
        {acc} v = {load};
        s += p == 1 ? fabs(v) : v * v;
    }}
    {acc} norm = gr_norm_group_sum(buf, s);
    if (p == 2) norm = sqrt(norm);
    if (norm == 0) norm = 1;
    for (long k = get_local_id(0); k < len; k += G) {{
        {cl_store("out", dtype, "base + k * inner", f"{load} / norm")}
    }}
}}
"""


def _lp_cl(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
           outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    axis, p = lp_params(inputs, attrs)
    shape = tuple(inputs[0].shape)
    dtype = inputs[0].dtype
    knl = _cl_kernel(backend, device_id, "lp_normalization", dtype, _cl_lp_source(dtype),
                     "gr_lp_norm")
    length = shape[axis]
    inner = size_of(shape[axis + 1:])
    group = _group_size(length)
    work_items = (size_of(shape) // length if length else 0) * group
    args = (length, max(inner, 1), np.int32(p))
    return lambda x, out: knl.launch(work_items, group, out, x, *args)


define_op("lp_normalization", _lp_infer, 1, ("axis", "p"))
kernel("lp_normalization", "cpu")(host_factory(_lp_host))
kernel("lp_normalization", "cuda")(host_factory(_lp_host))
kernel("lp_normalization", "opencl")(_lp_cl)

__all__ = ["GroupNormParams", "LrnParams", "group_norm_params", "lp_params", "lrn_params"]
