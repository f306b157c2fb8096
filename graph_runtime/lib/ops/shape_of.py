"""shape_of (ONNX Shape as data): an entry's dims as int64; dim_values: the bound dims' values."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ...errors import GraphRuntimeError
from ...graph.symbolic import check_dim, evaluate_shape, names_in
from ..attrs import dtype_attr, int_attr, int_tuple, op_error, short_repr
from ..library import TensorSpec
from ..prepared import PreparedKernel
from ..registry import define_op, kernel
from ..shapes import one_input


def shape_of_dims(spec: TensorSpec, attrs: Mapping[str, Any]) -> np.ndarray:
    """The dims ONNX's Shape gives for spec (start/end as Python slices, clamped)."""
    start = int_attr("shape_of", attrs, "start", 0)
    end = int_attr("shape_of", attrs, "end", None)
    return np.array(spec.shape, dtype=np.int64)[start:end]


def _shape_of(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("shape_of", inputs)
    return [TensorSpec((len(shape_of_dims(spec, attrs)),), "int64")]


def _any_shape_of(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                  outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    # NOTE: a module is specialised for one set of shapes, so the dims are known when the kernel
    # is prepared; each run writes those few bytes (the input itself is never read).
    dims = shape_of_dims(inputs[0], attrs)
    return lambda x, out: backend.from_host(dims, out)


define_op("shape_of", _shape_of, 1, ("start", "end"))
for _backend in ("cpu", "cuda", "opencl"):
    kernel("shape_of", _backend)(_any_shape_of)


def _dim_values_attrs(attrs: Mapping[str, Any]) -> tuple[list[Any], tuple[int, ...], str]:
    values = attrs.get("values")
    shape = int_tuple("dim_values", attrs, "shape")
    dtype = dtype_attr("dim_values", attrs, "dtype", "int64")
    read = "at" in attrs  # items may be expressions over the dims its inputs' shapes hold
    if not isinstance(values, (list, tuple)) or not all(
            isinstance(v, int) and not isinstance(v, bool) or read and isinstance(v, str)
            for v in values):
        raise op_error("dim_values", f"values {short_repr(values)}; expected a list of ints "
                                     "(or {\"dim\": ...} items, bound per shape; with `at`, "
                                     "expressions such as \"past+seq\")")
    if math.prod(shape) != len(values) or dtype not in ("int32", "int64"):
        raise op_error("dim_values", f"{len(values)} values of dtype {dtype} for shape "
                                     f"{list(shape)}; expected as many values as the shape "
                                     "holds, int32 or int64")
    return list(values), tuple(shape), dtype


def dims_at(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any], values: Sequence[Any],
            op: str = "dim_values") -> list[tuple[str, int, int]]:
    """The `at` attr as (name, input, axis) items, checked against the inputs and against the
    names the values' expressions read (op's own: dim_values, index_expr)."""
    at = attrs.get("at")
    if not isinstance(at, (list, tuple)) or not all(
            isinstance(a, (list, tuple)) and len(a) == 3 and isinstance(a[0], str)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in a[1:]) for a in at):
        raise op_error(op, f"at {short_repr(at)}; expected [name, input, axis] items")
    items = [(str(a[0]), int(a[1]), int(a[2])) for a in at]
    for name, pos, axis in items:
        if not 0 <= pos < len(inputs) or not 0 <= axis < len(inputs[pos].shape):
            raise op_error(op, f"at: {name!r} is read from input {pos} axis {axis}, but it has "
                               f"{len(inputs)} inputs of shapes "
                               f"{[list(i.shape) for i in inputs]}")
    bound = {name for name, _, _ in items}
    for value in values:
        if isinstance(value, str):
            problem = check_dim(value)
            missing = [] if problem else [n for n in names_in(value) if n not in bound]
            if problem or missing:
                raise op_error(op, f"value {value!r}: " + (
                    problem or f"reads {', '.join(missing)}, which `at` does not place"))
    return items


def _dim_values(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    values, shape, dtype = _dim_values_attrs(attrs)
    if "at" in attrs:
        dims_at(inputs, attrs, values)
    else:
        one_input("dim_values", inputs)
    return [TensorSpec(shape, dtype)]


class DimsFromShapes(PreparedKernel):
    """dim_values with `at`: each run evaluates its values from its inputs' shapes, so one
    kernel serves every value of the dims (a decoder's past length at each step)."""

    def __init__(self, backend: Backend, values: Sequence[Any], shape: tuple[int, ...],
                 dtype: str, at: Sequence[tuple[str, int, int]], ranks: Sequence[int]) -> None:
        self.backend = backend
        self.values = tuple(values)  # evaluate_shape compiles them once
        self.shape, self.dtype = shape, dtype
        self.at = list(at)
        self.ranks = list(ranks)

    def any_shape(self) -> bool:
        return True

    def shape_free(self) -> bool:
        return True

    def __call__(self, *arrays: Any) -> None:
        inputs, out = arrays[:-1], arrays[-1]
        for x, rank in zip(inputs, self.ranks):
            if x.ndim != rank:  # a flattened view (flatten_data) holds no dims to read
                raise GraphRuntimeError(f"dim_values: an input of rank {x.ndim} where its dims "
                                        f"are read at rank {rank}; flatten_data must be off")
        env = {name: int(inputs[pos].shape[axis]) for name, pos, axis in self.at}
        data = np.array(evaluate_shape(self.values, env), dtype=self.dtype)
        self.backend.from_host(data.reshape(self.shape), out)


def _any_dim_values(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                    outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]
                    ) -> Callable[..., None]:
    values, shape, dtype = _dim_values_attrs(attrs)
    if "at" in attrs:
        return DimsFromShapes(backend, values, shape, dtype, dims_at(inputs, attrs, values),
                              [len(i.shape) for i in inputs])
    # NOTE: the values are the symbolic dims' values for this specialisation (the importer's
    # shape-valued tensors read as data); the input only orders the node after the binding.
    data = np.array(values, dtype=dtype).reshape(shape)
    return lambda x, out: backend.from_host(data, out)


# dim_values (ONNX Shape arithmetic read as data): int values given as attrs, `{"dim": ...}`
# items evaluated from the bound dims (lib/symbolic_chain.py); with `at` ([name, input, axis]
# items), expressions evaluated from its inputs' shapes at each run (DimsFromShapes).
define_op("dim_values", _dim_values, None, ("values", "shape", "dtype", "at"))
for _backend in ("cpu", "cuda", "opencl"):
    kernel("dim_values", _backend)(_any_dim_values)
