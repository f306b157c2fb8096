"""Gather ops on every backend: take (indices along an axis or the flat data; clip or wrap) and
gather_elements (ONNX GatherElements)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import attr_error, int_attr, op_error, parse_value, single_axis, str_attr
from ..kernels.gpu_common import copy_type, device_array
from ..kernels.host import host_factory
from ..kernels.opencl.source import ClKernel, cl_param, cl_pointer
from ..library import TensorSpec
from ..prepared import AnyShape
from ..registry import define_op, kernel
from ..shapes import check_dtype, check_num_inputs, contiguous_strides, size_of

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

INDEX_DTYPES = ("int32", "int64")

def take_axis(spec: TensorSpec, attrs: Mapping[str, Any]) -> int | None:
    if parse_value(attrs.get("axis")) is None:
        return None
    return single_axis("take", attrs, "axis", len(spec.shape))


def take_extent(data: Any, axis: int | None) -> int:
    """How many entries the indices choose among: the axis, or every element when axis is None
    (data: a TensorSpec, or an array at run time)."""
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
    # The index workspace (a GPU's) grows to the largest indices met and the extent is read
    # per call, so one kernel takes any shapes of these ranks (a decoder's mask gather at every
    # past length). "fast" clamps too, so no read leaves the array.
    work = [] if xp is np else [backend.empty(device_id, (size_of(indices.shape),),
                                              np.dtype(indices.dtype))]
    # NumPy's take clips or wraps the indices itself, as these modes ask (clip: into
    # [0, extent - 1], negatives to 0; wrap: modulo the extent), with no buffered output (its
    # default mode buffers `out`): an embedding lookup of 64 ids 6.6 -> 1.6 us
    own_mode: Literal["wrap", "clip"] = "wrap" if mode == "wrap" else "clip"

    def run(x: Any, idx: Any, out: Any) -> None:
        if out.size == 0:
            return
        extent = take_extent(x, axis)
        if extent == 0:
            raise op_error("take", f"cannot take from input 0 of shape {tuple(x.shape)}: axis "
                                   f"{axis} is empty")
        if xp is np:
            np.take(x.reshape(-1) if axis is None else x, idx, axis=axis or 0, out=out,
                    mode=own_mode)
            return
        if work[0].size < idx.size:
            work[0] = backend.empty(device_id, (idx.size,), np.dtype(idx.dtype))
        chosen = work[0][:idx.size].reshape(idx.shape)
        if mode == "wrap":
            xp.mod(idx, extent, out=chosen)
        else:
            xp.clip(idx, 0, extent - 1, out=chosen)
        xp.take(x.reshape(-1) if axis is None else x, chosen, axis=axis or 0, out=out)
    return AnyShape(run)


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


# -- gather_elements ----------------------------------------------------------------------------

def _gather_elements_axis(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> int:
    op = "gather_elements"
    check_num_inputs(op, inputs, 2)
    data, indices = inputs
    check_dtype(op, indices, INDEX_DTYPES, "input 1 (indices)")
    rank = len(data.shape)
    if rank == 0 or len(indices.shape) != rank:
        raise op_error(op, f"indices {indices} must have the rank of data {data} (at least 1)")
    axis = single_axis(op, attrs, "axis", rank, 0)
    for d, (n, m) in enumerate(zip(data.shape, indices.shape)):
        if d != axis and m > n:
            raise op_error(op, f"indices {indices} axis {d} has {m} entries but data {data} "
                               f"has only {n}")
    if data.shape[axis] == 0 and size_of(indices.shape) > 0:
        raise op_error(op, f"cannot gather from data {data}: axis {axis} is empty")
    return axis


def _gather_elements_infer(inputs: Sequence[TensorSpec],
                           attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _gather_elements_axis(inputs, attrs)
    return [TensorSpec(tuple(inputs[1].shape), inputs[0].dtype)]


def _host_gather_elements(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                          outputs: Sequence[TensorSpec],
                          attrs: Mapping[str, Any]) -> Callable[..., None]:
    data, indices = inputs
    axis = _gather_elements_axis(inputs, attrs)
    extent = data.shape[axis]
    # Non-axis dims of indices may be shorter than data's: read only that corner of data.
    corner = tuple(slice(None) if d == axis else slice(0, m)
                   for d, m in enumerate(indices.shape))
    check = backend.name == "cpu"
    compiled = _compiled_gather(data, indices, axis) if check else None

    def numpy_workspaces() -> tuple[Any, Any]:
        return (backend.empty(device_id, tuple(indices.shape), np.dtype(indices.dtype)),
                backend.empty(device_id, tuple(indices.shape), np.dtype(bool)))
    # NumPy's way's index workspaces: made now where it is the way, else at its first use (a
    # compiled gather handed views that are not C-contiguous)
    spaces = [] if compiled is not None else [numpy_workspaces()]

    def out_of_range(x: Any, idx: Any, first: tuple[int, ...]) -> Exception:
        return op_error("gather_elements",
                        f"index {int(idx[first])} at indices{list(first)} is out of range for "
                        f"axis {axis} of data {tuple(x.shape)}: expected [-{extent}, "
                        f"{extent - 1}]")

    def run(x: Any, idx: Any, out: Any) -> None:
        if out.size == 0:
            return
        if compiled is not None and x.flags.c_contiguous and idx.flags.c_contiguous and \
                out.flags.c_contiguous:
            bad = compiled(x, idx, out)
            if bad >= 0:
                raise out_of_range(x, idx, tuple(int(i) for i in np.unravel_index(bad,
                                                                                  idx.shape)))
            return
        if not spaces:
            spaces.append(numpy_workspaces())
        work, negative = spaces[0]
        xp.less(idx, 0, out=negative)
        xp.multiply(negative, extent, out=work)
        xp.add(work, idx, out=work)
        if check:
            bad = (work < 0) | (work >= extent)
            if bad.any():
                raise out_of_range(x, idx, tuple(int(i) for i in np.argwhere(bad)[0]))
        else:
            # NOTE: a device-side range check would sync every run; GPUs clamp instead.
            xp.clip(work, 0, extent - 1, out=work)
        out[...] = xp.take_along_axis(x[corner], work, axis=axis)
    return run


# the unsigned type of each item size: a gather only copies items, so it moves their bytes
_ITEM_TYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _compiled_gather(data: TensorSpec, indices: TensorSpec, axis: int
                     ) -> Callable[[Any, Any, Any], int] | None:
    """The CPU's one-pass gather (cpu/loops_jit.gather_axis) on C-contiguous arrays viewed as
    (outer, axis, inner) items of data's size, or None where it does not apply: indices shorter
    than data off the axis (a corner of data), or items of another size. Its result: -1, or the
    flat position in the indices of the first out of range. Measured on DeBERTa-v2's relative
    position gathers, (4, 128, 128) from (4, 128, 256): 0.7-0.8 ms as take_along_axis with its
    checks, against ONNX Runtime's 84 us (docs/measurements.md)."""
    item = _ITEM_TYPES.get(np.dtype(data.dtype).itemsize)
    same = all(d == axis or m == n for d, (n, m) in enumerate(zip(data.shape, indices.shape)))
    if item is None or not same:
        return None
    from ..kernels.cpu import jit_setup
    from ..kernels.cpu.loops_jit import gather_axis
    jit_setup.start()  # numba's set-up overlaps create(), as for every compiled kernel
    outer = size_of(data.shape[:axis])
    inner = size_of(data.shape[axis + 1:])
    extent = data.shape[axis]
    x_shape = (outer, extent, inner)
    idx_shape = (outer, indices.shape[axis], inner)

    def gather(x: Any, idx: Any, out: Any) -> int:
        return int(gather_axis(x.view(item).reshape(x_shape), idx.reshape(idx_shape),
                               out.view(item).reshape(idx_shape), extent))
    return gather


