"""qadd_layer_norm(a, b, sum_table, gamma, beta) -> y: Q(layer_norm(DQ(qadd(a, b))))
over the last axis, quantize_static's residual add and LayerNorm in one CPU op
(frontend/fusion/fuse_qdq_norm.py).

a, b: int8/uint8, b of a's shape or of its trailing dims (its rows repeated); sum_table: float32 (65536,), the LayerNorm's input per
(a byte * 256 + b byte): qadd's table composed with the sum's DQ; gamma, beta float32
(width,); attributes epsilon, y_scale, y_zero, y_dtype. The values the qadd node, the DQ ->
layer_norm -> Q chain and its kernels give (kernels/cpu/qlayer_norm.py).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ...backends.base import Backend
from ..attrs import float_attr, int_attr, op_error
from ..kernels.cpu.qlayer_norm import qadd_layer_norm_kernel
from ..kernels.cpu.quantized import QUANT_RANGES
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import check_num_inputs, check_vector, size_of
from .quantized import _check_int8

OP = "qadd_layer_norm"


def trailing(small: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether small, its leading ones dropped, is shape's trailing dims (a whole row at least),
    so that b's rows repeat along a's."""
    dims = list(small)
    while dims and dims[0] == 1:
        dims.pop(0)
    return len(dims) >= 1 and tuple(dims) == shape[len(shape) - len(dims):]


def _check(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> tuple[int, int, str]:
    """(rows, width, output dtype)."""
    check_num_inputs(OP, inputs, 5)
    for i, name in ((0, "a"), (1, "b")):
        _check_int8(OP, f"input {i} ({name})", inputs[i], ("int8", "uint8"))
    shape = tuple(inputs[0].shape)
    if not shape or not trailing(tuple(inputs[1].shape), shape):
        raise op_error(OP, f"a {shape} and b {tuple(inputs[1].shape)}: expected b of a's shape "
                           "or of its trailing dims (leading ones allowed)")
    width = shape[-1]
    for i, name, dtypes, size in ((2, "sum_table", ("float32",), 65536),
                                  (3, "gamma", ("float32",), width),
                                  (4, "beta", ("float32",), width)):
        check_vector(OP, inputs, i, name, dtypes, size)
    dtype = str(attrs.get("y_dtype", ""))
    if dtype not in QUANT_RANGES:
        raise op_error(OP, f"attribute y_dtype is {dtype!r}; expected 'int8' or 'uint8'")
    return size_of(shape) // max(width, 1), width, dtype


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    return [TensorSpec(tuple(inputs[0].shape), _check(inputs, attrs)[2])]


def _cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
         outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    rows, width, dtype = _check(inputs, attrs)
    lo, hi = QUANT_RANGES[dtype]
    params = (float(float_attr(OP, attrs, "y_scale")), int(int_attr(OP, attrs, "y_zero", 0)),
              int(lo), int(hi))
    b_rows = size_of(tuple(inputs[1].shape)) // max(width, 1)
    return qadd_layer_norm_kernel(rows, width, float(float_attr(OP, attrs, "epsilon")), params,
                                  b_rows)


define_op(OP, _infer, 5, ("epsilon", "y_scale", "y_zero", "y_dtype"))
kernel(OP, "cpu")(_cpu)
