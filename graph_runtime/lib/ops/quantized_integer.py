"""The integer ops of quantize_dynamic's models: conv2d_integer, dense_integer, their float-output
forms, and dynamic_quantize.

conv2d_integer(x, x_zero, w), dense_integer(x, x_zero, w) -> int32: ConvInteger's and
MatMulInteger's exact accumulators for int8 weights with zero point 0 (quantize_dynamic's), x's
zero point a one-element tensor (DynamicQuantizeLinear computes it each run).

dense_integer_scaled(x, x_zero, w, x_scale, w_scale, bias) -> float32: dense_integer's
accumulator as float32 times float32(x_scale * w_scale[n]) plus bias[n] (fuse_integer.py);
conv2d_integer_scaled the same for conv2d_integer, per output channel.

dynamic_quantize(x) -> (y, scale, zero point): DynamicQuantizeLinear in one kernel
(kernels/cpu/dynamic_quantize.py).

dense_dynamic_scaled(x, w, w_scale, bias) -> float32: dynamic_quantize of float32 x, then
dense_integer_scaled of its three results, in one call (frontend/fusion/fuse_dynamic.py): the same
values, one node instead of two.

CPU only, as quantized.py's: oneDNN's int8 primitives where the library is here, exact float64
products otherwise.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import op_error
from ..conv_params import CONV_ATTRS, ConvParams, conv2d_params
from ..kernels.cpu.dynamic_quantize import dynamic_quantize_kernel
from ..kernels.cpu.quantized import (conv2d_integer_reference, conv2d_integer_scaled_reference,
                                       dense_integer_reference, dense_integer_scaled_reference)
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import check_num_inputs, size_of
from .quantized import Forward, _check_int8

def _integer_inputs(op: str, inputs: Sequence[TensorSpec]) -> None:
    check_num_inputs(op, inputs, 3)
    _check_int8(op, "input 0 (x)", inputs[0], ("uint8", "int8"))
    _check_int8(op, "input 1 (x_zero)", inputs[1], (inputs[0].dtype,))
    if size_of(inputs[1].shape) != 1:
        raise op_error(op, f"input 1 (x_zero) has shape {tuple(inputs[1].shape)}; expected one "
                           "value")
    _check_int8(op, "input 2 (w)", inputs[2], ("int8",))


def _conv_integer_params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> ConvParams:
    _integer_inputs("conv2d_integer", inputs)
    specs = [TensorSpec(tuple(inputs[i].shape), "float64") for i in (0, 2)]
    return conv2d_params(specs, attrs)


def _conv_integer_infer(inputs: Sequence[TensorSpec],
                        attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = _conv_integer_params(inputs, attrs)
    return [TensorSpec((p.n, p.o, p.oh, p.ow), "int32")]


def _conv_integer_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                      outputs: Sequence[TensorSpec],
                      attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.onednn.choice import onednn_int8_or
    from ..kernels.onednn.int8_conv import Int8Conv, int8_conv_applies
    p = _conv_integer_params(inputs, attrs)

    def onednn() -> Callable[..., None]:
        made = Int8Conv(p, inputs[0].dtype, "int32", None, 0, False)
        return Forward(made, made.integer)
    return onednn_int8_or("conv2d_integer", int8_conv_applies(p, inputs[0].dtype,
                                                              inputs[2].dtype),
                          onednn, lambda: conv2d_integer_reference(p))


def _dense_integer_infer(inputs: Sequence[TensorSpec],
                         attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _integer_inputs("dense_integer", inputs)
    x, w = tuple(inputs[0].shape), tuple(inputs[2].shape)
    if len(w) != 2 or not x or x[-1] != w[0]:
        raise op_error("dense_integer", f"x {x} and w {w}: expected (..., K) and (K, N)")
    return [TensorSpec(x[:-1] + (w[1],), "int32")]


def _dense_integer_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                       outputs: Sequence[TensorSpec],
                       attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.onednn.choice import onednn_int8_or
    from ..kernels.onednn.int8_matmul import Int8Matmul, int8_matmul_applies
    k, n = tuple(inputs[2].shape)
    rows = size_of(inputs[0].shape) // max(k, 1)

    def onednn() -> Callable[..., None]:
        made = Int8Matmul(rows, n, k, inputs[0].dtype, "int32", None, 0, False)

        def run(x: Any, x_zero: Any, w: Any, out: Any) -> None:
            made.integer(x.reshape(rows, k), x_zero, w, out.reshape(rows, n))
        return Forward(made, run)
    return onednn_int8_or("dense_integer",
                          int8_matmul_applies(inputs[0].dtype, inputs[2].dtype, rows, n, k),
                          onednn, dense_integer_reference)


def _scaled_check(inputs: Sequence[TensorSpec]) -> tuple[int, int, int]:
    """(rows, N, K) of dense_integer_scaled(x, x_zero, w, x_scale, w_scale, bias)."""
    check_num_inputs("dense_integer_scaled", inputs, 6)
    _integer_inputs("dense_integer_scaled", inputs[:3])
    x, w = tuple(inputs[0].shape), tuple(inputs[2].shape)
    if len(w) != 2 or not x or x[-1] != w[0]:
        raise op_error("dense_integer_scaled", f"x {x} and w {w}: expected (..., K) and (K, N)")
    for i, shape in ((3, ()), (4, (w[1],)), (5, (w[1],))):
        if inputs[i].dtype != "float32" or tuple(inputs[i].shape) != shape:
            raise op_error("dense_integer_scaled", f"input {i} is {inputs[i].dtype} "
                                                   f"{tuple(inputs[i].shape)}; expected float32 "
                                                   f"{shape}")
    return size_of(x) // max(w[0], 1), w[1], w[0]


def _scaled_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _scaled_check(inputs)
    return [TensorSpec(tuple(inputs[0].shape[:-1]) + (inputs[2].shape[1],), "float32")]


def _scaled_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.onednn.choice import onednn_int8_or
    from ..kernels.onednn.int8_matmul import Int8Matmul, int8_matmul_applies
    rows, n, k = _scaled_check(inputs)

    def onednn() -> Callable[..., None]:
        made = Int8Matmul(rows, n, k, inputs[0].dtype, "float32", None, 0, False)

        def run(x: Any, x_zero: Any, w: Any, x_scale: Any, w_scale: Any, bias: Any,
                out: Any) -> None:
            made.scaled(x.reshape(rows, k), x_zero, w, x_scale, w_scale, bias,
                        out.reshape(rows, n))
        return Forward(made, run)
    return onednn_int8_or("dense_integer_scaled",
                          int8_matmul_applies(inputs[0].dtype, inputs[2].dtype, rows, n, k),
                          onednn, dense_integer_scaled_reference)


def _dynamic_scaled_check(inputs: Sequence[TensorSpec]) -> tuple[int, int, int]:
    """(rows, N, K) of dense_dynamic_scaled(x, w, w_scale, bias)."""
    check_num_inputs("dense_dynamic_scaled", inputs, 4)
    _check_int8("dense_dynamic_scaled", "input 0 (x)", inputs[0], ("float32",))
    x = tuple(inputs[0].shape)
    _scaled_check([TensorSpec(x, "uint8"), TensorSpec((), "uint8"), inputs[1],
                   TensorSpec((), "float32"), inputs[2], inputs[3]])
    k, n = tuple(inputs[1].shape)
    return size_of(x) // max(k, 1), n, k


def _dynamic_scaled_infer(inputs: Sequence[TensorSpec],
                          attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _dynamic_scaled_check(inputs)
    return [TensorSpec(tuple(inputs[0].shape[:-1]) + (inputs[1].shape[1],), "float32")]


def _dynamic_scaled_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                        outputs: Sequence[TensorSpec],
                        attrs: Mapping[str, Any]) -> Callable[..., None]:
    """dynamic_quantize's kernel into a scratch array, then dense_integer_scaled's."""
    rows, n, k = _dynamic_scaled_check(inputs)
    quantize = dynamic_quantize_kernel(rows * k)
    q = np.empty((rows, k), np.uint8)
    x_scale, x_zero = np.empty((), np.float32), np.empty((), np.uint8)
    specs = [TensorSpec((rows, k), "uint8"), TensorSpec((), "uint8"), inputs[1],
             TensorSpec((), "float32"), inputs[2], inputs[3]]
    scaled = _scaled_cpu(backend, device_id, specs, [TensorSpec((rows, n), "float32")], attrs)
    if isinstance(scaled, Forward):
        scaled.kernel.derived = (1,)  # the weight's position among this op's inputs

    def run(x: Any, w: Any, w_scale: Any, bias: Any, out: Any) -> None:
        quantize(x, q, x_scale, x_zero)
        scaled(q, x_zero, w, x_scale, w_scale, bias, out.reshape(rows, n))
    return Forward(scaled, run, q.nbytes) if isinstance(scaled, Forward) else run


def _conv_scaled_params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> ConvParams:
    check_num_inputs("conv2d_integer_scaled", inputs, 6)
    p = _conv_integer_params(inputs[:3], attrs)
    for i, shape in ((3, ()), (4, (p.o,)), (5, (p.o,))):
        if inputs[i].dtype != "float32" or tuple(inputs[i].shape) != shape:
            raise op_error("conv2d_integer_scaled", f"input {i} is {inputs[i].dtype} "
                                                    f"{tuple(inputs[i].shape)}; expected "
                                                    f"float32 {shape}")
    return p


def _conv_scaled_infer(inputs: Sequence[TensorSpec],
                       attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = _conv_scaled_params(inputs, attrs)
    return [TensorSpec((p.n, p.o, p.oh, p.ow), "float32")]


def _conv_scaled_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                     outputs: Sequence[TensorSpec],
                     attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.onednn.choice import onednn_int8_or
    from ..kernels.onednn.int8_conv import Int8Conv, int8_conv_applies
    p = _conv_scaled_params(inputs, attrs)

    def onednn() -> Callable[..., None]:
        made = Int8Conv(p, inputs[0].dtype, "float32", None, 0, False)
        return Forward(made, made.scaled)
    return onednn_int8_or("conv2d_integer_scaled", int8_conv_applies(p, inputs[0].dtype,
                                                                     inputs[2].dtype),
                          onednn, lambda: conv2d_integer_scaled_reference(p))


def _dynamic_quantize_infer(inputs: Sequence[TensorSpec],
                            attrs: Mapping[str, Any]) -> list[TensorSpec]:
    check_num_inputs("dynamic_quantize", inputs, 1)
    _check_int8("dynamic_quantize", "input 0", inputs[0], ("float32",))
    return [TensorSpec(tuple(inputs[0].shape), "uint8"), TensorSpec((), "float32"),
            TensorSpec((), "uint8")]


def _dynamic_quantize_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                          outputs: Sequence[TensorSpec],
                          attrs: Mapping[str, Any]) -> Callable[..., None]:
    return dynamic_quantize_kernel(size_of(inputs[0].shape))


define_op("conv2d_integer", _conv_integer_infer, 3, CONV_ATTRS)
kernel("conv2d_integer", "cpu")(_conv_integer_cpu)
define_op("dense_integer", _dense_integer_infer, 3)
kernel("dense_integer", "cpu")(_dense_integer_cpu)
define_op("conv2d_integer_scaled", _conv_scaled_infer, 6, CONV_ATTRS)
kernel("conv2d_integer_scaled", "cpu")(_conv_scaled_cpu)
define_op("dense_integer_scaled", _scaled_infer, 6)
kernel("dense_integer_scaled", "cpu")(_scaled_cpu)
define_op("dense_dynamic_scaled", _dynamic_scaled_infer, 4)
kernel("dense_dynamic_scaled", "cpu")(_dynamic_scaled_cpu)
define_op("dynamic_quantize", _dynamic_quantize_infer, 1)
kernel("dynamic_quantize", "cpu")(_dynamic_quantize_cpu)
