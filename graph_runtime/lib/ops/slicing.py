"""Ops that cut or join along axes (strided_slice, split, concatenate, pad) on every backend."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import (attr_error, float_attr, normalize_axis, op_error, parse_value, single_axis,
                     str_attr)
from ..kernels.host import host_factory
from ..kernels.opencl.source import cl_strided_copy
from ..library import TensorSpec
from ..kernels.cpu.omp_team import available as team_available
from ..kernels.cpu.pool_jit import SERIAL_OUTPUTS
from ..kernels.cpu.split_rows import HostSplit
from ..kernels.threads import channel_split, chunk_bounds, parallel_items
from ..prepared import PreparedKernel
from ..registry import define_op, kernel
from ..shapes import check_rank, check_same_dtype, contiguous_strides, one_input, size_of

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

# -- shape rules ----------------------------------------------------------------------------------

def _int_list(op: str, attrs: Mapping[str, Any], name: str) -> list[int | None] | None:
    value = parse_value(attrs.get(name))
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not all(
            v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in value):
        raise attr_error(op, name, value, "a list of integers")
    return value


def slice_plan(shape: tuple[int, ...], attrs: Mapping[str, Any]) -> list[tuple[int, int, int]]:
    """(first index, step, count) per axis for Relay's strided_slice (Python slice rules)."""
    op = "strided_slice"
    begin = _int_list(op, attrs, "begin")
    if begin is None:
        raise op_error(op, "missing required attribute 'begin'")
    end = _int_list(op, attrs, "end") or []
    strides = _int_list(op, attrs, "strides") or []
    mode = str_attr(op, attrs, "slice_mode", "end", ("end", "size"))
    axes_raw = _int_list(op, attrs, "axes")
    ndim = len(shape)
    if axes_raw is None:
        if len(begin) > ndim:
            raise attr_error(op, "begin", begin, f"at most {ndim} entries for an input of rank "
                                                 f"{ndim}")
        axes = list(range(len(begin)))
    else:
        if len(axes_raw) != len(begin):
            raise op_error(op, f"axes {axes_raw} and begin {begin} differ in length")
        axes = [normalize_axis(op, a if a is not None else 0, ndim, "axes") for a in axes_raw]
    plan = [(0, 1, d) for d in shape]
    for k, axis in enumerate(axes):
        dim = shape[axis]
        b = begin[k]
        e = end[k] if k < len(end) else None
        step = strides[k] if k < len(strides) else None
        s: int = 1 if step is None else step
        if mode == "size":
            s = 1
            start = 0 if b is None else (b + dim if b < 0 else b)
            e = None if e is None or e < 0 else start + e
        if s == 0:
            raise attr_error(op, "strides", strides, "non-zero steps")
        picked = range(dim)[slice(b, e, s)]
        plan[axis] = (picked.start if len(picked) else 0, s, len(picked))
    return plan


def split_plan(dim: int, sections: Any) -> list[tuple[int, int]]:
    """(start, count) of each piece of an axis of size dim, as np.split cuts it."""
    if isinstance(sections, int) and not isinstance(sections, bool):
        if sections <= 0 or dim % sections:
            raise attr_error("split", "indices_or_sections", sections,
                             f"a positive number of sections dividing the axis size {dim}")
        size = dim // sections
        return [(i * size, size) for i in range(sections)]
    if not isinstance(sections, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in sections):
        raise attr_error("split", "indices_or_sections", sections,
                         "a number of sections or a list of split indices")
    bounds = [0] + sections + [dim]
    pieces = []
    for a, b in zip(bounds, bounds[1:]):
        picked = range(dim)[a:b]
        pieces.append((picked.start if len(picked) else 0, len(picked)))
    return pieces


def split_pieces(spec: TensorSpec, attrs: Mapping[str, Any]) -> tuple[int, list[tuple[int, int]]]:
    """split's axis and the (start, count) of each piece along it."""
    axis = single_axis("split", attrs, "axis", len(spec.shape), 0)
    return axis, split_plan(spec.shape[axis], parse_value(attrs.get("indices_or_sections")))


