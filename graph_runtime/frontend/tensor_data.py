"""ONNX tensors to NumPy arrays, checked: element type, dims, data length, sparse indices, size."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DLPACK_CODES, EXTENDED_DTYPES
from .ir import RUNTIME_DTYPES, Unsupported, check_const_bytes, check_rank

# The TensorProto field holding each element type's values when raw_data is not used.
_TYPED_FIELD = {"float32": "float_data", "float64": "double_data", "int64": "int64_data",
                "uint32": "uint64_data", "uint64": "uint64_data", "int32": "int32_data",
                "int16": "int32_data", "int8": "int32_data", "uint8": "int32_data",
                "uint16": "int32_data", "bool": "int32_data", "float16": "int32_data",
                **{name: "int32_data" for name in EXTENDED_DTYPES}}


def _packed_count(count: int, dtype: np.dtype) -> int:
    """How many bytes (or int32_data values) ONNX packs count elements of dtype into."""
    bits = DLPACK_CODES.get(str(dtype), (0, 8 * dtype.itemsize))[1]
    return -(-count * bits // 8) if bits < 8 else count


def elem_dtype(data_type: int, what: str) -> np.dtype:
    """The NumPy dtype of an ONNX element type the runtime holds; refuses any other."""
    from onnx import TensorProto, helper
    known = data_type in TensorProto.DataType.values()
    name = TensorProto.DataType.Name(data_type) if known else str(data_type)
    dtype = None
    if known and data_type != TensorProto.UNDEFINED:
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(data_type))
        except (KeyError, TypeError, ValueError):
            dtype = None
    if dtype is None or str(dtype) not in RUNTIME_DTYPES:
        raise Unsupported(f"{what}: element type {name} is not supported; supported: "
                          + ", ".join(RUNTIME_DTYPES))
    return dtype


def element_count(dims: Sequence[int], what: str) -> int:
    """The product of dims (Python ints, no overflow); refuses a negative dim or too many."""
    check_rank(dims, what)
    for i, d in enumerate(dims):
        if d < 0:
            raise Unsupported(f"{what}: dim {i} is {d}; expected a size >= 0")
    return math.prod(int(d) for d in dims)


def declared_bytes(tensor: Any, what: str) -> int:
    """How many bytes a tensor's dims and element type say its data holds."""
    dtype = elem_dtype(tensor.data_type, what)
    return element_count(list(tensor.dims), what) * dtype.itemsize


def to_array(tensor: Any, what: str) -> np.ndarray:
    """The tensor's values, after checking its data holds exactly dims x element type."""
    from onnx import TensorProto, numpy_helper
    dtype = elem_dtype(tensor.data_type, what)
    if tensor.data_location == TensorProto.EXTERNAL:
        raise Unsupported(f"{what}: its data is still in an external file (not loaded)")
    check_stored(tensor, dtype, what)
    try:
        return np.asarray(numpy_helper.to_array(tensor), dtype=dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise Unsupported(f"{what}: cannot read its values: {e}") from None


def check_stored(tensor: Any, dtype: np.dtype, what: str) -> None:
    """Refuse a tensor whose stored values are not exactly what its dims x dtype need."""
    count = element_count(list(tensor.dims), what)
    if tensor.HasField("raw_data"):
        held = len(tensor.raw_data)
        need = _packed_count(count, dtype) * (dtype.itemsize if dtype.itemsize > 1 else 1)
        if held != need:
            raise Unsupported(f"{what}: dims {list(tensor.dims)} of {dtype} need {need} bytes of "
                              f"raw_data, got {held}")
    else:
        field = _TYPED_FIELD[str(dtype)]
        held = len(getattr(tensor, field))
        if held != _packed_count(count, dtype):
            raise Unsupported(f"{what}: dims {list(tensor.dims)} need "
                              f"{_packed_count(count, dtype)} values in "
                              f"{field}, got {held}")
        for other in set(_TYPED_FIELD.values()) - {field}:
            if len(getattr(tensor, other)):
                raise Unsupported(f"{what}: a {dtype} tensor holds values in {other}; "
                                  f"expected {field}")


def sparse_to_dense(sparse: Any, what: str) -> np.ndarray:
    """A SparseTensorProto as a dense array; the indices are checked against its dims."""
    dims = [int(d) for d in sparse.dims]
    values = to_array(sparse.values, f"{what} values")
    indices = to_array(sparse.indices, f"{what} indices")
    dense_shape = tuple(dims)
    count = element_count(dims, what)
    check_const_bytes(dense_shape, values.dtype, f"{what} (dense)")
    if values.ndim != 1:
        raise Unsupported(f"{what}: values must be 1-D, got shape {values.shape}")
    nnz = values.shape[0]
    if indices.dtype != np.int64:
        raise Unsupported(f"{what}: indices must be int64, got {indices.dtype}")
    if indices.shape == (nnz,):
        linear = indices
    elif indices.shape == (nnz, len(dims)):
        if np.any(indices < 0) or np.any(indices >= np.array(dims, np.int64)):
            raise Unsupported(f"{what}: an index lies outside dims {dims}")
        linear = np.ravel_multi_index(tuple(indices.T), dense_shape) if nnz else indices[:, 0]
    else:
        raise Unsupported(f"{what}: indices of shape {indices.shape}; expected ({nnz},) or "
                          f"({nnz}, {len(dims)}) for {nnz} values and dims {dims}")
    if np.any(linear < 0) or np.any(linear >= count):
        raise Unsupported(f"{what}: an index lies outside the {count} elements of dims {dims}")
    dense = np.zeros(count, values.dtype)
    dense[linear] = values
    return dense.reshape(dense_shape)
