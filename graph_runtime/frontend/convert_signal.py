"""Converters for CumProd and the signal ops: DFT, STFT, MelWeightMatrix."""
from __future__ import annotations

import numpy as np

from .convert import Context, const_input, converts, norm_axis
from .fold_size import float64_copies, size_dft, size_mel, size_stft
from .ir import Unsupported, Value
from .onnx_node import OnnxNode


@converts("CumProd")
def cumprod(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    axis = norm_axis(int(np.asarray(const_input(node, args, 1, "axis")).reshape(-1)[0]),
                     x.rank, node)
    return [ctx.b.op("cumprod", x, axis=axis, exclusive=bool(int(node.attr("exclusive", 0))),
                     reverse=bool(int(node.attr("reverse", 0))))]


def _one_int(node: OnnxNode, args: list, i: int, what: str) -> int | None:
    value = const_input(node, args, i, what)
    return None if value is None else int(np.asarray(value).reshape(-1)[0])


@converts("DFT", predict=size_dft, workspace=float64_copies(2))
def dft(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    if node.opset >= 20:
        given = _one_int(node, args, 2, "axis")
        axis = -2 if given is None else given
    else:
        axis = int(node.attr("axis", 1))
    axis = norm_axis(axis, x.rank, node)
    if axis == x.rank - 1:
        raise Unsupported(f"axis {axis} is the real/imaginary axis")
    inverse = bool(int(node.attr("inverse", 0)))
    onesided = bool(int(node.attr("onesided", 0)))
    length = _one_int(node, args, 1, "dft_length")
    if length is None:
        length = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    return [ctx.b.op("dft", x, axis=axis, length=length, inverse=inverse, onesided=onesided)]


@converts("STFT", predict=size_stft, workspace=float64_copies(2))
def stft(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    signal = args[0]
    step = _one_int(node, args, 1, "frame_step")
    window = args[2] if len(args) > 2 else None
    length = _one_int(node, args, 3, "frame_length")
    if length is None:
        length = window.shape[0] if window is not None else signal.shape[-2]
    if window is None:
        window = b.const(np.ones(length, signal.dtype), "window")
    return [b.op("stft", signal, window, frame_step=step, frame_length=length,
                 onesided=bool(int(node.attr("onesided", 1))))]


@converts("MelWeightMatrix", predict=size_mel, workspace=float64_copies(2))
def mel_weight_matrix(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    from onnx.helper import tensor_dtype_to_np_dtype
    b = ctx.b
    bins = _one_int(node, args, 0, "num_mel_bins")
    length = _one_int(node, args, 1, "dft_length")
    dtype = np.dtype(tensor_dtype_to_np_dtype(int(node.attr("output_datatype", 1)))).name
    rates = [b.cast(args[i], "float64") for i in (2, 3, 4)]
    return [b.op("mel_weight_matrix", *rates, num_mel_bins=bins, dft_length=length, dtype=dtype)]