def concatenate_axis(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> int:
    """concatenate's axis, normalized against input 0 (default 0)."""
    return single_axis("concatenate", attrs, "axis", len(inputs[0].shape), 0)


def _strided_slice(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("strided_slice", inputs)
    plan = slice_plan(tuple(spec.shape), attrs)
    return [TensorSpec(tuple(count for _, _, count in plan), spec.dtype)]


def _split(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("split", inputs)
    check_rank("split", spec, range(1, 33))
    axis, pieces = split_pieces(spec, attrs)
    outs = []
    for _, count in pieces:
        shape = list(spec.shape)
        shape[axis] = count
        outs.append(TensorSpec(tuple(shape), spec.dtype))
    return outs


def _concatenate(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    if not inputs:
        raise op_error("concatenate", "needs at least one input")
    dtype = check_same_dtype("concatenate", inputs)
    first = inputs[0]
    if not first.shape:
        raise op_error("concatenate", "input 0 is a scalar; expected rank >= 1")
    axis = concatenate_axis(inputs, attrs)
    total = 0
    for i, spec in enumerate(inputs):
        same = [d for k, d in enumerate(spec.shape) if k != axis]
        want = [d for k, d in enumerate(first.shape) if k != axis]
        if len(spec.shape) != len(first.shape) or same != want:
            raise op_error("concatenate", f"input {i} has shape {tuple(spec.shape)} but input 0 "
                                          f"has {tuple(first.shape)}; they may differ only on "
                                          f"axis {axis}")
        total += spec.shape[axis]
    shape = list(first.shape)
    shape[axis] = total
    return [TensorSpec(tuple(shape), dtype)]


def pad_widths(spec: TensorSpec, attrs: Mapping[str, Any]) -> list[tuple[int, int]]:
    value = parse_value(attrs.get("pad_width"))
    ndim = len(spec.shape)
    ok = isinstance(value, list) and len(value) == ndim and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) and v >= 0 for v in p)
        for p in value)
    if not ok:
        raise attr_error("pad", "pad_width", value, f"{ndim} pairs [before, after] of "
                                                    "non-negative integers, one per axis")
    return [(p[0], p[1]) for p in value]


def _pad(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("pad", inputs)
    widths = pad_widths(spec, attrs)
    float_attr("pad", attrs, "pad_value", 0.0)
    str_attr("pad", attrs, "pad_mode", "constant", ("constant",))
    shape = tuple(d + b + a for d, (b, a) in zip(spec.shape, widths))
    return [TensorSpec(shape, spec.dtype)]


# -- cpu / cuda -----------------------------------------------------------------------------------

def _host_strided_slice(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                        outputs: Sequence[TensorSpec],
                        attrs: Mapping[str, Any]) -> Callable[..., None]:
    index = slice_index(tuple(inputs[0].shape), attrs)
    return lambda x, out: xp.copyto(out, x[index])


def slice_index(shape: tuple[int, ...], attrs: Mapping[str, Any]) -> tuple[slice, ...]:
    """strided_slice's selection as NumPy's basic index (a view of the input)."""
    # NOTE: a negative step that ends below index 0 needs stop None, not -1 (the last element).
    return tuple(slice(start, None if start + step * count < 0 else start + step * count, step)
                 if count else slice(0, 0) for start, step, count in slice_plan(shape, attrs))


def _host_split(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    axis, pieces = split_pieces(spec, attrs)
    return HostSplit(xp, axis, pieces)


def _host_concatenate(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                      outputs: Sequence[TensorSpec],
                      attrs: Mapping[str, Any]) -> Callable[..., None]:
    axis = concatenate_axis(inputs, attrs)
    if xp is np:
        return _HostConcat(axis, inputs)
    return lambda *arrays: xp.concatenate(arrays[:-1], axis=axis, out=arrays[-1])


# In OpenMP mode oneDNN's threads spin on the cores after each primitive, and the runtime's
# workers share the cores with them: Swin's window joins of ~300K values took 150-420 us on
# the workers and 61-353 on one thread, SegFormer's 64 MB join 10 ms against 16. Bands go to
# the workers from this many values there.
OPENMP_SERIAL_OUTPUTS = 1 << 21


def _serial_outputs() -> int:
    """Values below which a join of images is copied on the calling thread alone."""
    return OPENMP_SERIAL_OUTPUTS if team_available() else SERIAL_OUTPUTS


class _HostConcat(PreparedKernel):
    """NumPy's concatenate; 4-D arrays may be the NCHW views of NHWC bytes (runtime/layouts.py),
    copied in their memory order: SegFormer's decoder joins four NHWC maps (64 MB) for a
    oneDNN 1x1 conv that reads NHWC. Large images are copied in bands of rows on the workers."""

    def __init__(self, axis: int, inputs: Sequence[TensorSpec]) -> None:
        self.axis, self.n_inputs = axis, len(inputs)
        shape = tuple(inputs[0].shape)
        self.images = len(shape) == 4
        self.band_axis = 2 if axis != 2 else 3
        outputs = sum(size_of(spec.shape) for spec in inputs)
        length = shape[self.band_axis] if self.images else 1
        # the thread mode read once (a change of it makes the kernels again): serves asks at
        # each of a decoder's new lengths, for every KV join
        self.serial_below = _serial_outputs()
        self.chunks, self.workers = (channel_split(1, length, outputs, self.serial_below)
                                     if self.images else (1, 1))
        self.offsets = np.cumsum([0] + [spec.shape[axis] for spec in inputs]).tolist()

    def __call__(self, *arrays: Any) -> None:
        if self.workers <= 1:
            np.concatenate(arrays[:-1], axis=self.axis, out=arrays[-1])
            return
        out, length = arrays[-1], arrays[-1].shape[self.band_axis]
        lead = (slice(None),) * self.band_axis

        def item(worker: int, i: int) -> None:
            band = lead + (slice(*chunk_bounds(length, self.chunks, i)),)
            for k, x in enumerate(arrays[:-1]):
                where = [slice(None)] * 4
                where[self.band_axis] = band[-1]
                where[self.axis] = slice(self.offsets[k], self.offsets[k + 1])
                np.copyto(out[tuple(where)], x[band])
        parallel_items(self.chunks, self.workers, item)

    def any_shape(self) -> bool:
        """Serial, it is NumPy's concatenate of whatever arrays it is handed (a KV cache's
        past joined with the new token at every length)."""
        return self.workers <= 1

    def serves(self, shapes: Sequence[tuple[int, ...]]) -> bool:
        """Serial at these shapes too: a large image join is prepared on the workers."""
        out = shapes[-1]
        return not self.images or channel_split(1, out[self.band_axis], size_of(out),
                                                self.serial_below)[1] <= 1

    def channels_last_positions(self) -> tuple[int, ...]:
        return tuple(range(self.n_inputs + 1)) if self.images else ()

    def use_channels_last(self, positions: Collection[int]) -> None:
        """Nothing to change: the copies take any strides."""


def _host_pad(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
              outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    widths = pad_widths(inputs[0], attrs)
    value = float_attr("pad", attrs, "pad_value", 0.0)
    interior = tuple(slice(b, b + d) for d, (b, _) in zip(inputs[0].shape, widths))

    def run(x: Any, out: Any) -> None:
        out.fill(value)
        out[interior] = x
    return run


# -- opencl ---------------------------------------------------------------------------------------

def _cl_strided_slice(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                      outputs: Sequence[TensorSpec],
                      attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    plan = slice_plan(tuple(spec.shape), attrs)
    strides = contiguous_strides(spec.shape)
    start = sum(s * st for (s, _, count), st in zip(plan, strides) if count)
    copy = cl_strided_copy(backend, device_id, spec.dtype, outputs[0].shape,
                           [step * st for (_, step, _), st in zip(plan, strides)],
                           contiguous_strides(outputs[0].shape), "strided_slice")
    return lambda x, out: copy(x, out, start, 0)


def _cl_split(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
              outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    axis, pieces = split_pieces(spec, attrs)
    strides = contiguous_strides(spec.shape)
    copies = [(cl_strided_copy(backend, device_id, spec.dtype, out.shape, strides,
                               contiguous_strides(out.shape), "split"), start * strides[axis])
              for out, (start, _) in zip(outputs, pieces)]

    def run(x: Any, *outs: Any) -> None:
        for (copy, start), out in zip(copies, outs):
            copy(x, out, start, 0)
    return run


def _cl_concatenate(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                    outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    axis = concatenate_axis(inputs, attrs)
    out_strides = contiguous_strides(outputs[0].shape)
    copies = []
    at = 0
    for spec in inputs:
        copy = cl_strided_copy(backend, device_id, spec.dtype, spec.shape,
                               contiguous_strides(spec.shape), out_strides, "concatenate")
        copies.append((copy, at * out_strides[axis]))
        at += spec.shape[axis]

    def run(*arrays: Any) -> None:
        for (copy, start), x in zip(copies, arrays):
            copy(x, arrays[-1], 0, start)
    return run


def _cl_pad(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
            outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    import pyopencl as cl
    spec = inputs[0]
    widths = pad_widths(spec, attrs)
    pattern = np.array([float_attr("pad", attrs, "pad_value", 0.0)]).astype(spec.dtype)
    out_strides = contiguous_strides(outputs[0].shape)
    start = sum(b * st for (b, _), st in zip(widths, out_strides))
    copy = cl_strided_copy(backend, device_id, spec.dtype, spec.shape,
                           contiguous_strides(spec.shape), out_strides, "pad")
    queue = backend.queue(device_id)

    def run(x: Any, out: Any) -> None:
        if out.size == 0:
            return
        cl.enqueue_fill_buffer(queue, out.base_data, pattern, out.offset, out.nbytes)
        copy(x, out, 0, start)
    return run


# -- registration ---------------------------------------------------------------------------------

_OPS: dict[str, tuple[Callable[..., list[TensorSpec]], int | None, tuple[str, ...],
                      Callable[..., Callable[..., None]], Callable[..., Callable[..., None]]]] = {
    "concatenate": (_concatenate, None, ("axis",), _host_concatenate, _cl_concatenate),
    "split": (_split, 1, ("indices_or_sections", "axis"), _host_split, _cl_split),
    "strided_slice": (_strided_slice, 1, ("begin", "end", "strides", "axes", "slice_mode"),
                      _host_strided_slice, _cl_strided_slice),
    "pad": (_pad, 1, ("pad_width", "pad_value", "pad_mode"), _host_pad, _cl_pad),
}

for _name, (_infer, _count, _attrs, _host_make, _cl_factory) in _OPS.items():
    define_op(_name, _infer, _count, _attrs)
    kernel(_name, "cpu")(host_factory(_host_make))
    kernel(_name, "cuda")(host_factory(_host_make))
    kernel(_name, "opencl")(_cl_factory)
