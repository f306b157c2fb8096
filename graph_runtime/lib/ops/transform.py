"""Reshape-family ops and transpose: NumPy/CuPy copies, OpenCL buffer and strided copies."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ...backends.base import Backend
from ..attrs import attr_error, axis_attr, bool_attr, int_attr, int_tuple, normalize_axis, op_error
from ..kernels.cpu.flatten import Flatten
from ..kernels.host import host_factory
from ..kernels.opencl.source import cl_strided_copy
from ..library import TensorSpec
from ..prepared import ReshapeCopy
from ..registry import define_op, kernel
from ..shapes import contiguous_strides, one_input, size_of

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

# -- shape rules ----------------------------------------------------------------------------------

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


def _reshape(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("reshape", inputs)
    newshape = int_tuple("reshape", attrs, "newshape")
    allowzero = bool_attr("reshape", attrs, "allowzero", False)
    return [TensorSpec(reshape_shape(tuple(spec.shape), newshape, allowzero), spec.dtype)]


def _batch_flatten(op: str) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        spec = one_input(op, inputs)
        if not spec.shape:
            raise op_error(op, f"input 0 {spec} is a scalar; expected rank >= 1")
        return [TensorSpec((spec.shape[0], size_of(spec.shape[1:])), spec.dtype)]
    return infer


def _expand_dims(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("expand_dims", inputs)
    ndim = len(spec.shape)
    axis = normalize_axis("expand_dims", int_attr("expand_dims", attrs, "axis"), ndim + 1)
    count = int_attr("expand_dims", attrs, "num_newaxis", 1)
    if count < 0:
        raise attr_error("expand_dims", "num_newaxis", count, "a non-negative integer")
    shape = tuple(spec.shape[:axis]) + (1,) * count + tuple(spec.shape[axis:])
    return [TensorSpec(shape, spec.dtype)]


def _squeeze(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("squeeze", inputs)
    axes = axis_attr("squeeze", attrs, "axis", len(spec.shape))
    if axes is None:
        axes = tuple(i for i, d in enumerate(spec.shape) if d == 1)
    for a in axes:
        if spec.shape[a] != 1:
            raise op_error("squeeze", f"axis {a} of input 0 {spec} has size {spec.shape[a]}, "
                                      "not 1")
    return [TensorSpec(tuple(d for i, d in enumerate(spec.shape) if i not in axes), spec.dtype)]


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
    spec = one_input("transpose", inputs)
    axes = transpose_axes(spec, attrs)
    return [TensorSpec(tuple(spec.shape[a] for a in axes), spec.dtype)]


# -- cpu / cuda -----------------------------------------------------------------------------------

def _host_reshape(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                  outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    # the output's shape read per call: a symbolic module keeps it for every length
    return ReshapeCopy(lambda x, out: xp.copyto(out, x.reshape(out.shape)))


def _host_transpose(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                    outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    axes = transpose_axes(inputs[0], attrs)
    return lambda x, out: xp.copyto(out, xp.transpose(x, axes))


# -- opencl ---------------------------------------------------------------------------------------

def _cl_reshape(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    shape = tuple(outputs[0].shape)

    def run(x: Any, out: Any) -> None:
        if out.size == 0:
            return
        if x.base_data.int_ptr == out.base_data.int_ptr and x.offset == out.offset:
            return  # the planner let input and output share storage: nothing to move
        backend.copy(x.reshape(shape), out)
    return run


def _cl_transpose(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                  outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    axes = transpose_axes(spec, attrs)
    strides = contiguous_strides(spec.shape)
    out_shape = outputs[0].shape
    return cl_strided_copy(backend, device_id, spec.dtype, out_shape,
                           [strides[a] for a in axes], contiguous_strides(out_shape), "transpose")


# -- registration ---------------------------------------------------------------------------------

_OPS: dict[str, tuple[Callable[..., list[TensorSpec]], tuple[str, ...],
                      Callable[..., Callable[..., None]], Callable[..., Callable[..., None]]]] = {
    "reshape": (_reshape, ("newshape", "allowzero"), _host_reshape, _cl_reshape),
    "batch_flatten": (_batch_flatten("batch_flatten"), (), _host_reshape, _cl_reshape),
    "flatten": (_batch_flatten("flatten"), (), _host_reshape, _cl_reshape),
    "expand_dims": (_expand_dims, ("axis", "num_newaxis"), _host_reshape, _cl_reshape),
    "squeeze": (_squeeze, ("axis",), _host_reshape, _cl_reshape),
    "transpose": (_transpose, ("axes",), _host_transpose, _cl_transpose),
}

def _cpu_flatten(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    """A Flatten kernel (it may read NHWC, and run() may skip it) for a batch flatten: also a
    reshape to (N, rest), as PyTorch's flatten(1) before a classifier imports; else a copy."""
    shape, out = tuple(inputs[0].shape), tuple(outputs[0].shape)
    if len(shape) >= 2 and out == (shape[0], size_of(shape[1:])):
        return Flatten(shape, inputs[0].dtype)
    return host_factory(_host_reshape)(backend, device_id, inputs, outputs, attrs)


_CPU_FLATTENS = ("batch_flatten", "flatten", "reshape")  # their CPU kernel is _cpu_flatten

for _name, (_infer, _attrs, _host_make, _cl_factory) in _OPS.items():
    define_op(_name, _infer, 1, _attrs)
    kernel(_name, "cpu")(_cpu_flatten if _name in _CPU_FLATTENS else host_factory(_host_make))
    kernel(_name, "cuda")(host_factory(_host_make))
    kernel(_name, "opencl")(_cl_factory)
