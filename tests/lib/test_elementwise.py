"""Elementwise standard ops on every backend against float64 NumPy references."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.ops.elementwise import BINARY, UNARY


def _ref_binary(name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
          "maximum": np.maximum, "minimum": np.minimum, "power": np.power}[name]
    return fn(a.astype(np.float64), b.astype(np.float64))


def _ref_unary(name: str, x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x64))
    if name == "relu":
        return np.maximum(x64, 0)
    if name == "copy":
        return x64
    return getattr(np, {"abs": "absolute"}.get(name, name))(x64)


# Shapes cover equal shapes, rank differences, size-1 dims on either side, scalars, zero-size.
BROADCASTS = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1, 3), (5, 1)), ((1,), (2, 3)),
              ((), (3, 2)), ((2, 0, 3), (1, 3)), ((0,), (1,)), ((2, 1, 1, 3), (1, 4, 5, 1))]


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_float32(backend_name: str, name: str, run_op, random_array, assert_close) -> None:
    for i, (sa, sb) in enumerate(BROADCASTS):
        low = 0.5 if name in ("power", "divide") else -2.0
        a = random_array(sa, "float32", low, 2.0, seed=i)
        b = random_array(sb, "float32", low, 2.0, seed=i + 100)
        (got,) = run_op(backend_name, name, [a, b])
        assert_close(got, _ref_binary(name, a, b), "float32")


@pytest.mark.parametrize("name,dtype", [
    (name, dtype) for name in ["add", "subtract", "multiply", "maximum", "minimum", "divide"]
    for dtype in ["float16", "float64", "int32", "int64"]
    if not (name == "divide" and dtype.startswith("int"))])  # divide is float-only (infer refuses)
def test_binary_dtypes(backend_name: str, name: str, dtype: str, run_op, random_array,
                       assert_close) -> None:
    a = random_array((3, 4), dtype, -5, 5, seed=1)
    b = random_array((4,), dtype, 0.5, 5, seed=2)
    (got,) = run_op(backend_name, name, [a, b])
    assert_close(got, _ref_binary(name, a, b), dtype)


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_unary_float(backend_name: str, name: str, dtype: str, run_op, random_array,
                     assert_close) -> None:
    low = 0.1 if name in ("log", "sqrt") else -3.0
    x = random_array((3, 5), dtype, low, 3.0, seed=3)
    (got,) = run_op(backend_name, name, [x])
    assert_close(got, _ref_unary(name, x), dtype)


@pytest.mark.parametrize("name", ["negative", "relu", "abs", "copy"])
@pytest.mark.parametrize("shape", [(7,), (2, 0), ()])
def test_unary_int_and_odd_shapes(backend_name: str, name: str, shape: tuple, run_op,
                                  random_array, assert_close) -> None:
    x = random_array(shape, "int64", -9, 9, seed=4)
    (got,) = run_op(backend_name, name, [x])
    assert_close(got, _ref_unary(name, x).astype(np.int64), "int64")


def test_maximum_propagates_nan(backend_name: str, run_op) -> None:
    a = np.array([np.nan, 1.0, 2.0, np.nan], np.float32)
    b = np.array([0.0, np.nan, 1.0, np.nan], np.float32)
    for name, ref in (("maximum", np.maximum), ("minimum", np.minimum)):
        (got,) = run_op(backend_name, name, [a, b])
        np.testing.assert_array_equal(got, ref(a, b))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_relu_on_large_arrays_matches_maximum(backend_name: str, dtype: str, run_op) -> None:
    # 21,000 elements: the CPU kernel's zero-block path, with a partial last block
    x = np.random.default_rng(7).standard_normal((3, 7000)) * 100
    x = x.astype(dtype)
    if dtype != "int32":
        x[0, :4] = [np.nan, -0.0, np.inf, -np.inf]
    (got,) = run_op(backend_name, "relu", [x])
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def test_relu_of_a_strided_view_on_cpu() -> None:
    from graph_runtime.lib.ops.elementwise import _relu
    x = np.random.default_rng(8).standard_normal((100, 90)).astype(np.float32)
    out = np.empty((90, 100), np.float32)
    _relu(np)(x.T, out)  # a transposed (non-contiguous) input takes the plain maximum
    np.testing.assert_array_equal(out, np.maximum(x.T, 0))


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("int64", "float32"),
                                     ("float32", "float16"), ("float16", "float64")])
def test_cast(backend_name: str, src: str, dst: str, run_op, random_array, assert_close) -> None:
    x = random_array((4, 3), src, -50, 50, seed=5)
    (got,) = run_op(backend_name, "cast", [x], {"dtype": dst})
    assert_close(got, x.astype(dst).astype(np.float64), dst)


def test_cast_takes_dtype_from_declared_output(backend_name: str, run_op, random_array,
                                                assert_close) -> None:
    x = random_array((5,), "float32", -9, 9, seed=6)
    (got,) = run_op(backend_name, "cast", [x], outputs=[TensorSpec((5,), "int64")])
    assert_close(got, x.astype(np.int64).astype(np.float64), "int64")


def test_errors_name_op_and_value(make_function) -> None:
    add = make_function("add")
    with pytest.raises(LibraryError, match=r"add: cannot broadcast input shapes \(2, 3\) and "
                                           r"\(4,\)"):
        add.infer([TensorSpec((2, 3), "float32"), TensorSpec((4,), "float32")])
    with pytest.raises(LibraryError, match="add: input 1 has dtype float64 but input 0 has "
                                           "float32"):
        add.infer([TensorSpec((2,), "float32"), TensorSpec((2,), "float64")])
    with pytest.raises(LibraryError, match="exp: input 0 has dtype int32; supported: float16"):
        make_function("exp").infer([TensorSpec((2,), "int32")])
    with pytest.raises(LibraryError, match="add: unknown attribute 'alpha'; it accepts: no "
                                           "attributes"):
        add.infer([TensorSpec((2,), "float32")] * 2, {"alpha": 1})
    with pytest.raises(LibraryError, match="cast: missing attribute 'dtype'"):
        make_function("cast").infer([TensorSpec((2,), "float32")])
