"""topk on every backend against a NumPy reference that breaks ties by the lower index."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec


def topk_reference(x: np.ndarray, k: int, axis: int, largest: bool) -> tuple[np.ndarray,
                                                                            np.ndarray]:
    """ONNX TopK by brute force: sort keys (value, index) with NaN as the largest value."""
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    values = np.empty(moved.shape[:-1] + (k,))
    indices = np.empty(moved.shape[:-1] + (k,), np.int64)
    for pos in np.ndindex(*moved.shape[:-1]):
        row = moved[pos]
        nan = np.isnan(row)
        # lexsort: last key first; NaN first when largest, last when smallest.
        key = np.where(nan, 0.0, -row if largest else row)
        order = np.lexsort((np.arange(row.size), key, ~nan if largest else nan))[:k]
        values[pos], indices[pos] = row[order], order
    return np.moveaxis(values, -1, axis), np.moveaxis(indices, -1, axis)


CASES = [((5, 8), 3, -1, True), ((5, 8), 8, 1, False), ((4, 6, 3), 2, 1, True),
         ((7,), 0, 0, True), ((3, 100), 10, 1, False)]


@pytest.mark.parametrize("shape,k,axis,largest", CASES)
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_topk(backend_name: str, shape, k, axis, largest, dtype, run_op, assert_close) -> None:
    rng = np.random.default_rng(sum(shape) + k)
    # Few distinct values, so ties must go to the lower index.
    x = rng.integers(-4, 5, size=shape).astype(dtype)
    values, indices = run_op(backend_name, "topk", [x], {"k": k, "axis": axis,
                                                         "largest": int(largest)})
    want_values, want_indices = topk_reference(x, k, axis, largest)
    assert_close(values, want_values, dtype)
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(indices, want_indices)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_topk_float_dtypes_and_nan(backend_name: str, dtype: str, run_op) -> None:
    x = np.array([[1.0, np.nan, 3.0, 3.0, -np.inf, np.nan], [0.5, 0.25, 2.0, -1.0, 0.0, 8.0]],
                 dtype)
    for largest in (True, False):
        values, indices = run_op(backend_name, "topk", [x], {"k": 4, "largest": largest})
        want_values, want_indices = topk_reference(x, 4, -1, largest)
        np.testing.assert_array_equal(indices, want_indices)
        np.testing.assert_array_equal(values, want_values.astype(dtype))


def test_topk_attr_errors(make_function) -> None:
    spec = TensorSpec((2, 5), "float32")
    with pytest.raises(LibraryError, match=r"topk: attribute 'k' = 6: expected 0 <= k <= 5, the "
                                           r"length of axis 1 of input 0 \(2, 5\) float32"):
        make_function("topk").infer([spec], {"k": 6})
    with pytest.raises(LibraryError, match=r"topk: attribute 'k' = -1"):
        make_function("topk").infer([spec], {"k": -1, "axis": 0})
    with pytest.raises(LibraryError, match=r"topk: missing required attribute 'k'"):
        make_function("topk").infer([spec], {})
    with pytest.raises(LibraryError, match=r"topk: attribute 'axis' = 2: expected an axis"):
        make_function("topk").infer([spec], {"k": 1, "axis": 2})
    with pytest.raises(LibraryError, match=r"topk: input 0 has shape \(\) \(rank 0\)"):
        make_function("topk").infer([TensorSpec((), "float32")], {"k": 0})
    with pytest.raises(LibraryError, match=r"topk: input 0 has dtype bool"):
        make_function("topk").infer([TensorSpec((3,), "bool")], {"k": 1})


def test_topk_declares_two_outputs(make_function) -> None:
    outs = make_function("topk").infer([TensorSpec((2, 5), "float16")], {"k": 2, "axis": 0})
    assert outs == [TensorSpec((2, 5), "float16"), TensorSpec((2, 5), "int64")]
