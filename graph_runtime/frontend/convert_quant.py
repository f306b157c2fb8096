"""Converters for quantization and selection by mask: QuantizeLinear, DequantizeLinear, Compress."""
from __future__ import annotations

import numpy as np

from .convert import Context, const_input, converts, norm_axis
from .convert_data_dependent import compress_computed, is_computed
from .fold_quant import fold_dequantize, fold_quantize
from .fold_size import size_of_input
from .ir import Unsupported, Value, check_const_bytes
from .onnx_model import np_dtype
from .onnx_node import OnnxNode

# Integer types a quantized tensor may have, with their saturation range.
QUANT_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
                "uint16": (0, 65535), "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1),
                "uint2": (0, 3)}
# Narrow float types a quantized tensor may have: the cast itself rounds (to nearest even).
QUANT_FLOATS = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                "float4_e2m1fn")


def _per_axis(ctx: Context, node: OnnxNode, v: Value, x: Value) -> Value:
    """A scale or zero point shaped to broadcast against x (scalar, per axis, or blocked)."""
    if v.rank == 0 or (v.rank == 1 and v.shape[0] == 1):
        return ctx.b.reshape(v, ())
    axis = norm_axis(int(node.attr("axis", 1)), x.rank, node)
    block = int(node.attr("block_size", 0))
    if block > 0:
        if v.rank != x.rank:
            raise Unsupported(f"blocked quantization with parameters of shape {v.shape} for "
                              f"{x.shape}")
        if v.const is not None:
            made = list(v.shape)
            made[axis] *= block
            check_const_bytes(made, v.dtype, "the blocked quantization parameters")
            repeated = np.repeat(v.const, block, axis=axis)
            return ctx.b.const(np.take(repeated, np.arange(x.shape[axis]), axis=axis), v.name)
        # Each entry repeated block times along axis: a new axis after it, broadcast, merged.
        b = ctx.b
        nb = v.shape[axis]
        split = list(v.shape[:axis + 1]) + [1] + list(v.shape[axis + 1:])
        wide = list(v.shape[:axis + 1]) + [block] + list(v.shape[axis + 1:])
        merged = list(v.shape)
        merged[axis] = nb * block
        full = b.reshape(b.op("broadcast_to", b.reshape(v, split), shape=wide), merged)
        if nb * block == x.shape[axis]:
            return full
        return b.op("strided_slice", full, begin=[0], end=[x.shape[axis]], strides=[1],
                    axes=[axis])
    if v.rank != 1 or v.shape[0] != x.shape[axis]:
        raise Unsupported(f"parameters of shape {v.shape} for axis {axis} of {x.shape}")
    shape = [1] * x.rank
    shape[axis] = v.shape[0]
    return ctx.b.reshape(v, shape)


@converts("DequantizeLinear", fold=fold_dequantize, predict=size_of_input)
def dequantize(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x, scale = args[0], args[1]
    zero = args[2] if len(args) > 2 else None
    if x.dtype not in QUANT_RANGES and x.dtype not in QUANT_FLOATS and x.dtype != "int32":
        raise Unsupported(f"quantized dtype {x.dtype}")
    out = np_dtype(int(node.attr("output_dtype"))) if node.attr("output_dtype") else scale.dtype
    # As ONNX computes it: x as float32, minus the zero point in NumPy's promotion of the two.
    work = str(np.result_type(np.float32, np.dtype(zero.dtype))) if zero is not None \
        else "float32"
    dx = b.cast(b.cast(x, "float32"), work)
    if zero is not None:
        dx = b.op("subtract", dx, b.cast(_per_axis(ctx, node, zero, x), work))
    wide = str(np.result_type(np.dtype(work), np.dtype(scale.dtype)))
    y = b.op("multiply", b.cast(dx, wide), b.cast(_per_axis(ctx, node, scale, x), wide))
    return [b.cast(y, out)]


@converts("QuantizeLinear", fold=fold_quantize, predict=size_of_input)
def quantize(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x, scale = args[0], args[1]
    zero = args[2] if len(args) > 2 else None
    if node.attr("precision"):
        raise Unsupported("attribute precision")
    if zero is not None:
        out = zero.dtype
    elif node.attr("output_dtype"):
        out = np_dtype(int(node.attr("output_dtype")))
    else:
        out = "uint8"
    if out in QUANT_FLOATS:
        q = b.op("divide", x, b.cast(_per_axis(ctx, node, scale, x), x.dtype))
        if zero is not None:
            q = b.op("add", q, b.cast(_per_axis(ctx, node, zero, x), x.dtype))
        return [b.op("convert_type", q, dtype=out, saturate=int(node.attr("saturate", 1)))]
    if out not in QUANT_RANGES:
        raise Unsupported(f"quantized dtype {out}")
    lo, hi = QUANT_RANGES[out]
    q = b.op("round", b.op("divide", x, b.cast(_per_axis(ctx, node, scale, x), x.dtype)))
    qi = b.cast(q, "int32")
    if zero is not None:
        qi = b.op("add", qi, b.cast(_per_axis(ctx, node, zero, x), "int32"))
    return [b.cast(b.op("clip", qi, a_min=float(lo), a_max=float(hi)), out)]


@converts("Compress")
def compress(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    if len(args) > 1 and is_computed(args[1]):
        return compress_computed(ctx, node, args)
    condition = const_input(node, args, 1, "condition")
    if condition is None:
        raise Unsupported("condition is missing")
    picked = np.nonzero(np.asarray(condition).reshape(-1).astype(bool))[0].astype(np.int64)
    if node.attr("axis") is None:
        flat = b.reshape(x, (int(np.prod(x.shape)),))
        return [b.op("take", flat, b.const(picked, "picked"), axis=0, mode="clip")]
    axis = norm_axis(int(node.attr("axis")), x.rank, node)
    if len(picked) and picked[-1] >= x.shape[axis]:
        raise Unsupported(f"condition selects index {picked[-1]} of an axis of size "
                          f"{x.shape[axis]}")
    return [b.op("take", x, b.const(picked, "picked"), axis=axis, mode="clip")]
