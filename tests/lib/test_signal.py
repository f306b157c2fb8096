"""dft, stft and mel_weight_matrix (cpu) against float64 DFT sums written from the definition."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError


def dft_reference(z: np.ndarray, n: int, inverse: bool) -> np.ndarray:
    """The DFT along the last axis as the sum over k of z_k e^(-+2 pi i jk / n), in float64."""
    z = np.concatenate([z, np.zeros(z.shape[:-1] + (max(n - z.shape[-1], 0),))], -1)[..., :n]
    sign = 1 if inverse else -1
    j = np.arange(n)
    basis = np.exp(sign * 2j * np.pi * np.outer(j, j) / n)
    return (z @ basis.T) / (n if inverse else 1)


def as_complex(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x[..., 0] + (1j * x[..., 1] if x.shape[-1] == 2 else 0)


# float32 transforms run in complex64: error ~ eps * log2(n) * |x|_1 (pocketfft's bound)
TOL = {"float32": dict(rtol=1e-5, atol=1e-4), "float64": dict(rtol=1e-12, atol=1e-11)}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("inverse,onesided,channels,length",
                         [(0, 0, 2, 7), (0, 1, 1, 8), (1, 0, 2, 6), (0, 0, 1, 12)])
def test_dft(dtype, inverse, onesided, channels, length, run_op, random_array) -> None:
    x = random_array((2, 9, 3, channels), dtype, seed=length)
    (got,) = run_op("cpu", "dft", [x], {"axis": 1, "length": length, "inverse": inverse,
                                        "onesided": onesided})
    want = np.moveaxis(dft_reference(np.moveaxis(as_complex(x), 1, -1), length,
                                     bool(inverse)), -1, 1)
    if onesided:
        want = want[:, :length // 2 + 1]
    np.testing.assert_allclose(as_complex(got), want, **TOL[dtype])


def test_irfft(run_op, random_array) -> None:
    spectrum = random_array((3, 5, 2), "float64", seed=3)
    spectrum[:, 0, 1] = 0  # a real signal's DC and Nyquist terms are real
    spectrum[:, -1, 1] = 0
    (got,) = run_op("cpu", "dft", [spectrum], {"axis": 1, "length": 8, "inverse": 1,
                                               "onesided": 1})
    half = as_complex(spectrum)
    full = np.concatenate([half, np.conj(half[:, -2:0:-1])], axis=1)
    np.testing.assert_allclose(got[..., 0], dft_reference(full, 8, True).real, atol=1e-12)


def test_stft(run_op, random_array) -> None:
    signal = random_array((2, 40, 1), "float64", seed=5)
    window = np.hanning(8)
    (got,) = run_op("cpu", "stft", [signal, window], {"frame_step": 5, "frame_length": 8})
    frames = np.stack([signal[:, s:s + 8, 0] * window for s in range(0, 33, 5)], axis=1)
    want = dft_reference(frames, 8, False)[..., :5]
    np.testing.assert_allclose(as_complex(got), want, atol=1e-12)
    with pytest.raises(LibraryError, match="window"):
        run_op("cpu", "stft", [signal, window[:4]], {"frame_step": 5, "frame_length": 8})


def test_mel_weight_matrix_triangles(run_op) -> None:
    rates = [np.array(8000.0), np.array(0.0), np.array(4000.0)]
    (got,) = run_op("cpu", "mel_weight_matrix", rates,
                    {"num_mel_bins": 6, "dft_length": 32, "dtype": "float64"})
    assert got.shape == (17, 6)
    # Each filter rises to 1 at its centre bin and falls back to 0: a triangle in [0, 1].
    assert np.all((got >= 0) & (got <= 1)) and np.allclose(got.max(axis=0), 1)
