"""Comparison, logical and bitwise ops on every backend against NumPy references."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.ops.compare import COMPARE

_NUMPY = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less,
          "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal}
# Equal shapes, and broadcasting on both sides (the generated kernel differs between the two).
SHAPES = [((4, 3), (4, 3)), ((2, 1, 3), (4, 1))]


def _operands(dtype: str, sa: tuple, sb: tuple) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    # Few distinct values, so ties (where <= and < differ) occur.
    a = rng.integers(-2, 3, size=sa)
    b = rng.integers(-2, 3, size=sb)
    if dtype == "bool":
        return (a > 0), (b > 0)
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.parametrize("name", sorted(COMPARE))
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_compare(backend_name: str, name: str, dtype: str, run_op) -> None:
    for sa, sb in SHAPES:
        a, b = _operands(dtype, sa, sb)
        (got,) = run_op(backend_name, name, [a, b])
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, _NUMPY[name](a.astype(np.float64),
                                                        b.astype(np.float64)))


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "uint32"])
def test_compare_dtypes(backend_name: str, dtype: str, run_op) -> None:
    a, b = _operands(dtype, (3, 4), (4,))
    for name in ("less_equal", "equal"):
        (got,) = run_op(backend_name, name, [a, b])
        np.testing.assert_array_equal(got, _NUMPY[name](a, b))


def test_compare_nan(backend_name: str, run_op) -> None:
    a = np.array([np.nan, 1.0, np.nan, -np.inf], np.float32)
    b = np.array([np.nan, np.nan, 0.0, -np.inf], np.float32)
    for name, ref in _NUMPY.items():
        (got,) = run_op(backend_name, name, [a, b])
        np.testing.assert_array_equal(got, ref(a, b), err_msg=name)


def test_logical(backend_name: str, run_op) -> None:
    a, b = _operands("bool", (2, 1, 3), (4, 1))
    for name, ref in (("logical_and", np.logical_and), ("logical_or", np.logical_or),
                      ("logical_xor", np.logical_xor)):
        (got,) = run_op(backend_name, name, [a, b])
        np.testing.assert_array_equal(got, ref(a, b), err_msg=name)
    (got,) = run_op(backend_name, "logical_not", [a])
    np.testing.assert_array_equal(got, ~a)


@pytest.mark.parametrize("dtype", ["int32", "uint8", "int64"])
def test_bitwise(backend_name: str, dtype: str, run_op) -> None:
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(3, 5), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, size=(5,), dtype=dtype, endpoint=True)
    for name, ref in (("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or),
                      ("bitwise_xor", np.bitwise_xor)):
        (got,) = run_op(backend_name, name, [a, b])
        np.testing.assert_array_equal(got, ref(a, b), err_msg=name)
    (got,) = run_op(backend_name, "bitwise_not", [a])
    np.testing.assert_array_equal(got, np.invert(a))


@pytest.mark.parametrize("dtype", ["uint8", "uint32", "uint64", "int32"])
def test_shifts(backend_name: str, dtype: str, run_op) -> None:
    bits = np.dtype(dtype).itemsize * 8
    values = np.array([1, 3, 200, 255, 7, 0, 1, 128], np.int64)
    if dtype == "int32":
        values[[2, 6]] = [-200, -7]
    counts = np.array([0, 1, 3, bits - 1, bits, bits + 5, 2, 7])
    x, n = values.astype(dtype), counts.astype(dtype)
    for name, ref in (("left_shift", np.left_shift), ("right_shift", np.right_shift)):
        (got,) = run_op(backend_name, name, [x, n])
        np.testing.assert_array_equal(got, ref(x, n), err_msg=name)


def test_errors_name_op_and_input(make_function) -> None:
    f32, i64 = TensorSpec((2, 3), "float32"), TensorSpec((2, 3), "int64")
    with pytest.raises(LibraryError, match=r"less: input 1 has dtype int64 but input 0 has "
                                           r"float32"):
        make_function("less").infer([f32, i64])
    with pytest.raises(LibraryError, match=r"logical_and: input 0 has dtype float32; "
                                           r"supported: bool"):
        make_function("logical_and").infer([f32, f32])
    with pytest.raises(LibraryError, match=r"left_shift: input 0 has dtype float32"):
        make_function("left_shift").infer([f32, f32])
    with pytest.raises(LibraryError, match=r"equal: cannot broadcast input shapes \(2, 3\) "
                                           r"and \(4,\)"):
        make_function("equal").infer([f32, TensorSpec((4,), "float32")])
    with pytest.raises(LibraryError, match=r"logical_not: its ops take 1 input"):
        make_function("logical_not").infer([TensorSpec((2,), "bool")] * 2)


def test_chains_through_bool_values(backend_name: str, run_op) -> None:
    # On CUDA/OpenCL each chain is one generated kernel whose intermediate is a bool.
    a, b = _operands("float32", (3, 4), (4,))
    x, y = _operands("int32", (3, 4), (3, 4))
    (got,) = run_op(backend_name, [{"op": "greater"}, {"op": "logical_not"}], [a, b])
    np.testing.assert_array_equal(got, ~(a > b))
    (got,) = run_op(backend_name, [{"op": "less_equal"}, {"op": "where"}], [a, b, x, y])
    np.testing.assert_array_equal(got, np.where(a <= b, x, y))
    (got,) = run_op(backend_name, [{"op": "bitwise_xor"}, {"op": "equal"}], [x, y, x])
    np.testing.assert_array_equal(got, (x ^ y) == x)
