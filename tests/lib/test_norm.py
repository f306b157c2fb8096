"""instance_norm, group_norm, lrn and lp_normalization on every backend against NumPy float64."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec

# Row statistics: a little wider than elementwise tolerances.
TOL = {"float16": {"rtol": 1e-2, "atol": 1e-2}, "float32": {"rtol": 1e-5, "atol": 1e-5},
       "float64": {"rtol": 1e-10, "atol": 1e-12}}


def _close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    assert got.shape == want.shape and str(got.dtype) == dtype
    np.testing.assert_allclose(got.astype(np.float64), want, **TOL[dtype])


def ref_group_norm(x, scale, bias, groups, eps) -> np.ndarray:
    """ONNX GroupNormalization (opset 21): statistics per (n, group), scale/bias per channel."""
    x64 = x.astype(np.float64)
    n, c = x.shape[:2]
    g = x64.reshape(n, groups, -1)
    mean = g.mean(axis=2, keepdims=True)
    var = g.var(axis=2, keepdims=True)
    y = ((g - mean) / np.sqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return y * scale.astype(np.float64).reshape(shape) + bias.astype(np.float64).reshape(shape)


@pytest.mark.parametrize("op,shape,groups,dtype", [
    ("instance_norm", (2, 3, 4, 5), None, "float32"),
    ("instance_norm", (1, 2, 3), None, "float16"),
    ("instance_norm", (1, 2, 20, 30), None, "float32"),  # rows longer than a work-group
    ("group_norm", (2, 6, 3, 2), 3, "float32"),
    ("group_norm", (1, 4, 2, 2, 3), 1, "float64"),
    ("group_norm", (2, 32, 64, 64), 8, "float32"),  # rows the CPU hands to its workers
])
def test_group_norms(backend_name, op, shape, groups, dtype, run_op, random_array) -> None:
    x = random_array(shape, dtype, seed=1)
    scale = random_array((shape[1],), dtype, 0.5, 2, seed=2)
    bias = random_array((shape[1],), dtype, seed=3)
    attrs = {"epsilon": 1e-3}
    if groups is not None:
        attrs["num_groups"] = groups
    (got,) = run_op(backend_name, op, [x, scale, bias], attrs)
    _close(got, ref_group_norm(x, scale, bias, groups or shape[1], 1e-3), dtype)


def ref_lrn(x, size, alpha, beta, bias) -> np.ndarray:
    """ONNX LRN, channel by channel as the spec writes it."""
    x64 = x.astype(np.float64)
    c = x.shape[1]
    out = np.empty_like(x64)
    for i in range(c):
        lo = max(0, i - (size - 1) // 2)
        hi = min(c - 1, i + int(np.ceil((size - 1) / 2)))
        square_sum = (x64[:, lo:hi + 1] ** 2).sum(axis=1)
        out[:, i] = x64[:, i] / (bias + alpha / size * square_sum) ** beta
    return out


@pytest.mark.parametrize("shape,size,dtype", [((2, 5, 3, 3), 3, "float32"),
                                              ((1, 6, 4), 4, "float64"),
                                              ((1, 3, 2, 2), 7, "float16")])
def test_lrn(backend_name, shape, size, dtype, run_op, random_array) -> None:
    x = random_array(shape, dtype, seed=4)
    attrs = {"size": size, "alpha": 0.5, "beta": 0.6, "bias": 2.0}
    (got,) = run_op(backend_name, "lrn", [x], attrs)
    _close(got, ref_lrn(x, size, 0.5, 0.6, 2.0), dtype)


def test_lrn_defaults(backend_name, run_op, random_array) -> None:
    x = random_array((1, 4, 2, 2), "float32", seed=5)
    (got,) = run_op(backend_name, "lrn", [x], {"size": 3})
    _close(got, ref_lrn(x, 3, 1e-4, 0.75, 1.0), "float32")


@pytest.mark.parametrize("shape,axis,p,dtype", [((3, 4), -1, 2, "float32"),
                                                ((2, 3, 4), 1, 1, "float32"),
                                                ((2, 5), 0, 2, "float64"),
                                                ((2, 300, 2), 1, 2, "float32"),
                                                ((4, 3), 1, 1, "float16")])
def test_lp_normalization(backend_name, shape, axis, p, dtype, run_op, random_array) -> None:
    x = random_array(shape, dtype, 0.1, 2, seed=6) * np.where(
        random_array(shape, "float32", seed=7) > 0, 1, -1).astype(dtype)
    (got,) = run_op(backend_name, "lp_normalization", [x], {"axis": axis, "p": p})
    x64 = x.astype(np.float64)
    norm = np.linalg.norm(x64, ord=p, axis=axis, keepdims=True)
    _close(got, x64 / norm, dtype)


def test_lp_normalization_zero_line_stays_zero(backend_name, run_op) -> None:
    x = np.array([[0.0, 0.0], [3.0, -4.0]], np.float32)
    (got,) = run_op(backend_name, "lp_normalization", [x], {"axis": 1, "p": 2})
    np.testing.assert_allclose(got, [[0.0, 0.0], [0.6, -0.8]], rtol=1e-6)


def test_norm_errors(make_function) -> None:
    x = TensorSpec((2, 6, 4), "float32")
    c6 = TensorSpec((6,), "float32")
    with pytest.raises(LibraryError, match=r"group_norm: attribute 'num_groups' = 4: expected "
                                           r"a positive divisor of the 6 channels"):
        make_function("group_norm").infer([x, c6, c6], {"num_groups": 4})
    with pytest.raises(LibraryError, match="group_norm: missing required attribute "
                                           "'num_groups'"):
        make_function("group_norm").infer([x, c6, c6], {})
    with pytest.raises(LibraryError, match=r"instance_norm: scale has shape \(3,\) but data "
                                           r"\(2, 6, 4\) float32 needs \(6,\)"):
        make_function("instance_norm").infer([x, TensorSpec((3,), "float32"), c6])
    with pytest.raises(LibraryError, match="instance_norm: input 0 .* needs rank 3 or more"):
        make_function("instance_norm").infer([TensorSpec((2, 6), "float32"), c6, c6])
    with pytest.raises(LibraryError, match="lrn: attribute 'size' = 0: expected a positive"):
        make_function("lrn").infer([x], {"size": 0})
    with pytest.raises(LibraryError, match="lp_normalization: attribute 'p' = 3: expected 1 "
                                           "or 2"):
        make_function("lp_normalization").infer([x], {"p": 3})
    with pytest.raises(LibraryError, match="lp_normalization: attribute 'axis' = 3"):
        make_function("lp_normalization").infer([x], {"axis": 3})
