"""Ops that repeat their input into a larger output: tile (ONNX Tile) and broadcast_to (Expand)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ...backends.base import Backend
from ..attrs import attr_error, int_tuple, op_error
from ..kernels.host import host_factory
from ..kernels.opencl.source import cl_strided_copy
from ..library import TensorSpec
from ..prepared import AnyShape
from ..registry import define_op, kernel
from ..shapes import broadcast_strides, contiguous_strides, one_input, size_of

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

# A larger output (8 GiB of float32) is a mistake in the attributes, not a plan.
MAX_OUTPUT_ELEMENTS = 1 << 31


def _check_size(op: str, name: str, value: Any, shape: tuple[int, ...]) -> None:
    if size_of(shape) > MAX_OUTPUT_ELEMENTS:
        raise attr_error(op, name, list(value), f"an output of at most {MAX_OUTPUT_ELEMENTS} "
                                                f"elements; it gives {shape} "
                                                f"({size_of(shape)} elements)")


def tile_plan(spec: TensorSpec, attrs: Mapping[str, Any]) -> tuple[tuple[int, ...],
                                                                    tuple[int, ...]]:
    """(input shape, reps), both padded with leading 1s to one rank, as np.tile does.

    ONNX Tile gives exactly one rep per axis; NumPy's rule accepts that and more.
    """
    reps = int_tuple("tile", attrs, "reps")
    if any(r < 0 for r in reps):
        raise attr_error("tile", "reps", list(reps), "non-negative integers")
    ndim = max(len(reps), len(spec.shape))
    shape = (1,) * (ndim - len(spec.shape)) + tuple(spec.shape)
    reps = (1,) * (ndim - len(reps)) + tuple(reps)
    _check_size("tile", "reps", reps, tuple(d * r for d, r in zip(shape, reps)))
    return shape, reps


def _tile(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("tile", inputs)
    shape, reps = tile_plan(spec, attrs)
    return [TensorSpec(tuple(d * r for d, r in zip(shape, reps)), spec.dtype)]


def broadcast_target(spec: TensorSpec, attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape attribute, checked: non-negative and a shape the input broadcasts to."""
    shape = int_tuple("broadcast_to", attrs, "shape")
    if any(d < 0 for d in shape):
        raise attr_error("broadcast_to", "shape", list(shape), "non-negative sizes")
    _check_size("broadcast_to", "shape", shape, shape)
    ok = len(shape) >= len(spec.shape) and all(
        d == t or d == 1 for d, t in zip(reversed(spec.shape), reversed(shape)))
    if not ok:
        raise op_error("broadcast_to", f"input 0 {spec} does not broadcast to shape "
                                       f"{tuple(shape)}: each input axis must equal the "
                                       "target's or be 1 (for ONNX Expand, pass the broadcast "
                                       "of both shapes)")
    return tuple(shape)


def _broadcast_to(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("broadcast_to", inputs)
    return [TensorSpec(broadcast_target(spec, attrs), spec.dtype)]


def _interleaved(shape: tuple[int, ...], reps: tuple[int, ...]) -> tuple[int, ...]:
    """The tiled output seen as (r0, d0, r1, d1, ...): rep count, then position in the input."""
    return tuple(v for d, r in zip(shape, reps) for v in (r, d))


# -- cpu / cuda -----------------------------------------------------------------------------------

def _host_tile(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
               outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    shape, reps = tile_plan(inputs[0], attrs)
    out_view = _interleaved(shape, reps)
    in_view = _interleaved(shape, (1,) * len(shape))

    def run(x: Any, out: Any) -> None:
        # NOTE: broadcasting x into a view of out copies once, with no np.tile temporary.
        xp.copyto(out.reshape(out_view), x.reshape(in_view))
    return run


def _host_broadcast_to(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                       outputs: Sequence[TensorSpec],
                       attrs: Mapping[str, Any]) -> Callable[..., None]:
    return AnyShape(lambda x, out: xp.copyto(out, x))


# -- opencl ---------------------------------------------------------------------------------------

def _cl_tile(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    shape, reps = tile_plan(inputs[0], attrs)
    src = contiguous_strides(shape)
    dst = contiguous_strides(outputs[0].shape)
    copy = cl_strided_copy(backend, device_id, inputs[0].dtype, _interleaved(shape, reps),
                           [v for s in src for v in (0, s)],
                           [v for d, o in zip(shape, dst) for v in (d * o, o)], "tile")
    return lambda x, out: copy(x, out)


def _cl_broadcast_to(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                     outputs: Sequence[TensorSpec],
                     attrs: Mapping[str, Any]) -> Callable[..., None]:
    out_shape = outputs[0].shape
    copy = cl_strided_copy(backend, device_id, inputs[0].dtype, out_shape,
                           broadcast_strides(inputs[0].shape, out_shape),
                           contiguous_strides(out_shape), "broadcast_to")
    return lambda x, out: copy(x, out)


define_op("tile", _tile, 1, ("reps",))
define_op("broadcast_to", _broadcast_to, 1, ("shape",))
for _kind, _tile_make, _bcast_make in (
        ("cpu", host_factory(_host_tile), host_factory(_host_broadcast_to)),
        ("cuda", host_factory(_host_tile), host_factory(_host_broadcast_to)),
        ("opencl", _cl_tile, _cl_broadcast_to)):
    kernel("tile", _kind)(_tile_make)
    kernel("broadcast_to", _kind)(_bcast_make)
