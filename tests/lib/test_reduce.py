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
