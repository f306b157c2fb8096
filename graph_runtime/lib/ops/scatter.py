"""scatter_elements and scatter_nd (ONNX ScatterElements / ScatterND) with indices read at run time."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..attrs import op_error, single_axis, str_attr
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import NUMERIC_DTYPES, check_dtype, size_of

SCATTER_DTYPES = NUMERIC_DTYPES + ("int8", "int16", "uint8", "uint16", "uint32", "uint64", "bool")
REDUCTIONS = ("none", "add", "mul", "max", "min")
# NOTE: ufunc.at applies duplicates one after another, in index order, as ONNX's reference does.
_AT = {"add": np.add.at, "mul": np.multiply.at, "max": np.maximum.at, "min": np.minimum.at}


def _common(op: str, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> str:
    if len(inputs) != 3:
        raise op_error(op, f"takes 3 inputs (data, indices, updates), got {len(inputs)}")
    data, indices, updates = inputs
    check_dtype(op, data, SCATTER_DTYPES)
    check_dtype(op, indices, ("int32", "int64"), "input 1 (indices)")
    if updates.dtype != data.dtype:
        raise op_error(op, f"input 2 (updates) is {updates}; expected dtype {data.dtype}")
    reduction = str_attr(op, attrs, "reduction", "none", choices=REDUCTIONS)
    if reduction != "none" and data.dtype == "bool":
        raise op_error(op, f"reduction {reduction!r} on bool data; only 'none' is supported")
    return str(reduction)


def _elements_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    op = "scatter_elements"
    _common(op, inputs, attrs)
    data, indices, updates = inputs
    single_axis(op, attrs, "axis", len(data.shape))
    if tuple(indices.shape) != tuple(updates.shape) or len(indices.shape) != len(data.shape):
        raise op_error(op, f"indices {indices} and updates {updates}: expected one shape of rank "
                           f"{len(data.shape)} (data is {data})")
    return [TensorSpec(tuple(data.shape), data.dtype)]


def _nd_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    op = "scatter_nd"
    _common(op, inputs, attrs)
    data, indices, updates = inputs
    k = indices.shape[-1] if indices.shape else -1
    want = tuple(indices.shape[:-1]) + tuple(data.shape[k:])
    if not 1 <= k <= len(data.shape) or tuple(updates.shape) != want:
        raise op_error(op, f"data {data}, indices {indices}, updates {updates}: expected "
                           "indices (..., k) with 1 <= k <= rank(data) and updates "
                           "indices.shape[:-1] + data.shape[k:]")
    return [TensorSpec(tuple(data.shape), data.dtype)]


def _wrapped(op: str, index: np.ndarray, extent: np.ndarray | int) -> np.ndarray:
    """Negative indices counted from the end; an index outside [-extent, extent) is an error."""
    index = index.astype(np.int64)
    wrapped = np.where(index < 0, index + extent, index)
    bad = (wrapped < 0) | (wrapped >= extent)
    if bad.any():
        at = tuple(int(v) for v in np.argwhere(bad)[0])
        raise op_error(op, f"index {index[at]} at indices{list(at)} is out of range for an axis "
                           f"of {np.broadcast_to(extent, index.shape)[at]}")
    return wrapped


def _apply(op: str, reduction: str, flat: np.ndarray, targets: np.ndarray,
           values: np.ndarray) -> None:
    if reduction == "none":
        flat[targets] = values
    else:
        _AT[reduction](flat, targets, values)


def _cpu_elements(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                  outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    op = "scatter_elements"
    shape = tuple(inputs[0].shape)
    axis = single_axis(op, attrs, "axis", len(shape))
    reduction = _common(op, inputs, attrs)
    coords = list(np.indices(inputs[1].shape, dtype=np.int64))

    def run(data: Any, indices: Any, updates: Any, out: Any) -> None:
        np.copyto(out, data)
        if not indices.size:
            return
        where = list(coords)
        where[axis] = _wrapped(op, np.asarray(indices), shape[axis])
        targets = np.ravel_multi_index(tuple(where), shape).reshape(-1)
        _apply(op, reduction, out.reshape(-1), targets, np.asarray(updates).reshape(-1))
    return run


def _cpu_nd(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
            outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    op = "scatter_nd"
    shape = tuple(inputs[0].shape)
    reduction = _common(op, inputs, attrs)
    k = inputs[1].shape[-1]
    dims = np.array(shape[:k], np.int64)
    rows = size_of(inputs[1].shape[:-1])
    inner = size_of(shape[k:])

    def run(data: Any, indices: Any, updates: Any, out: Any) -> None:
        np.copyto(out, data)
        if not rows:
            return
        index = _wrapped(op, np.asarray(indices).reshape(rows, k), dims)
        targets = np.ravel_multi_index(tuple(index.T), shape[:k])
        _apply(op, reduction, out.reshape(-1, inner), targets,
               np.asarray(updates).reshape(rows, inner))
    return run


define_op("scatter_elements", _elements_infer, 3, ("axis", "reduction"))
define_op("scatter_nd", _nd_infer, 3, ("reduction",))
kernel("scatter_elements", "cpu")(_cpu_elements)
kernel("scatter_nd", "cpu")(_cpu_nd)
