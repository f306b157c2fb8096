"""Signal ops: dft, stft and mel_weight_matrix (ONNX DFT, STFT, MelWeightMatrix)."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..attrs import bool_attr, dtype_attr, int_attr, op_error
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import FLOAT_DTYPES, check_dtype

DFT_ATTRS = ("axis", "length", "inverse", "onesided")


# -- dft ------------------------------------------------------------------------------------------
# A signal is (..., 1) real or (..., 2) complex (real, imaginary) along the last axis, as in ONNX.

def _dft_params(spec: TensorSpec, attrs: Mapping[str, Any]) -> tuple[int, int, bool, bool]:
    op = "dft"
    rank = len(spec.shape)
    axis = int_attr(op, attrs, "axis")
    if not 0 <= axis < rank - 1:
        raise op_error(op, f"axis {axis} for input {spec}: expected a signal axis in "
                           f"[0, {rank - 1}) (the last axis holds real/imaginary)")
    length = int_attr(op, attrs, "length")
    if length < 1:
        raise op_error(op, f"length {length}; expected >= 1")
    return axis, length, bool_attr(op, attrs, "inverse", False), \
        bool_attr(op, attrs, "onesided", False)


def _signal(op: str, spec: TensorSpec) -> None:
    check_dtype(op, spec, FLOAT_DTYPES)
    if len(spec.shape) < 2 or spec.shape[-1] not in (1, 2):
        raise op_error(op, f"input 0 is {spec}; expected (..., 1) real or (..., 2) complex")


def _dft_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    if len(inputs) != 1:
        raise op_error("dft", f"takes 1 input, got {len(inputs)}")
    spec = inputs[0]
    _signal("dft", spec)
    axis, length, inverse, onesided = _dft_params(spec, attrs)
    shape = list(spec.shape)
    if inverse and onesided:
        shape[axis], shape[-1] = length, 1
    else:
        shape[axis], shape[-1] = (length // 2 + 1 if onesided else length), 2
    return [TensorSpec(tuple(shape), spec.dtype)]


def _complex(x: np.ndarray) -> np.ndarray:
    """(..., 1|2) float -> (...) complex: complex128 for float64, else complex64.

    NOTE: NumPy's FFT keeps complex64 in complex64 (pocketfft, error ~ eps * log2(n) * norm);
    ONNX's expected values are computed that way, to float32's last bits, so float32 signals
    are transformed in float32 too.
    """
    ctype = np.complex128 if x.dtype == np.float64 else np.complex64
    if x.shape[-1] == 1:
        return x[..., 0].astype(ctype)
    z = np.empty(x.shape[:-1], ctype)
    z.real = x[..., 0]
    z.imag = x[..., 1]
    return z


def _interleaved(z: np.ndarray, out: np.ndarray) -> None:
    out[..., 0] = z.real
    out[..., 1] = z.imag


def _cpu_dft(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    axis, length, inverse, onesided = _dft_params(inputs[0], attrs)
    half = [slice(None)] * (len(inputs[0].shape) - 1)
    half[axis] = slice(0, length // 2 + 1)

    def run(x: Any, out: Any) -> None:
        z = _complex(x)
        if inverse and onesided:
            out[..., 0] = np.fft.irfft(z, n=length, axis=axis)
            return
        y = np.fft.ifft(z, n=length, axis=axis) if inverse else np.fft.fft(z, n=length, axis=axis)
        _interleaved(y[tuple(half)] if onesided else y, out)
    return run


define_op("dft", _dft_infer, 1, DFT_ATTRS)
kernel("dft", "cpu")(_cpu_dft)


# -- stft -----------------------------------------------------------------------------------------

def _stft_params(signal: TensorSpec, window: TensorSpec, attrs: Mapping[str, Any]
                 ) -> tuple[int, int, int, bool]:
    op = "stft"
    step = int_attr(op, attrs, "frame_step")
    length = int_attr(op, attrs, "frame_length")
    onesided = bool_attr(op, attrs, "onesided", True)
    if step < 1 or length < 1 or length > signal.shape[1]:
        raise op_error(op, f"frame_step {step}, frame_length {length} for signal {signal}: "
                           "expected >= 1 and a frame no longer than the signal")
    if tuple(window.shape) != (length,) or window.dtype != signal.dtype:
        raise op_error(op, f"input 1 (window) is {window}; expected ({length},) {signal.dtype}")
    frames = 1 + (signal.shape[1] - length) // step
    return step, length, frames, onesided


def _stft_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    if len(inputs) != 2:
        raise op_error("stft", f"takes 2 inputs (signal, window), got {len(inputs)}")
    signal, window = inputs
    _signal("stft", signal)
    if len(signal.shape) != 3:
        raise op_error("stft", f"input 0 is {signal}; expected (batch, length, 1|2)")
    _, length, frames, onesided = _stft_params(signal, window, attrs)
    bins = length // 2 + 1 if onesided else length
    return [TensorSpec((signal.shape[0], frames, bins, 2), signal.dtype)]


def _cpu_stft(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
              outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    step, length, frames, onesided = _stft_params(inputs[0], inputs[1], attrs)
    starts = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    bins = outputs[0].shape[2]

    def run(signal: Any, window: Any, out: Any) -> None:
        z = _complex(signal)[:, starts] * np.asarray(window)
        _interleaved(np.fft.fft(z, axis=-1)[..., :bins], out)
    return run


define_op("stft", _stft_infer, 2, ("frame_step", "frame_length", "onesided"))
kernel("stft", "cpu")(_cpu_stft)


# -- mel_weight_matrix ----------------------------------------------------------------------------
# num_mel_bins and dft_length decide the shape (attributes); the rates are read at run time.

def _mel_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    op = "mel_weight_matrix"
    if len(inputs) != 3:
        raise op_error(op, f"takes 3 inputs (sample_rate, lower_edge_hertz, upper_edge_hertz), "
                           f"got {len(inputs)}")
    for i, spec in enumerate(inputs):
        if tuple(spec.shape) not in ((), (1,)):
            raise op_error(op, f"input {i} is {spec}; expected one value")
    bins = int_attr(op, attrs, "num_mel_bins")
    length = int_attr(op, attrs, "dft_length")
    if bins < 1 or length < 1:
        raise op_error(op, f"num_mel_bins {bins}, dft_length {length}; expected >= 1")
    return [TensorSpec((length // 2 + 1, bins), str(dtype_attr(op, attrs, "dtype", "float32")))]


def mel_weights(bins: int, length: int, rate: float, lower: float, upper: float) -> np.ndarray:
    """ONNX's triangular filters: (length // 2 + 1, bins) float64."""
    low_mel = 2595 * np.log1p(lower / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper / 700) / np.log(10)
    step = (high_mel - low_mel) / (bins + 2)
    hertz = 700 * np.expm1((np.arange(bins + 2) * step + low_mel) / 2595 * np.log(10))
    points = ((length + 1) * hertz // rate).astype(np.int64)
    out = np.zeros((length // 2 + 1, bins))
    for i in range(bins):
        left, center, right = (int(v) for v in points[i:i + 3])
        if not 0 <= left <= center <= right <= length // 2 + 1:
            raise op_error("mel_weight_matrix", f"filter {i} spans bins {left}..{right}, outside "
                                                f"the {length // 2 + 1} spectrogram bins")
        if center == left:
            out[center, i] = 1
        else:
            out[left:center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    return out


def _cpu_mel(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    bins = int_attr("mel_weight_matrix", attrs, "num_mel_bins")
    length = int_attr("mel_weight_matrix", attrs, "dft_length")

    def run(rate: Any, lower: Any, upper: Any, out: Any) -> None:
        weights = mel_weights(bins, length, float(np.asarray(rate).reshape(-1)[0]),
                              float(np.asarray(lower).reshape(-1)[0]),
                              float(np.asarray(upper).reshape(-1)[0]))
        np.copyto(out, weights, casting="unsafe")
    return run


define_op("mel_weight_matrix", _mel_infer, 3, ("num_mel_bins", "dft_length", "dtype"))
kernel("mel_weight_matrix", "cpu")(_cpu_mel)
