"""shape_of (ONNX Shape as data): an entry's dims as int64; dim_values: the bound dims' values."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import dtype_attr, int_attr, int_tuple, op_error, short_repr
from ..library import TensorSpec
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


def _dim_values_attrs(attrs: Mapping[str, Any]) -> tuple[list[int], tuple[int, ...], str]:
    values = attrs.get("values")
    shape = int_tuple("dim_values", attrs, "shape")
    dtype = dtype_attr("dim_values", attrs, "dtype", "int64")
    if not isinstance(values, (list, tuple)) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise op_error("dim_values", f"values {short_repr(values)}; expected a list of ints "
                                     "(or {\"dim\": ...} items, bound per shape)")
    if math.prod(shape) != len(values) or dtype not in ("int32", "int64"):
        raise op_error("dim_values", f"{len(values)} values of dtype {dtype} for shape "
                                     f"{list(shape)}; expected as many values as the shape "
                                     "holds, int32 or int64")
    return list(values), tuple(shape), dtype


def _dim_values(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    one_input("dim_values", inputs)
    _, shape, dtype = _dim_values_attrs(attrs)
    return [TensorSpec(shape, dtype)]


def _any_dim_values(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                    outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]
                    ) -> Callable[..., None]:
    # NOTE: the values are the symbolic dims' values for this specialisation (the importer's
    # shape-valued tensors read as data); the input only orders the node after the binding.
    values, shape, dtype = _dim_values_attrs(attrs)
    data = np.array(values, dtype=dtype).reshape(shape)
    return lambda x, out: backend.from_host(data, out)


# dim_values (ONNX Shape arithmetic read as data): int values given as attrs, `{"dim": ...}`
# items evaluated from the bound dims (lib/symbolic_chain.py).
define_op("dim_values", _dim_values, 1, ("values", "shape", "dtype"))
for _backend in ("cpu", "cuda", "opencl"):
    kernel("dim_values", _backend)(_any_dim_values)
