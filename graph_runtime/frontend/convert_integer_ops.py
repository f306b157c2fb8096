"""ConvInteger and MatMulInteger with constant int8 weights of zero point 0 (what ONNX Runtime's
quantize_dynamic writes) as the integer ops conv2d_integer / dense_integer: oneDNN's int8
primitives with an s32 result, exact (lib/ops/quantized.py). The converters of those ONNX ops
(convert_qlinear.py, convert_integer_gemm.py) ask here first; None means another form.
"""
from __future__ import annotations

import numpy as np

from .convert import Context
from .convert_conv import _window_attrs
from .fusion.fuse_qdq import int8_import
from .ir import Value
from .onnx_node import OnnxNode


def _opt(args: list, i: int) -> Value | None:
    return args[i] if i < len(args) else None


def _zero_weights(w: Value, w_zero: Value | None) -> bool:
    """Constant int8 weights whose zero point is absent or all zero."""
    if w.const is None or w.dtype != "int8":
        return False
    return w_zero is None or (w_zero.const is not None and not np.any(w_zero.const))


def _x_zero(ctx: Context, x: Value, zero: Value | None) -> Value | None:
    """x's zero point as a one-element tensor of x's dtype (0 when absent); None if another."""
    if zero is None:
        return ctx.b.const(np.zeros((), x.dtype), "x_zero")
    if zero.dtype != x.dtype or int(np.prod(zero.shape)) != 1:
        return None
    return zero


def conv_integer_op(ctx: Context, node: OnnxNode, args: list) -> list[Value] | None:
    """ConvInteger as conv2d_integer, or None."""
    x, w = args[0], args[1]
    if not int8_import() or x.rank != 4 or x.dtype not in ("uint8", "int8") \
            or not _zero_weights(w, _opt(args, 3)):
        return None
    zero = _x_zero(ctx, x, _opt(args, 2))
    if zero is None:
        return None
    strides, dilations, pads = _window_attrs(node, x, list(w.shape[2:]))
    return [ctx.b.op("conv2d_integer", x, zero, w, strides=strides, padding=pads,
                     dilation=dilations, groups=int(node.attr("group", 1)))]


def matmul_integer_op(ctx: Context, node: OnnxNode, args: list) -> list[Value] | None:
    """MatMulInteger as dense_integer, or None."""
    a, w = args[0], args[1]
    if not int8_import() or a.rank < 2 or w.rank != 2 or a.dtype not in ("uint8", "int8") \
            or not _zero_weights(w, _opt(args, 3)):
        return None
    zero = _x_zero(ctx, a, _opt(args, 2))
    if zero is None:
        return None
    return [ctx.b.op("dense_integer", a, zero, w)]
