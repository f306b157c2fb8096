"""Gather ops: take (indices along an axis or the flat data; clip or wrap), on every backend."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import attr_error, int_attr, op_error, parse_value, single_axis, str_attr
from ..kernels.gpu import ClKernel, cl_param, cl_pointer, copy_type
from ..kernels.host import host_factory
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import check_dtype, check_num_inputs, size_of

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

INDEX_DTYPES = ("int32", "int64")

def take_axis(spec: TensorSpec, attrs: Mapping[str, Any]) -> int | None:
    if parse_value(attrs.get("axis")) is None:
        return None
    return single_axis("take", attrs, "axis", len(spec.shape))


def take_extent(data: TensorSpec, axis: int | None) -> int:
    """How many entries the indices choose among: the axis, or every element when axis is None."""
    return size_of(data.shape) if axis is None else data.shape[axis]


def _take(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    check_num_inputs("take", inputs, 2)
    data, indices = inputs
    check_dtype("take", indices, INDEX_DTYPES, "input 1 (indices)")
    str_attr("take", attrs, "mode", "clip", ("clip", "wrap", "fast"))
    if int_attr("take", attrs, "batch_dims", 0) != 0:
        raise attr_error("take", "batch_dims", attrs["batch_dims"], "0 (batched take is not "
                                                                    "supported)")
    axis = take_axis(data, attrs)
    outer = () if axis is None else tuple(data.shape[:axis])
    inner = () if axis is None else tuple(data.shape[axis + 1:])
    extent = take_extent(data, axis)
    shape = outer + tuple(indices.shape) + inner
    if extent == 0 and size_of(shape) > 0:
        raise op_error("take", f"cannot take from input 0 {data}: axis {axis} is empty")
    return [TensorSpec(shape, data.dtype)]


def _host_take(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
               outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    data, indices = inputs
    axis = take_axis(data, attrs)
    mode = str_attr("take", attrs, "mode", "clip")
    extent = take_extent(data, axis)
    # Index workspace allocated once; "fast" clamps too, so no read leaves the array.
    work = backend.empty(device_id, tuple(indices.shape), np.dtype(indices.dtype))

    def run(x: Any, idx: Any, out: Any) -> None:
        if out.size == 0:
            return
        if mode == "wrap":
            xp.mod(idx, extent, out=work)
        else:
            xp.clip(idx, 0, extent - 1, out=work)
        xp.take(x.reshape(-1) if axis is None else x, work, axis=axis or 0, out=out)
    return run


def _cl_take(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    data, indices = inputs
    axis = take_axis(data, attrs)
    wrap = str_attr("take", attrs, "mode", "clip") == "wrap"
    extent = take_extent(data, axis)
    inner = 1 if axis is None else size_of(data.shape[axis + 1:])
    store = copy_type(data.dtype)
    fix = ("j = ((j % extent) + extent) % extent;" if wrap
           else "j = j < 0 ? 0 : (j >= extent ? extent - 1 : j);")
    source = f"""__kernel void gr_take({cl_param("out", store, const=False)},
        {cl_param("x", store)}, {cl_param("idx", indices.dtype)}, long m, long extent,
        long inner, long n) {{
    long i = get_global_id(0);
    if (i >= n) return;
    {cl_pointer("out", store, const=False)}
    {cl_pointer("x", store)}
    {cl_pointer("idx", indices.dtype)}
    long k = i % inner;
    long t = i / inner;
    long j = idx[t % m];
    {fix}
    out[i] = x[((t / m) * extent + j) * inner + k];
}}
"""
    knl = ClKernel(backend, device_id, source, "gr_take", "take")
    n = size_of(outputs[0].shape)
    m = size_of(indices.shape)
    return lambda x, idx, out: knl.launch(n, None, out, x, idx, m, extent, inner, n)


define_op("take", _take, 2, ("axis", "mode", "batch_dims"))
kernel("take", "cpu")(host_factory(_host_take))
kernel("take", "cuda")(host_factory(_host_take))
kernel("take", "opencl")(_cl_take)
