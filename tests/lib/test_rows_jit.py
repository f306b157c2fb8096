"""Compiled layer_norm, rms_norm and softmax rows (lib/kernels/cpu/rows_jit.py) against float64
references."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.lib.kernels.cpu import rows_jit

F32_EPS = 2.0 ** -23


def _layer_norm64(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * g.astype(np.float64) + b.astype(np.float64)


@pytest.mark.parametrize("shape", [(1, 7), (3, 5, 129), (2, 1), (1000, 64)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_rows(shape: tuple[int, ...], dtype: str, monkeypatch) -> None:
    monkeypatch.setattr(rows_jit, "PARALLEL_ELEMENTS", 1000)  # the split runs too
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 4 + 1).astype(dtype)
    g = rng.standard_normal(shape[-1]).astype(dtype)
    b = rng.standard_normal(shape[-1]).astype(dtype)
    out = np.empty_like(x)
    rows_jit.layer_norm_rows(shape, 1e-5, True, True)(x, g, b, out)
    want = _layer_norm64(x, g, b, 1e-5)
    # statistics in float64; the result rounds once per multiply-add of the last line
    tol = 8 * F32_EPS if dtype == "float32" else 1e-13
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("shape", [(1, 7), (3, 5, 129), (1000, 64)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rms_norm_rows(shape: tuple[int, ...], dtype: str, monkeypatch) -> None:
    monkeypatch.setattr(rows_jit, "PARALLEL_ELEMENTS", 1000)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 4 + 1).astype(dtype)
    g = rng.standard_normal(shape[-1]).astype(dtype)
    out = np.empty_like(x)
    rows_jit.rms_norm_rows(shape, 1e-6)(x, g, out)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * g
    tol = 8 * F32_EPS if dtype == "float32" else 1e-13
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("shape", [(1, 7), (2, 3, 33, 33), (4, 1), (512, 128)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_rows(shape: tuple[int, ...], dtype: str, monkeypatch) -> None:
    monkeypatch.setattr(rows_jit, "PARALLEL_ELEMENTS", 1000)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 5).astype(dtype)
    flat = x.reshape(-1, shape[-1])
    flat[0, 0] = -np.inf  # a masked position
    if flat.shape[0] > 2:
        flat[1, :] = -np.inf  # a fully masked row: NaN, as NumPy's softmax gives
        flat[2, -1] = np.nan
    if flat.shape[0] > 3:
        flat[3, shape[-1] // 2] = np.inf  # inf - inf: a NaN row, as NumPy's softmax gives
    out = np.empty_like(x)
    rows_jit.softmax_rows(shape)(x, out)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    tol = 4 * F32_EPS if dtype == "float32" else 1e-14
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("where", [0, 7, 199])
def test_softmax_rows_float32_nan_anywhere_gives_nan_row(where: int) -> None:
    """The float32 row max compares IEEE bits as integers: a NaN of either sign anywhere in a
    row (first, middle, in the vector tail) still gives a NaN row, as NumPy's softmax; the
    other rows are exact."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 200)) * 5).astype(np.float32)
    x[0, where] = np.nan
    x[1, where] = -np.float32(np.nan)
    x[2, :] = -np.float32(0.0)  # -0 everywhere: uniform
    out = np.empty_like(x)
    rows_jit.softmax_rows(x.shape)(x, out)
    assert np.isnan(out[:2]).all()
    np.testing.assert_allclose(out[2], 1 / 200, rtol=4 * F32_EPS)
    x64 = x[3].astype(np.float64)
    e = np.exp(x64 - x64.max())
    np.testing.assert_allclose(out[3], e / e.sum(), rtol=4 * F32_EPS, atol=4 * F32_EPS)


def test_one_row_kernel_runs_every_shape_of_its_rank_and_refuses_empty_ones() -> None:
    # a symbolic module keeps one norm or softmax per size class (any_shape): each call reads
    # its arrays' rows and width, so shapes other than the first one run right too
    rng = np.random.default_rng(3)
    first = (2, 3, 64)
    norm = rows_jit.layer_norm_rows(first, 1e-5, False, True)  # no center: beta not read
    rms = rows_jit.rms_norm_rows(first, 1e-6)
    soft = rows_jit.softmax_rows(first)
    for shape in (first, (1, 300, 48), (4, 1, 64), (5, 70, 700)):
        x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
        g = rng.standard_normal(shape[-1]).astype(np.float32)
        out = np.empty_like(x)
        norm(x, g, g, out)
        want = _layer_norm64(x, g, np.zeros(shape[-1], np.float32), 1e-5)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        rms(x, g, out)
        x64 = x.astype(np.float64)
        want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * g
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        soft(x, out)
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    for kernel in (norm, rms, soft):
        assert kernel.any_shape()
        assert kernel.serves([(3, 9, 64), (64,), (3, 9, 64)])
        assert not kernel.serves([(3, 0, 64), (64,), (3, 0, 64)])
