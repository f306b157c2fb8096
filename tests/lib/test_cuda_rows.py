"""CUDA's row kernels (kernels/cuda_rows.py) on their own: attention's softmax against NumPy's
arithmetic in float64 (scale, broadcast masks, rows of -inf, NaN, nan_to_zero), and what they
leave to the NumPy-API versions (strided arrays, float16, an axis not last)."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.lib.kernels.cuda_rows import AttentionSoftmax, RowNorm, broadcast_strides

FULL = (2, 3, 4, 37)


def _softmax_reference(scores: np.ndarray, mask: np.ndarray | None, scale: float,
                       nan_to_zero: bool) -> np.ndarray:
    # The scale and the mask are applied in the scores' dtype, as the op's NumPy-API version
    # does: a fully masked row (-1e4 + x) keeps float32's rounding, which float64 would not.
    s = scores * scores.dtype.type(scale)
    if mask is not None:
        s = s + mask
    s = s.astype(np.float64)
    with np.errstate(invalid="ignore"):
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s = s / s.sum(axis=-1, keepdims=True)
    return np.where(np.isnan(s), 0.0, s) if nan_to_zero else s


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mask_shape", [None, (1, 1, 1, 37), (2, 1, 4, 37), (1, 3, 1, 1), FULL])
@pytest.mark.parametrize("nan_to_zero", [False, True])
def test_attention_softmax_matches_numpy(cuda_available: None, dtype: str, mask_shape,
                                         nan_to_zero: bool) -> None:
    import cupy
    rng = np.random.default_rng(3)
    scores = rng.standard_normal(FULL).astype(dtype) * 4
    scores[0, 1, 2] = -np.inf  # a row of -inf: NaN after the max, as NumPy makes it
    scores[1, 2, 3, 5] = np.nan
    mask = None
    if mask_shape is not None:
        mask = np.where(rng.random(mask_shape) < 0.3, -1e4, 0).astype(dtype)
    want = _softmax_reference(scores, mask, 0.125, nan_to_zero)
    kernel = AttentionSoftmax(*FULL, dtype, 0.125, nan_to_zero)
    s = cupy.asarray(scores)
    assert kernel(s, None if mask is None else cupy.asarray(mask))
    got = s.get()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    tol = 1e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=tol, atol=tol)
    assert np.isnan(got[0, 1, 2]).all() != nan_to_zero


@pytest.mark.cuda
def test_what_the_row_kernels_leave_to_numpy_api(cuda_available: None) -> None:
    """A strided array or a mask of another dtype makes a call return False with nothing
    written; float16 and an axis other than the last are not taken at all."""
    import cupy
    x = cupy.arange(24, dtype=np.float32).reshape(4, 6)
    gamma, beta = cupy.ones(4, np.float32), cupy.zeros(4, np.float32)
    out = cupy.full((6, 4), np.nan, np.float32)
    norm = RowNorm("layer_norm", (6, 4), "float32", 1e-5)
    assert not norm(x.T, gamma, beta, out)
    assert bool(cupy.isnan(out).all())
    soft = AttentionSoftmax(1, 1, 4, 6, "float32", 1.0, False)
    assert not soft(x.reshape(1, 1, 4, 6), cupy.zeros((1, 1, 1, 6), np.float64))
    assert not RowNorm.fits((4, 6), 0, "float32")
    assert not RowNorm.fits((4, 6), 1, "float16")
    assert RowNorm.fits((4, 6), 1, "float32")
    assert not AttentionSoftmax.fits(1, 1, 4, 6, "float16")


@pytest.mark.parametrize("mask_shape", [(1, 1, 1, 37), (2, 1, 4, 37), (1, 3, 1, 1), FULL])
def test_the_softmax_reads_a_mask_as_numpy_broadcasts_it(mask_shape) -> None:
    """Read through the element strides the kernel is given, a mask (contiguous or strided,
    distinct values) gives NumPy's broadcast of it at every index of the scores."""
    whole = np.arange(np.prod([2 * d for d in mask_shape]), dtype=np.float32)
    for mask in (whole[:np.prod(mask_shape)].reshape(mask_shape),
                 whole.reshape([2 * d for d in mask_shape])[::2, 1::2, ::2, 1::2]):
        strides = broadcast_strides(mask.shape, mask.strides, mask.itemsize)
        read = np.lib.stride_tricks.as_strided(mask, FULL, [s * mask.itemsize for s in strides])
        np.testing.assert_array_equal(read, np.broadcast_to(mask, FULL))
