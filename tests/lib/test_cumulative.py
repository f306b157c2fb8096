"""cumsum on every backend against float64 NumPy references of ONNX CumSum."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec


def cumsum_reference(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """Each output sums the inputs before it (exclusive) or up to it, from the end if reverse."""
    x64 = np.moveaxis(x.astype(np.float64), axis, -1)
    out = np.zeros_like(x64)
    length = x64.shape[-1]
    for i in range(length):
        span = range(i, length) if reverse else range(i + 1)
        picked = [j for j in span if not (exclusive and j == i)]
        out[..., i] = x64[..., picked].sum(axis=-1)
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_cumsum(backend_name: str, exclusive, reverse, dtype, run_op, random_array,
                assert_close) -> None:
    for axis, shape in ((1, (3, 5, 2)), (-1, (4, 7)), (0, (6,))):
        x = random_array(shape, dtype, -5, 5, seed=len(shape))
        attrs = {"axis": axis, "exclusive": int(exclusive), "reverse": int(reverse)}
        (got,) = run_op(backend_name, "cumsum", [x], attrs)
        assert_close(got, cumsum_reference(x, axis, exclusive, reverse).astype(
            np.float64 if dtype == "float32" else dtype), dtype)


@pytest.mark.parametrize("dtype", ["float16", "float64", "int64"])
def test_cumsum_dtypes(backend_name: str, dtype: str, run_op, random_array,
                       assert_close) -> None:
    x = random_array((2, 9), dtype, -3, 3, seed=4)
    (got,) = run_op(backend_name, "cumsum", [x], {"axis": 1, "exclusive": 1})
    want = cumsum_reference(x, 1, True, False)
    assert_close(got, want.astype(dtype) if dtype == "int64" else want, dtype)


def test_cumsum_zero_size(backend_name: str, run_op) -> None:
    for shape in ((3, 0), (0, 4)):
        (got,) = run_op(backend_name, "cumsum", [np.zeros(shape, np.float32)], {"axis": 1})
        assert got.shape == shape


def test_cumsum_errors(make_function) -> None:
    spec = TensorSpec((2, 3), "float32")
    with pytest.raises(LibraryError, match=r"cumsum: missing required attribute 'axis'"):
        make_function("cumsum").infer([spec], {})
    with pytest.raises(LibraryError, match=r"cumsum: attribute 'axis' = -3: expected an axis in "
                                           r"\[-2, 2\)"):
        make_function("cumsum").infer([spec], {"axis": -3})
    with pytest.raises(LibraryError, match=r"cumsum: attribute 'reverse' = 2"):
        make_function("cumsum").infer([spec], {"axis": 0, "reverse": 2})
    with pytest.raises(LibraryError, match=r"cumsum: input 0 has dtype bool"):
        make_function("cumsum").infer([TensorSpec((2,), "bool")], {"axis": 0})
