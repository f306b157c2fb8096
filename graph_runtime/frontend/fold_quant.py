"""QuantizeLinear and DequantizeLinear of constants folded at import, step by step as their
converters (convert_quant.py) compute them at run time.

ONNX's reference evaluator has these ops from opset 19 only: before this, a quantized model of
opset 13-17 (what quantize_static writes for PyTorch's exports) kept every constant's
DequantizeLinear (LayerNorm weights, embeddings, biases) as a run-time node. Per-axis parameters
are folded too; blocked ones, 4-bit and float8 types stay with the converters (Unsupported).
"""
from __future__ import annotations

import numpy as np

from .ir import Unsupported
from .onnx_node import OnnxNode

INTEGER_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
                  "uint16": (0, 65535)}


def _per_axis(node: OnnxNode, v: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A scale or zero point shaped to broadcast against x (one value, or one per axis)."""
    if int(node.attr("block_size", 0)):
        raise Unsupported("blocked parameters are folded by the converter")
    if v.ndim == 0 or v.shape == (1,):
        return v.reshape(())
    axis = int(node.attr("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    if v.ndim != 1 or not 0 <= axis < x.ndim or v.shape[0] != x.shape[axis]:
        raise Unsupported(f"parameters of shape {v.shape} for axis {axis} of {x.shape}")
    shape = [1] * x.ndim
    shape[axis] = v.shape[0]
    return v.reshape(shape)


def fold_dequantize(node: OnnxNode, x: np.ndarray, scale: np.ndarray,
                    zero: np.ndarray | None = None) -> list[np.ndarray]:
    """(x - zero) * scale: x as float32, then NumPy's promotion with the zero point's type,
    then with the scale's (convert_quant.dequantize)."""
    from .onnx_model import np_dtype
    if str(x.dtype) not in INTEGER_RANGES and x.dtype != np.int32:
        raise Unsupported(f"quantized dtype {x.dtype} is folded by the converter")
    out = np_dtype(int(node.attr("output_dtype"))) if node.attr("output_dtype") else scale.dtype
    work = np.result_type(np.float32, zero.dtype) if zero is not None else np.dtype(np.float32)
    dx = x.astype(np.float32).astype(work)
    if zero is not None:
        dx = dx - _per_axis(node, zero, x).astype(work)
    wide = np.result_type(work, scale.dtype)
    return [(dx.astype(wide) * _per_axis(node, scale, x).astype(wide)).astype(out)]


def fold_quantize(node: OnnxNode, x: np.ndarray, scale: np.ndarray,
                  zero: np.ndarray | None = None) -> list[np.ndarray]:
    """saturate(rint(x / scale) + zero): the quotient in x's type, rounded half to even, as
    int32 (NaN and overflow give int32's minimum, as the run-time cast does), plus the zero
    point, clipped (convert_quant.quantize)."""
    from .onnx_model import np_dtype
    if node.attr("precision") or x.dtype.kind != "f":
        raise Unsupported("folded by the converter")
    out = str(zero.dtype) if zero is not None else (
        str(np_dtype(int(node.attr("output_dtype")))) if node.attr("output_dtype") else "uint8")
    if out not in INTEGER_RANGES:
        raise Unsupported(f"quantized dtype {out} is folded by the converter")
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint(x / _per_axis(node, scale, x).astype(x.dtype)).astype(np.int32)
        if zero is not None:
            q = q + _per_axis(node, zero, x).astype(np.int32)
    lo, hi = INTEGER_RANGES[out]
    return [np.clip(q, lo, hi).astype(out)]
