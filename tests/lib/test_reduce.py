"""Reductions on every backend against float64 NumPy references, incl. zero-size inputs."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec

OPS = ["sum", "mean", "max", "min", "argmax", "argmin"]


def reference(op: str, x: np.ndarray, axis, keepdims: bool = False) -> np.ndarray:
    """NumPy's op in float64; arg ops over several axes index the flattened reduced axes."""
    x64 = x.astype(np.float64)
    axes = tuple(range(x.ndim)) if axis is None else tuple(
        a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))
    if not op.startswith("arg"):
        return np.asarray(getattr(np, op)(x64, axis=axes, keepdims=keepdims))
    kept = [d for i, d in enumerate(x.shape) if i not in axes]
    moved = np.moveaxis(x64, axes, range(-len(axes), 0)).reshape(kept + [-1])
    out = getattr(np, op)(moved, axis=-1).astype(np.int32)
    if keepdims:
        out = out.reshape([1 if i in axes else d for i, d in enumerate(x.shape)])
    return np.asarray(out)


CASES = [((3, 4, 5), None, False), ((3, 4, 5), 1, False), ((3, 4, 5), [0, 2], True),
         ((3, 4, 5), -1, True), ((700,), 0, False), ((2, 300), [1], False), ((1, 1), None, True)]


@pytest.mark.parametrize("op", OPS)
def test_reduce_float32(backend_name, op, run_op, random_array, assert_close) -> None:
    for i, (shape, axis, keepdims) in enumerate(CASES):
        x = random_array(shape, "float32", seed=i)
        attrs = {"axis": axis, "keepdims": keepdims}
        (got,) = run_op(backend_name, op, [x], attrs)
        assert_close(got, reference(op, x, axis, keepdims).astype(np.float64),
                     "int32" if op.startswith("arg") else "float32")


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32", "int64"])
def test_reduce_dtypes(backend_name, dtype, run_op, random_array, assert_close) -> None:
    x = random_array((4, 33), dtype, -20, 20, seed=7)
    for op in OPS:
        if op == "mean" and dtype.startswith("int"):
            continue
        (got,) = run_op(backend_name, op, [x], {"axis": 1})
        want = reference(op, x, 1)
        if dtype == "float16" and op in ("sum", "mean"):
            want = want.astype(np.float16).astype(np.float64)
        assert_close(got, want, "int32" if op.startswith("arg") else dtype)


def test_exclude_reduces_the_other_axes(backend_name, run_op, random_array,
                                        assert_close) -> None:
    x = random_array((2, 3, 4), "float32", seed=8)
    (got,) = run_op(backend_name, "sum", [x], {"axis": [1], "exclude": True})
    assert_close(got, x.astype(np.float64).sum(axis=(0, 2)), "float32")


def test_nan_and_ties_follow_numpy(backend_name, run_op) -> None:
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, 5.0, 1.0],
                  [-np.inf, -np.inf, -np.inf, -np.inf]], np.float32)
    for op in ("max", "min", "argmax", "argmin"):
        (got,) = run_op(backend_name, op, [x], {"axis": 1})
        np.testing.assert_array_equal(got, getattr(np, op)(x, axis=1), err_msg=op)


def test_zero_size_inputs(backend_name, run_op) -> None:
    empty = np.zeros((3, 0), np.float32)
    (got,) = run_op(backend_name, "sum", [empty], {"axis": 1})
    np.testing.assert_array_equal(got, np.zeros(3, np.float32))
    for op in ("max", "argmin"):
        (got,) = run_op(backend_name, op, [empty], {"axis": 0})
        assert got.shape == (0,)


@pytest.mark.parametrize("op", ["max", "min", "argmax", "mean"])
def test_zero_size_reduction_without_identity_is_refused(op, make_function) -> None:
    with pytest.raises(LibraryError, match=rf"{op}: cannot reduce input \(3, 0\) float32 over "
                                           r"axes \[1\]: they hold no elements"):
        make_function(op).infer([TensorSpec((3, 0), "float32")], {"axis": 1})


def test_attr_errors_name_op_and_value(make_function) -> None:
    spec = [TensorSpec((2, 3), "float32")]
    with pytest.raises(LibraryError, match=r"sum: attribute 'axis' = 2: expected an axis in "
                                           r"\[-2, 2\) for an input of rank 2"):
        make_function("sum").infer(spec, {"axis": 2})
    with pytest.raises(LibraryError, match=r"max: attribute 'axis' = \[1, -1\]: expected "
                                           "distinct axes"):
        make_function("max").infer(spec, {"axis": [1, -1]})
    with pytest.raises(LibraryError, match="mean: input 0 has dtype int32; supported: float16"):
        make_function("mean").infer([TensorSpec((2,), "int32")])
    with pytest.raises(LibraryError, match="keepdims' = 'yes': expected true/false or 0/1"):
        make_function("min").infer(spec, {"keepdims": "yes"})


