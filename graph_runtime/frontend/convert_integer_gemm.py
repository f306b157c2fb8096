"""MatMulInteger with constant weights as exact float32 GEMMs: K split so no sum passes 2^24.

An int8/uint8 operand minus its zero point lies in [-255, 255]. With the weights known at
import, every partial dot product over `chunk` terms is bounded by 255 * max|w - w_zero| * chunk;
below 2^24 each partial sum (in any order, fused multiply-add or not) is an integer float32
holds exactly, so a float32 GEMM per chunk, cast to int32 and summed in int32, is the exact
integer result (ONNX's int32 accumulation) at float32 GEMM speed, on every backend with matmul.
Computed weights fall back to the float64 path (convert_qlinear.py).
"""
from __future__ import annotations

import numpy as np

from .convert import Context, converts
from .convert_integer_ops import matmul_integer_op
from .convert_nn import matmul
from .convert_qlinear import _along, _only, _opt
from .convert_qlinear import matmul_integer as matmul_integer_float64
from .ir import Unsupported, Value
from .onnx_node import OnnxNode

FLOAT32_EXACT = 2 ** 24  # every integer of magnitude below this is a float32
OPERAND_BOUND = 255  # |a - a_zero| for int8/uint8 a and a zero point of the same type


def exact_chunk(weights: np.ndarray) -> int:
    """Terms per float32 partial sum that stays exact for any int8/uint8 activations."""
    largest = max(float(np.abs(weights).max(initial=0.0)), 1.0)
    return max(1, int((FLOAT32_EXACT - 1) // (OPERAND_BOUND * largest)))


@converts("MatMulInteger")
def matmul_integer(ctx: Context, node: OnnxNode, args: list) -> list[Value | None]:
    done = matmul_integer_op(ctx, node, args)
    if done is not None:
        return list(done)
    b = ctx.b
    a, w = args[0], args[1]
    a_zero, w_zero = _opt(args, 2), _opt(args, 3)
    if w.const is None or w.rank != 2 or (w_zero is not None and w_zero.const is None) \
            or a.dtype not in ("int8", "uint8"):
        return list(matmul_integer_float64(ctx, node, args))
    centered = w.const.astype(np.float64)
    if w_zero is not None:
        zero = np.asarray(w_zero.const, np.float64).reshape(-1)
        if zero.size not in (1, w.shape[1]):
            raise Unsupported(f"b_zero_point of shape {w_zero.shape} for b {w.shape}")
        centered = centered - zero[None, :]
    a32 = b.cast(a, "float32")
    if a_zero is not None:
        a32 = b.op("subtract", a32, _along(ctx, b.cast(a_zero, "float32"), a,
                                           max(a.rank - 2, 0)))
    depth = w.shape[0]
    chunk = exact_chunk(centered)
    total: Value | None = None
    for start in range(0, depth, chunk):
        stop = min(start + chunk, depth)
        part = a32 if (start, stop) == (0, depth) else b.op(
            "strided_slice", a32, begin=[start], end=[stop], strides=[1], axes=[a.rank - 1])
        weights = b.const(centered[start:stop].astype(np.float32), "matmul_integer_w")
        y = b.cast(_only(matmul(ctx, node, [part, weights])), "int32")
        total = y if total is None else b.op("add", total, y)
    return [total]
