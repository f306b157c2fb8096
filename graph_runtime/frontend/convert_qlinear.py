"""Converters for integer arithmetic on quantized tensors: QLinearMatMul, QLinearConv,
MatMulInteger, ConvInteger, DynamicQuantizeLinear.

The integer products are computed exactly: operands minus their zero points as float64, whose
53-bit mantissa holds every int8/uint8 dot product of up to 2^37 terms without rounding (a
convolution's result is rounded back to the integer its fast algorithms may miss by 1e-12).
The requantisation then follows ONNX's definition step by step: the scale product in the scales'
dtype, the accumulator times it in float64, round half to even, add the zero point, saturate.
"""
from __future__ import annotations

import numpy as np

from .convert import Context, converts
from .convert_conv import conv
from .convert_integer_ops import conv_integer_op
from .fusion.fuse_qdq import FUSED_DOMAIN
from .convert_nn import matmul
from .ir import Unsupported, Value
from .onnx_node import OnnxNode

INT_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def _centered(ctx: Context, x: Value, zero: Value | None, row_axis: int | None) -> Value:
    """x - zero as float64 (exact); a 1-D zero point runs along row_axis (None: last axis)."""
    b = ctx.b
    if x.dtype not in INT_RANGES:
        raise Unsupported(f"quantized input of dtype {x.dtype}; expected int8 or uint8")
    x64 = b.cast(x, "float64")
    if zero is None:
        return x64
    return b.op("subtract", x64, _along(ctx, b.cast(zero, "float64"), x, row_axis))


def _along(ctx: Context, v: Value, x: Value, axis: int | None) -> Value:
    """A scalar, a 1-element or a 1-D parameter shaped to broadcast against x along axis."""
    if v.rank == 0 or v.shape == (1,):
        return ctx.b.reshape(v, ())
    if v.rank != 1:
        raise Unsupported(f"quantization parameter of shape {v.shape}; expected a scalar or 1-D")
    axis = x.rank - 1 if axis is None else axis
    if v.shape[0] != x.shape[axis]:
        raise Unsupported(f"quantization parameter of shape {v.shape} for axis {axis} of "
                          f"{x.shape}")
    shape = [1] * x.rank
    shape[axis] = v.shape[0]
    return ctx.b.reshape(v, shape)


def _requantize(ctx: Context, acc: Value, scale: Value, zero: Value | None, out: str) -> Value:
    """saturate(rint(acc * scale) + zero) as out, acc and scale broadcast (float64 math)."""
    b = ctx.b
    y = b.op("multiply", acc, b.cast(scale, "float64"))
    if zero is not None:
        y = b.op("add", y, b.cast(zero, "float64"))
    if out not in INT_RANGES:
        raise Unsupported(f"a quantized output of {out}; expected one of "
                          f"{', '.join(INT_RANGES)} (the zero point's type)")
    lo, hi = INT_RANGES[out]
    return b.cast(b.op("clip", b.op("round", y), a_min=float(lo), a_max=float(hi)), out)


def _only(values: object) -> Value:
    """The one output of a converter reused here (matmul, conv)."""
    assert isinstance(values, list) and isinstance(values[0], Value)  # cannot happen
    return values[0]


def _opt(args: list, i: int) -> Value | None:
    return args[i] if i < len(args) else None


def matmul_integer(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    """MatMulInteger in float64 (convert_integer_gemm.py's converter falls back to it)."""
    a, w = args[0], args[1]
    a64 = _centered(ctx, a, _opt(args, 2), max(a.rank - 2, 0))
    w64 = _centered(ctx, w, _opt(args, 3), None)
    y = _only(matmul(ctx, node, [a64, w64]))
    return [ctx.b.cast(y, "int32")]


@converts("ConvInteger")
def conv_integer(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    done = conv_integer_op(ctx, node, args)
    if done is not None:
        return done
    x, w = args[0], args[1]
    x64 = _centered(ctx, x, _opt(args, 2), None)
    w64 = _centered(ctx, w, _opt(args, 3), 0)
    y = _only(conv(ctx, node, [x64, w64]))
    return [ctx.b.cast(ctx.b.op("round", y), "int32")]


@converts("QLinearMatMul")
def qlinear_matmul(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    a, a_scale, a_zero, w, w_scale, w_zero, y_scale, y_zero = args[:8]
    row = max(a.rank - 2, 0)
    a64 = _centered(ctx, a, a_zero, row)
    w64 = _centered(ctx, w, w_zero, None)
    acc = _only(matmul(ctx, node, [a64, w64]))
    # As ONNX: a_scale * b_scale / y_scale in the scales' dtype, then widened.
    scale = b.op("divide", b.op("multiply", _along(ctx, a_scale, acc, acc.rank - 2),
                                _along(ctx, w_scale, acc, None)), y_scale)
    out = y_zero.dtype if y_zero is not None else a.dtype
    return [_requantize(ctx, acc, scale, y_zero, out)]


@converts("QLinearConv")
def qlinear_conv(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero = args[:8]
    bias = _opt(args, 8)
    x64 = _centered(ctx, x, x_zero, None)
    w64 = _centered(ctx, w, w_zero, 0)
    conv_args = [x64, w64] + ([b.cast(bias, "float64")] if bias is not None else [])
    acc = _only(conv(ctx, node, conv_args))
    acc = b.op("round", acc)
    scale = b.op("divide", b.op("multiply", b.reshape(x_scale, ()) if x_scale.rank else x_scale,
                                _along(ctx, w_scale, acc, 1)), y_scale)
    out = y_zero.dtype if y_zero is not None else x.dtype
    return [_requantize(ctx, acc, scale, y_zero, out)]


@converts("DynamicQuantizeLinear")
def dynamic_quantize(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    """Where only the integer ops read y (fuse_integer.py gives the node FUSED_DOMAIN), one
    CPU op with ONNX's float32 steps in one compiled kernel; else the same steps as ops every
    device has."""
    b = ctx.b
    x = args[0]
    if x.dtype != "float32":
        raise Unsupported(f"input of dtype {x.dtype}; expected float32")
    if node.domain == FUSED_DOMAIN:  # read by integer ops only (fuse_integer.py)
        return list(b.ops("dynamic_quantize", [x]))
    zero = b.const(np.float32(0), "zero")
    high = b.op("maximum", b.op("max", x, axis=None, keepdims=False), zero)
    low = b.op("minimum", b.op("min", x, axis=None, keepdims=False), zero)
    span = b.op("subtract", high, low)
    # max == min only when both are 0 (the range always holds 0): the scale is then 1/255.
    span = b.op("where", b.op("equal", span, zero), b.const(np.float32(1), "one"), span)
    scale = b.op("divide", span, b.const(np.float32(255), "qrange"))
    start = b.op("subtract", zero, b.op("divide", low, scale))
    zero_point = b.op("round", b.op("clip", start, a_min=0.0, a_max=255.0))
    y = b.op("add", b.op("round", b.op("divide", x, scale)), zero_point)
    # NOTE: through int32 (the values are whole and in [0, 255] after the clip, NaN aside): a
    # float -> int32 cast compiles in a chain's loop (chain_jit.py), a float -> uint8 one not.
    y = b.cast(b.cast(b.op("clip", y, a_min=0.0, a_max=255.0), "int32"), "uint8")
    return [y, scale, b.cast(zero_point, "uint8")]