def _cl_gather_elements(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                        outputs: Sequence[TensorSpec],
                        attrs: Mapping[str, Any]) -> Callable[..., None]:
    data, indices = inputs
    axis = _gather_elements_axis(inputs, attrs)
    rank = len(data.shape)
    store = copy_type(data.dtype)
    source = f"""// numpy counterpart: _host_gather_elements (indices wrap once, then clamp)
__kernel void gr_gather_elements({cl_param("out", store, const=False)},
        {cl_param("x", store)}, {cl_param("idx", indices.dtype)}, {cl_param("meta", "int64")},
        int rank, int axis, long extent, long n) {{
    long i = get_global_id(0);
    if (i >= n) return;
    {cl_pointer("out", store, const=False)}
    {cl_pointer("x", store)}
    {cl_pointer("idx", indices.dtype)}
    {cl_pointer("meta", "int64")}
    long j = idx[i];
    if (j < 0) j += extent;
    j = j < 0 ? 0 : (j >= extent ? extent - 1 : j);
    long rest = i;
    long src = 0;
    for (int d = rank - 1; d >= 0; --d) {{
        long c = rest % meta[d]; rest /= meta[d];
        src += (d == axis ? j : c) * meta[rank + d];
    }}
    out[i] = x[src];
}}
"""
    knl = ClKernel(backend, device_id, source, "gr_gather_elements", "gather_elements")
    meta = device_array(backend, device_id, np.array(
        list(indices.shape) + list(contiguous_strides(data.shape)), np.int64))
    n = size_of(indices.shape)
    args = (meta, np.int32(rank), np.int32(axis), data.shape[axis], n)
    return lambda x, idx, out: knl.launch(n, None, out, x, idx, *args)


define_op("gather_elements", _gather_elements_infer, 2, ("axis",))
kernel("gather_elements", "cpu")(host_factory(_host_gather_elements))
kernel("gather_elements", "cuda")(host_factory(_host_gather_elements))
kernel("gather_elements", "opencl")(_cl_gather_elements)