# -- ONNX's further reductions ------------------------------------------------------------------

def onnx_reference(op: str, x: np.ndarray, axis, keepdims: bool = False) -> np.ndarray:
    """ReduceProd ... ReduceLogSumExp written from their definitions, in float64."""
    x64 = x.astype(np.float64)
    axes = tuple(range(x.ndim)) if axis is None else tuple(
        a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))
    with np.errstate(divide="ignore"):
        fn = {"prod": lambda v: np.prod(v, axis=axes, keepdims=keepdims),
              "sum_square": lambda v: np.sum(v * v, axis=axes, keepdims=keepdims),
              "l1": lambda v: np.sum(np.abs(v), axis=axes, keepdims=keepdims),
              "l2": lambda v: np.sqrt(np.sum(v * v, axis=axes, keepdims=keepdims)),
              "log_sum": lambda v: np.log(np.sum(v, axis=axes, keepdims=keepdims)),
              "log_sum_exp": lambda v: np.log(np.sum(np.exp(v), axis=axes,
                                                     keepdims=keepdims))}[op]
        return np.asarray(fn(x64))


ONNX_OPS = ["prod", "sum_square", "l1", "l2", "log_sum", "log_sum_exp"]
ONNX_CASES = [((3, 4, 5), None, False), ((3, 4, 5), [0, 2], True), ((2, 300), -1, False),
              ((4, 6), 0, False)]


@pytest.mark.parametrize("op", ONNX_OPS)
def test_onnx_reduce_float32(backend_name, op, run_op, random_array, assert_close) -> None:
    for i, (shape, axis, keepdims) in enumerate(ONNX_CASES):
        # prod over 300 values stays finite near 1; log_sum needs a positive sum.
        low, high = (0.9, 1.1) if op == "prod" else ((0.1, 2.0) if op == "log_sum" else (-2, 2))
        x = random_array(shape, "float32", low, high, seed=20 + i)
        (got,) = run_op(backend_name, op, [x], {"axis": axis, "keepdims": keepdims})
        assert_close(got, onnx_reference(op, x, axis, keepdims), "float32")


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32"])
def test_onnx_reduce_dtypes(backend_name, dtype, run_op, random_array, assert_close) -> None:
    x = random_array((3, 20), dtype, 0.5, 1.5, seed=9)
    for op in ONNX_OPS:
        if dtype == "int32" and op in ("l2", "log_sum", "log_sum_exp"):
            continue
        (got,) = run_op(backend_name, op, [x], {"axis": 1})
        want = onnx_reference(op, x, 1)
        assert_close(got, want.astype(dtype).astype(np.float64) if dtype == "int32" else want,
                     dtype)


def test_log_sum_exp_is_stable(backend_name, run_op) -> None:
    x = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -1000.5],
                  [-np.inf, -np.inf, -np.inf], [np.inf, 1.0, 2.0]], np.float32)
    (got,) = run_op(backend_name, "log_sum_exp", [x], {"axis": 1})
    x64 = x.astype(np.float64)[:2]
    top = x64.max(axis=1, keepdims=True)
    want = np.log(np.exp(x64 - top).sum(axis=1)) + top[:, 0]
    np.testing.assert_allclose(got[:2], want, rtol=1e-6)
    np.testing.assert_array_equal(got[2:], [-np.inf, np.inf])


def test_onnx_reduce_zero_size(backend_name, run_op) -> None:
    empty = np.zeros((3, 0), np.float32)
    want = {"prod": 1.0, "sum_square": 0.0, "l1": 0.0, "l2": 0.0, "log_sum": -np.inf,
            "log_sum_exp": -np.inf}
    for op, value in want.items():
        (got,) = run_op(backend_name, op, [empty], {"axis": 1})
        np.testing.assert_array_equal(got, np.full(3, value, np.float32), err_msg=op)


def test_onnx_reduce_refuses_int_log(make_function) -> None:
    with pytest.raises(LibraryError, match=r"log_sum_exp: input 0 has dtype int32; supported"):
        make_function("log_sum_exp").infer([TensorSpec((2, 3), "int32")], {"axis": 1})
    with pytest.raises(LibraryError, match=r"l2: attribute 'axis' = 2: expected an axis in"):
        make_function("l2").infer([TensorSpec((2, 3), "float32")], {"axis": 2})
