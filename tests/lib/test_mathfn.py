"""Elementwise math ops (rounding, trigonometry, isnan/isinf, mod) against float64 NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec

# op -> (float64 reference, input range)
UNARY = {
    "reciprocal": (np.reciprocal, (0.5, 3.0)),
    "floor": (np.floor, (-3.0, 3.0)),
    "ceil": (np.ceil, (-3.0, 3.0)),
    "sign": (np.sign, (-3.0, 3.0)),
    "sin": (np.sin, (-3.0, 3.0)),
    "cos": (np.cos, (-3.0, 3.0)),
    "tan": (np.tan, (-1.2, 1.2)),
    "asin": (np.arcsin, (-0.95, 0.95)),
    "acos": (np.arccos, (-0.95, 0.95)),
    "atan": (np.arctan, (-3.0, 3.0)),
    "sinh": (np.sinh, (-3.0, 3.0)),
    "cosh": (np.cosh, (-3.0, 3.0)),
    "asinh": (np.arcsinh, (-3.0, 3.0)),
    "acosh": (np.arccosh, (1.05, 4.0)),
    "atanh": (np.arctanh, (-0.9, 0.9)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_unary(backend_name: str, name: str, dtype: str, run_op, random_array,
               assert_close) -> None:
    ref, (low, high) = UNARY[name]
    x = random_array((3, 7), dtype, low, high, seed=5)
    (got,) = run_op(backend_name, name, [x])
    assert_close(got, ref(x.astype(np.float64)), dtype)


@pytest.mark.parametrize("name", ["sin", "floor", "reciprocal"])
def test_unary_float16(backend_name: str, name: str, run_op, random_array, assert_close) -> None:
    ref, (low, high) = UNARY[name]
    x = random_array((2, 5), "float16", low, high, seed=6)
    (got,) = run_op(backend_name, name, [x])
    assert_close(got, ref(x.astype(np.float64)), "float16")


def test_round_half_to_even(backend_name: str, run_op) -> None:
    # ONNX Round's own examples: halves go to the even neighbour.
    x = np.array([0.1, 0.5, 0.9, 1.1, 1.5, 1.9, 2.5, -0.5, -1.5, -2.5, -2.6, 3.5], np.float32)
    (got,) = run_op(backend_name, "round", [x])
    np.testing.assert_array_equal(got, [0, 0, 1, 1, 2, 2, 2, -0, -2, -2, -3, 4])


def test_sign_int_and_nan(backend_name: str, run_op) -> None:
    x = np.array([-5, 0, 7, -1], np.int32)
    (got,) = run_op(backend_name, "sign", [x])
    np.testing.assert_array_equal(got, np.sign(x))
    f = np.array([np.nan, -0.0, 2.0, -np.inf], np.float32)
    (got,) = run_op(backend_name, "sign", [f])
    np.testing.assert_array_equal(got, np.sign(f))


@pytest.mark.parametrize("attrs,ref", [
    ({}, lambda x: np.isinf(x)),
    ({"detect_negative": 0}, lambda x: x == np.inf),
    ({"detect_positive": 0}, lambda x: x == -np.inf),
    ({"detect_positive": 0, "detect_negative": 0}, lambda x: np.zeros(x.shape, bool)),
])
def test_isinf_isnan(backend_name: str, attrs: dict, ref, run_op) -> None:
    x = np.array([[np.inf, -np.inf, np.nan, 0.0], [1.0, -3.0, np.inf, np.nan]], np.float32)
    (got,) = run_op(backend_name, "isinf", [x], attrs)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, ref(x))
    (got,) = run_op(backend_name, "isnan", [x])
    np.testing.assert_array_equal(got, np.isnan(x))


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["int32", "int64", "float32"])
def test_mod(backend_name: str, fmod: int, dtype: str, run_op, assert_close) -> None:
    a = np.array([[7, -7, 7, -7, 0, 5], [13, -13, 2, -2, 9, -9]], dtype)
    b = np.array([3, 3, -3, -3, 4, 0 if dtype != "float32" else 2.5], dtype)
    if dtype == "float32":
        a = a + np.float32(0.25)
    (got,) = run_op(backend_name, "mod", [a, b], {"fmod": fmod})
    ref = np.fmod if fmod else np.mod
    with np.errstate(divide="ignore", invalid="ignore"):
        want = ref(a.astype(np.float64), b.astype(np.float64))
    if dtype != "float32":
        want = np.where(b == 0, 0, want)  # NumPy's integer x % 0
    assert_close(got, want.astype(dtype) if dtype != "float32" else want, dtype)


def test_int_mod_and_floor_divide_edges(backend_name: str, run_op) -> None:
    info = np.iinfo(np.int32)
    a = np.array([info.min, info.min, 7, -7, 7, -7, 5, 0], np.int32)
    b = np.array([-1, 1, 2, 2, -2, -2, 0, 3], np.int32)
    with np.errstate(divide="ignore", over="ignore"):
        want_div = np.floor_divide(a, b)
        want_mod = np.mod(a, b)
    (got,) = run_op(backend_name, "floor_divide", [a, b])
    np.testing.assert_array_equal(got, want_div)
    (got,) = run_op(backend_name, "mod", [a, b])
    np.testing.assert_array_equal(got, want_mod)


def test_errors(make_function) -> None:
    f32 = TensorSpec((2,), "float32")
    i32 = TensorSpec((2,), "int32")
    with pytest.raises(LibraryError, match=r"sin: input 0 has dtype int32; supported: float16"):
        make_function("sin").infer([i32])
    with pytest.raises(LibraryError, match=r"floor_divide: input 0 has dtype float32"):
        make_function("floor_divide").infer([f32, f32])
    with pytest.raises(LibraryError, match=r"mod: attribute 'fmod' = 2: expected true/false"):
        make_function("mod").infer([f32, f32], {"fmod": 2})
    with pytest.raises(LibraryError, match=r"isinf: unknown attribute 'detect'"):
        make_function("isinf").infer([f32], {"detect": 1})
