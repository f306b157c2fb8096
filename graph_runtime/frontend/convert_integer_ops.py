"""ConvInteger and MatMulInteger with constant int8 weights of zero point 0 (what ONNX Runtime's
quantize_dynamic writes) as the integer ops conv2d_integer / dense_integer: oneDNN's int8
primitives with an s32 result, exact (lib/ops/quantized.py). Other forms keep the converters
registered before this module (convert_qlinear.py, convert_integer_gemm.py).
"""
from __future__ import annotations

import numpy as np

from .convert import CONVERTERS, Context, converts
from .convert_conv import _window_attrs
from .convert_qlinear import _opt
from .ir import Value
from .onnx_node import OnnxNode

_conv_integer_before = CONVERTERS["ConvInteger"]
_matmul_integer_before = CONVERTERS["MatMulInteger"]


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


@converts("ConvInteger")
def conv_integer(ctx: Context, node: OnnxNode, args: list) -> list[Value | None]:
    x, w = args[0], args[1]
    zero = _x_zero(ctx, x, _opt(args, 2))
    if x.rank != 4 or x.dtype not in ("uint8", "int8") or zero is None \
            or not _zero_weights(w, _opt(args, 3)):
        return list(_conv_integer_before(ctx, node, args))
    strides, dilations, pads = _window_attrs(node, x, list(w.shape[2:]))
    return [ctx.b.op("conv2d_integer", x, zero, w, strides=strides, padding=pads,
                     dilation=dilations, groups=int(node.attr("group", 1)))]


@converts("MatMulInteger")
def matmul_integer(ctx: Context, node: OnnxNode, args: list) -> list[Value | None]:
    a, w = args[0], args[1]
    zero = _x_zero(ctx, a, _opt(args, 2))
    if a.rank < 2 or w.rank != 2 or a.dtype not in ("uint8", "int8") or zero is None \
            or not _zero_weights(w, _opt(args, 3)):
        return list(_matmul_integer_before(ctx, node, args))
    return [ctx.b.op("dense_integer", a, zero, w)]
