"""Data-movement ops (reshape ... take): NumPy/CuPy copies and OpenCL strided-copy kernels."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..module import TensorSpec
from ..registry import define_op, kernel
from ._common import (ClKernel, array_module, attr_error, axis_attr, bool_attr, check_dtype,
                      check_num_inputs, check_rank, check_same_dtype, cl_param, cl_pointer,
                      cl_strided_copy, contiguous_strides, float_attr, host_kernel,
                      int_attr, int_tuple, normalize_axis, op_error, parse_value, single_axis,
                      size_of, str_attr)

Factory = Callable[..., Callable[..., None]]
INDEX_DTYPES = ("int32", "int64")


# -- static shape rules ---------------------------------------------------------------------------

def reshape_shape(shape: tuple[int, ...], newshape: tuple[int, ...],
                  allowzero: bool = False) -> tuple[int, ...]:
    """Relay's reshape: 0 copies a dim, -1 infers one, -2 copies the rest, -3 merges two dims,
    -4 splits one dim into the next two values (one of which may be -1)."""
    out: list[int] = []
    infer_at = None
    i = 0
    k = 0
    while k < len(newshape):
        v = newshape[k]
        if v == 0 and not allowzero:
            _need(shape, i, 1, newshape)
            out.append(shape[i])
        elif v == -1:
            if infer_at is not None:
                raise attr_error("reshape", "newshape", list(newshape), "at most one -1")
            infer_at = len(out)
            out.append(1)
        elif v == -2:
            out.extend(shape[i:])
            i = len(shape)
        elif v == -3:
            _need(shape, i, 2, newshape)
            out.append(shape[i] * shape[i + 1])
            i += 1
        elif v == -4:
            _need(shape, i, 1, newshape)
            if k + 2 >= len(newshape):
                raise attr_error("reshape", "newshape", list(newshape), "two values after -4")
            a, b = newshape[k + 1], newshape[k + 2]
            if a == -1 and b > 0:
                a = shape[i] // b
            elif b == -1 and a > 0:
                b = shape[i] // a
            if a < 0 or b < 0 or a * b != shape[i]:
                raise op_error("reshape", f"newshape {list(newshape)}: -4 cannot split axis {i} "
                                          f"of size {shape[i]} into ({a}, {b})")
            out += [a, b]
            k += 2
        elif v < -4:
            raise attr_error("reshape", "newshape", list(newshape), "entries >= -4")
        else:
            out.append(v)
        i += 1
        k += 1
    total = size_of(shape)
    if infer_at is not None:
        rest = size_of(out[:infer_at] + out[infer_at + 1:])
        if rest == 0 or total % rest:
            raise op_error("reshape", f"newshape {list(newshape)}: cannot infer -1 for input "
                                      f"shape {shape} ({total} elements)")
        out[infer_at] = total // rest
    if size_of(out) != total:
        raise op_error("reshape", f"newshape {list(newshape)} gives {tuple(out)} with "
                                  f"{size_of(out)} elements but the input {shape} has {total}")
    return tuple(out)


def _need(shape: tuple[int, ...], i: int, count: int, newshape: tuple[int, ...]) -> None:
    if i + count > len(shape):
        raise op_error("reshape", f"newshape {list(newshape)} refers to input axis "
                                  f"{i + count - 1}, but the input shape {shape} has rank "
                                  f"{len(shape)}")


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


# -- infer ----------------------------------------------------------------------------------------

def _one(op: str, inputs: Sequence[TensorSpec]) -> TensorSpec:
    check_num_inputs(op, inputs, 1)
    return inputs[0]


def _reshape(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = _one("reshape", inputs)
    newshape = int_tuple("reshape", attrs, "newshape")
    allowzero = bool_attr("reshape", attrs, "allowzero", False)
    return [TensorSpec(reshape_shape(tuple(spec.shape), newshape, allowzero), spec.dtype)]


def _batch_flatten(op: str) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        spec = _one(op, inputs)
        if not spec.shape:
            raise op_error(op, f"input 0 {spec} is a scalar; expected rank >= 1")
        return [TensorSpec((spec.shape[0], size_of(spec.shape[1:])), spec.dtype)]
    return infer


def transpose_axes(spec: TensorSpec, attrs: Mapping[str, Any]) -> tuple[int, ...]:
    ndim = len(spec.shape)
    axes = int_tuple("transpose", attrs, "axes", None, None)
    if axes is None:
        return tuple(reversed(range(ndim)))
    if len(axes) != ndim:
        raise op_error("transpose", f"axes {axes} has {len(axes)} entries but the input has "
                                    f"rank {ndim}")
    norm = tuple(normalize_axis("transpose", a, ndim, "axes") for a in axes)
    if sorted(norm) != list(range(ndim)):
        raise attr_error("transpose", "axes", list(axes), f"a permutation of 0..{ndim - 1}")
    return norm


def _transpose(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = _one("transpose", inputs)
    axes = transpose_axes(spec, attrs)
    return [TensorSpec(tuple(spec.shape[a] for a in axes), spec.dtype)]


def _concatenate(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    if not inputs:
        raise op_error("concatenate", "needs at least one input")
    dtype = check_same_dtype("concatenate", inputs)
    first = inputs[0]
    if not first.shape:
        raise op_error("concatenate", "input 0 is a scalar; expected rank >= 1")
    axis = single_axis("concatenate", attrs, "axis", len(first.shape), 0)
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


def _split(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = _one("split", inputs)
    check_rank("split", spec, range(1, 33))
    axis = single_axis("split", attrs, "axis", len(spec.shape), 0)
    pieces = split_plan(spec.shape[axis], parse_value(attrs.get("indices_or_sections")))
    outs = []
    for _, count in pieces:
        shape = list(spec.shape)
        shape[axis] = count
        outs.append(TensorSpec(tuple(shape), spec.dtype))
    return outs


def _strided_slice(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = _one("strided_slice", inputs)
    plan = slice_plan(tuple(spec.shape), attrs)
    return [TensorSpec(tuple(count for _, _, count in plan), spec.dtype)]


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
    spec = _one("pad", inputs)
    widths = pad_widths(spec, attrs)
    float_attr("pad", attrs, "pad_value", 0.0)
    str_attr("pad", attrs, "pad_mode", "constant", ("constant",))
    shape = tuple(d + b + a for d, (b, a) in zip(spec.shape, widths))
    return [TensorSpec(shape, spec.dtype)]


def take_axis(spec: TensorSpec, attrs: Mapping[str, Any]) -> int | None:
    if parse_value(attrs.get("axis")) is None:
        return None
    return single_axis("take", attrs, "axis", len(spec.shape))


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
    extent = size_of(data.shape) if axis is None else data.shape[axis]
    shape = outer + tuple(indices.shape) + inner
    if extent == 0 and size_of(shape) > 0:
        raise op_error("take", f"cannot take from input 0 {data}: axis {axis} is empty")
    return [TensorSpec(shape, data.dtype)]


def _expand_dims(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = _one("expand_dims", inputs)
    ndim = len(spec.shape)
    axis = normalize_axis("expand_dims", int_attr("expand_dims", attrs, "axis"), ndim + 1)
    count = int_attr("expand_dims", attrs, "num_newaxis", 1)
    if count < 0:
        raise attr_error("expand_dims", "num_newaxis", count, "a non-negative integer")
    shape = tuple(spec.shape[:axis]) + (1,) * count + tuple(spec.shape[axis:])
    return [TensorSpec(shape, spec.dtype)]


def _squeeze(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = _one("squeeze", inputs)
    axes = axis_attr("squeeze", attrs, "axis", len(spec.shape))
    if axes is None:
        axes = tuple(i for i, d in enumerate(spec.shape) if d == 1)
    for a in axes:
        if spec.shape[a] != 1:
            raise op_error("squeeze", f"axis {a} of input 0 {spec} has size {spec.shape[a]}, "
                                      "not 1")
    return [TensorSpec(tuple(d for i, d in enumerate(spec.shape) if i not in axes), spec.dtype)]


# -- cpu / cuda -----------------------------------------------------------------------------------

def _host(make: Callable[..., Callable[..., None]]) -> Factory:
    """A factory calling make(xp, backend, device_id, inputs, outputs, attrs) -> run."""
    def factory(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        run = make(array_module(backend), backend, device_id, inputs, outputs, attrs)
        return host_kernel(backend, device_id, run)
    return factory


def _host_reshape(xp: Any, backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                  outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    shape = tuple(outputs[0].shape)
    return lambda x, out: xp.copyto(out, x.reshape(shape))


def _host_transpose(xp: Any, backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                    outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    axes = transpose_axes(inputs[0], attrs)
    return lambda x, out: xp.copyto(out, xp.transpose(x, axes))


def _host_concatenate(xp: Any, backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                      outputs: Sequence[TensorSpec],
                      attrs: Mapping[str, Any]) -> Callable[..., None]:
    axis = single_axis("concatenate", attrs, "axis", len(inputs[0].shape), 0)
    return lambda *arrays: xp.concatenate(arrays[:-1], axis=axis, out=arrays[-1])


def _host_split(xp: Any, backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    axis = single_axis("split", attrs, "axis", len(spec.shape), 0)
    pieces = split_plan(spec.shape[axis], parse_value(attrs.get("indices_or_sections")))
    index = [(slice(None),) * axis + (slice(start, start + count),) for start, count in pieces]

    def run(x: Any, *outs: Any) -> None:
        for out, where in zip(outs, index):
            xp.copyto(out, x[where])
    return run


def _host_strided_slice(xp: Any, backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                        outputs: Sequence[TensorSpec],
                        attrs: Mapping[str, Any]) -> Callable[..., None]:
    plan = slice_plan(tuple(inputs[0].shape), attrs)
    # NOTE: a negative step that ends below index 0 needs stop None, not -1 (the last element).
    index = tuple(slice(start, None if start + step * count < 0 else start + step * count, step)
                  if count else slice(0, 0) for start, step, count in plan)
    return lambda x, out: xp.copyto(out, x[index])


def _host_pad(xp: Any, backend: Any, device_id: int, inputs: Sequence[TensorSpec],
              outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    widths = pad_widths(inputs[0], attrs)
    value = float_attr("pad", attrs, "pad_value", 0.0)
    interior = tuple(slice(b, b + d) for d, (b, _) in zip(inputs[0].shape, widths))

    def run(x: Any, out: Any) -> None:
        out.fill(value)
        out[interior] = x
    return run


def _host_take(xp: Any, backend: Any, device_id: int, inputs: Sequence[TensorSpec],
               outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    data, indices = inputs
    axis = take_axis(data, attrs)
    mode = str_attr("take", attrs, "mode", "clip")
    extent = size_of(data.shape) if axis is None else data.shape[axis]
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


# -- opencl ---------------------------------------------------------------------------------------

def _cl(make: Callable[..., Callable[..., None]]) -> Factory:
    def factory(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        return make(backend, device_id, inputs, outputs, attrs)
    return factory


def _cl_reshape(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    shape = tuple(outputs[0].shape)

    def run(x: Any, out: Any) -> None:
        if out.size == 0:
            return
        if x.base_data.int_ptr == out.base_data.int_ptr and x.offset == out.offset:
            return  # the planner let input and output share storage: nothing to move
        backend.copy(x.reshape(shape), out)
    return run


def _cl_transpose(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                  outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    axes = transpose_axes(spec, attrs)
    strides = contiguous_strides(spec.shape)
    out_shape = outputs[0].shape
    return cl_strided_copy(backend, device_id, spec.dtype, out_shape,
                           [strides[a] for a in axes], contiguous_strides(out_shape), "transpose")


def _cl_strided_slice(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
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


def _cl_concatenate(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                    outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    axis = single_axis("concatenate", attrs, "axis", len(inputs[0].shape), 0)
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


def _cl_split(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
              outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    axis = single_axis("split", attrs, "axis", len(spec.shape), 0)
    pieces = split_plan(spec.shape[axis], parse_value(attrs.get("indices_or_sections")))
    strides = contiguous_strides(spec.shape)
    copies = [(cl_strided_copy(backend, device_id, spec.dtype, out.shape, strides,
                               contiguous_strides(out.shape), "split"), start * strides[axis])
              for out, (start, _) in zip(outputs, pieces)]

    def run(x: Any, *outs: Any) -> None:
        for (copy, start), out in zip(copies, outs):
            copy(x, out, start, 0)
    return run


def _cl_pad(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
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


def _cl_take(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    data, indices = inputs
    axis = take_axis(data, attrs)
    wrap = str_attr("take", attrs, "mode", "clip") == "wrap"
    extent = size_of(data.shape) if axis is None else data.shape[axis]
    inner = 1 if axis is None else size_of(data.shape[axis + 1:])
    store = {1: "uint8", 2: "int16", 4: "uint32", 8: "uint64"}[np.dtype(data.dtype).itemsize]
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


# -- registration ---------------------------------------------------------------------------------

_RESHAPES = ("reshape", "batch_flatten", "flatten", "expand_dims", "squeeze")
_OPS: dict[str, tuple[Callable[..., list[TensorSpec]], int | None, tuple[str, ...],
                      Callable[..., Callable[..., None]], Callable[..., Callable[..., None]]]] = {
    "reshape": (_reshape, 1, ("newshape", "allowzero"), _host_reshape, _cl_reshape),
    "batch_flatten": (_batch_flatten("batch_flatten"), 1, (), _host_reshape, _cl_reshape),
    "flatten": (_batch_flatten("flatten"), 1, (), _host_reshape, _cl_reshape),
    "expand_dims": (_expand_dims, 1, ("axis", "num_newaxis"), _host_reshape, _cl_reshape),
    "squeeze": (_squeeze, 1, ("axis",), _host_reshape, _cl_reshape),
    "transpose": (_transpose, 1, ("axes",), _host_transpose, _cl_transpose),
    "concatenate": (_concatenate, None, ("axis",), _host_concatenate, _cl_concatenate),
    "split": (_split, 1, ("indices_or_sections", "axis"), _host_split, _cl_split),
    "strided_slice": (_strided_slice, 1, ("begin", "end", "strides", "axes", "slice_mode"),
                      _host_strided_slice, _cl_strided_slice),
    "pad": (_pad, 1, ("pad_width", "pad_value", "pad_mode"), _host_pad, _cl_pad),
    "take": (_take, 2, ("axis", "mode", "batch_dims"), _host_take, _cl_take),
}

for _name, (_infer, _count, _attrs, _host_make, _cl_make) in _OPS.items():
    define_op(_name, _infer, _count, _attrs)
    kernel(_name, "cpu")(_host(_host_make))
    kernel(_name, "cuda")(_host(_host_make))
    kernel(_name, "opencl")(_cl(_cl_make))
