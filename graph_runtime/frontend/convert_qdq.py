"""Converters for the fused nodes of fuse_qdq.py (QConv -> qconv2d, QDense -> qdense, QAdd ->
qadd) and fuse_integer.py (IntegerToFloatMatMul / Conv -> dense_ / conv2d_integer_scaled)."""
from __future__ import annotations

import numpy as np

from .convert import Context, converts
from .convert_conv import _window_attrs
from .fusion.fuse_qdq import FUSED_DOMAIN
from .ir import Unsupported, Value
from .onnx_node import OnnxNode


def _fused_only(node: OnnxNode) -> None:
    """These names are the fusion's own: the same op type in ONNX's domain is unknown."""
    if node.domain != FUSED_DOMAIN:
        raise Unsupported("__unknown__")


@converts("QConv")
def qconv(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    _fused_only(node)
    x, w, m, bias = args[:4]
    if x.rank != 4:
        raise Unsupported(f"quantized convolution of a rank-{x.rank} input; 2-D only")
    strides, dilations, pads = _window_attrs(node, x, list(w.shape[2:]))
    return [ctx.b.op("qconv2d", x, w, m, bias, strides=strides, padding=pads,
                     dilation=dilations, groups=int(node.attr("group", 1)),
                     x_zero=int(node.attr("x_zero")), y_zero=int(node.attr("y_zero")),
                     relu=bool(node.attr("relu")), dtype=str(node.attr("dtype")))]


@converts("QDense")
def qdense(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    _fused_only(node)
    return [ctx.b.op("qdense", *args[:4], x_zero=int(node.attr("x_zero")),
                     y_zero=int(node.attr("y_zero")), relu=bool(node.attr("relu")),
                     dtype=str(node.attr("dtype")))]


@converts("QDenseAdd")
def qdense_add(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    _fused_only(node)
    names = [f"add_{k}" for k in ("a_scale", "a_zero", "b_scale", "b_zero", "y_scale", "y_zero")]
    adds = {k: node.attr(k) for k in names}
    return [ctx.b.op("qdense_add", *args[:5], x_zero=int(node.attr("x_zero")),
                     y_zero=int(node.attr("y_zero")), relu=bool(node.attr("relu")),
                     dtype=str(node.attr("dtype")), add_relu=bool(node.attr("add_relu")),
                     add_dtype=str(node.attr("add_dtype")), **adds)]


@converts("IntegerToFloatMatMul")
def integer_to_float_matmul(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    """fuse_integer.py's node: (x - x_zero) @ w * x_scale * w_scale + bias, float32."""
    _fused_only(node)
    x, x_zero, w, x_scale, w_scale, bias = args[:6]
    b = ctx.b
    if x_zero is None:
        x_zero = b.const(np.zeros((), x.dtype), "x_zero")
    return [b.op("dense_integer_scaled", x, b.reshape(x_zero, ()), w,
                 b.reshape(x_scale, ()), w_scale, bias)]


@converts("IntegerToFloatConv")
def integer_to_float_conv(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    """fuse_integer.py's node: conv(x - x_zero, w) * x_scale * w_scale + bias, float32."""
    _fused_only(node)
    x, x_zero, w, x_scale, w_scale, bias = args[:6]
    b = ctx.b
    if x_zero is None:
        x_zero = b.const(np.zeros((), x.dtype), "x_zero")
    strides, dilations, pads = _window_attrs(node, x, list(w.shape[2:]))
    return [b.op("conv2d_integer_scaled", x, b.reshape(x_zero, ()), w, b.reshape(x_scale, ()),
                 w_scale, bias, strides=strides, padding=pads, dilation=dilations,
                 groups=int(node.attr("group", 1)))]


@converts("QAdd")
def qadd(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    _fused_only(node)
    names = ("a_scale", "a_zero", "b_scale", "b_zero", "y_scale", "y_zero")
    attrs = {k: node.attr(k) for k in names}
    return [ctx.b.op("qadd", args[0], args[1], relu=bool(node.attr("relu")),
                     dtype=str(node.attr("dtype")), **attrs)]
