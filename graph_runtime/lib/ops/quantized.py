"""Quantized standard ops the QDQ fusion emits (frontend/fusion/fuse_qdq.py): qconv2d, qdense, qadd
(quantize_dynamic's integer ops: quantized_integer.py).

qconv2d(x, w, m, b) -> y: x (N, C, H, W) uint8/int8 with zero point x_zero, w (O, C/groups,
kh, kw) int8 (zero point 0), m and b float32 (O,): y = saturate(rint(relu?(float32(acc) * m[o]
+ b[o])) + y_zero) as dtype, acc the exact integer conv of (x - x_zero) and w. The QDQ form
DequantizeLinear -> Conv (+ Relu) -> QuantizeLinear is this with m = x_scale * w_scale /
y_scale and b = bias / y_scale.

qdense(x, w, m, b) -> y: the same for x (..., K) and w (K, N) int8, m and b per column.

qdense_add(x, w, m, b, c) -> y: qadd(qdense(x, w, m, b), c) for a constant c of one value or
one per column (a bias quantized on its own), in one call (frontend/fusion/fuse_qdq_bias.py).

qadd(a, b) -> y: Q(relu?(DQ(a) + DQ(b))) with the six scales and zero points as attributes,
float32 steps as ONNX defines DequantizeLinear, Add and QuantizeLinear.

CPU only: oneDNN's int8 convolution and matmul where the library is here
(kernels/onednn/int8_conv.py, int8_matmul.py), exact float64 products otherwise
(kernels/cpu/quantized.py).
"""
from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import bool_attr, float_attr, int_attr, op_error, str_attr
from ..conv_params import CONV_ATTRS, ConvParams, conv2d_params
from ..kernels.cpu.quantized import (QUANT_RANGES, qadd_kernel, qadd_table, qconv2d_reference,
                                       qdense_reference)
from ..library import TensorSpec
from ..prepared import PreparedKernel
from ..registry import define_op, kernel
from ..shapes import check_num_inputs

QCONV_ATTRS = CONV_ATTRS + ("x_zero", "y_zero", "relu", "dtype")
QADD_ATTRS = ("a_scale", "a_zero", "b_scale", "b_zero", "y_scale", "y_zero", "relu", "dtype")


def _out_dtype(op: str, attrs: Mapping[str, Any]) -> str:
    return str(str_attr(op, attrs, "dtype", "uint8", tuple(QUANT_RANGES)))


def _check_int8(op: str, what: str, spec: TensorSpec, allowed: Sequence[str]) -> None:
    if spec.dtype not in allowed:
        raise op_error(op, f"{what} is {spec.dtype}; expected {' or '.join(allowed)}")


def qconv2d_params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> ConvParams:
    """The conv's geometry (as float64: the reference kernel's accumulator type)."""
    check_num_inputs("qconv2d", inputs, 4)
    _check_int8("qconv2d", "input 0 (x)", inputs[0], ("uint8", "int8"))
    _check_int8("qconv2d", "input 1 (w)", inputs[1], ("int8",))
    conv_attrs = {k: v for k, v in attrs.items() if k in CONV_ATTRS}
    p = conv2d_params([TensorSpec(tuple(s.shape), "float64") for s in inputs[:2]], conv_attrs)
    for i in (2, 3):
        if inputs[i].dtype != "float32" or tuple(inputs[i].shape) != (p.o,):
            raise op_error("qconv2d", f"input {i} is {inputs[i].dtype} {tuple(inputs[i].shape)};"
                                      f" expected float32 ({p.o},)")
    return p


def _qconv2d_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = qconv2d_params(inputs, attrs)
    return [TensorSpec((p.n, p.o, p.oh, p.ow), _out_dtype("qconv2d", attrs))]


def _qconv2d_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.onednn.choice import onednn_int8_or
    from ..kernels.onednn.int8_conv import Int8Conv, int8_conv_applies
    p = qconv2d_params(inputs, attrs)
    x_zero = int(int_attr("qconv2d", attrs, "x_zero", 0))
    y_zero = int(int_attr("qconv2d", attrs, "y_zero", 0))
    relu = bool_attr("qconv2d", attrs, "relu", False)
    return onednn_int8_or(
        "qconv2d", int8_conv_applies(p, inputs[0].dtype, inputs[1].dtype),
        lambda: Int8Conv(p, inputs[0].dtype, outputs[0].dtype, x_zero, y_zero, relu),
        lambda: qconv2d_reference(p, x_zero, y_zero, relu))


def _qdense_check(inputs: Sequence[TensorSpec]) -> tuple[int, int, int]:
    """(rows, N, K) of qdense(x (..., K), w (K, N), m (N,), b (N,))."""
    check_num_inputs("qdense", inputs, 4)
    _check_int8("qdense", "input 0 (x)", inputs[0], ("uint8", "int8"))
    _check_int8("qdense", "input 1 (w)", inputs[1], ("int8",))
    x, w = tuple(inputs[0].shape), tuple(inputs[1].shape)
    if len(w) != 2 or not x or x[-1] != w[0]:
        raise op_error("qdense", f"x {x} and w {w}: expected (..., K) and (K, N)")
    for i in (2, 3):
        if inputs[i].dtype != "float32" or tuple(inputs[i].shape) != (w[1],):
            raise op_error("qdense", f"input {i} is {inputs[i].dtype} {tuple(inputs[i].shape)};"
                                     f" expected float32 ({w[1]},)")
    rows = 1
    for d in x[:-1]:
        rows *= d
    return rows, w[1], w[0]


def _qdense_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _qdense_check(inputs)
    shape = tuple(inputs[0].shape[:-1]) + (inputs[1].shape[1],)
    return [TensorSpec(shape, _out_dtype("qdense", attrs))]


def _qdense_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.onednn.choice import onednn_int8_or
    from ..kernels.onednn.int8_matmul import Int8Matmul, int8_matmul_applies
    rows, n, k = _qdense_check(inputs)
    x_zero = int(int_attr("qdense", attrs, "x_zero", 0))
    y_zero = int(int_attr("qdense", attrs, "y_zero", 0))
    relu = bool_attr("qdense", attrs, "relu", False)
    kernel = onednn_int8_or(
        "qdense", int8_matmul_applies(inputs[0].dtype, inputs[1].dtype, rows, n, k),
        lambda: Int8Matmul(rows, n, k, inputs[0].dtype, outputs[0].dtype, x_zero, y_zero, relu),
        lambda: qdense_reference(x_zero, y_zero, relu))

    def run(x: Any, w: Any, m: Any, b: Any, out: Any) -> None:
        kernel(x.reshape(rows, k), w, m, b, out.reshape(rows, n))
    return Forward(kernel, run) if isinstance(kernel, PreparedKernel) else run


class Forward(PreparedKernel):
    """A prepared kernel run through `call` (a reshaping or argument-reordering wrapper), its
    capabilities kept."""

    def __init__(self, kernel: Any, call: Callable[..., None], extra_bytes: int = 0) -> None:
        self.kernel = kernel
        self.call = call
        self.extra_bytes = extra_bytes  # scratch the wrapper itself keeps

    def __call__(self, *arrays: Any) -> None:
        self.call(*arrays)

    def workspace_bytes(self) -> int:
        return int(self.kernel.workspace_bytes()) + self.extra_bytes

    def workspace_items(self) -> list[tuple[Any, int]]:
        return ([(self, self.extra_bytes)] if self.extra_bytes else []) + \
            self.kernel.workspace_items()

    def cached_inputs(self) -> Sequence[int]:
        return tuple(self.kernel.cached_inputs())

    def bind_versions(self, versions: Mapping[int, Any]) -> None:
        self.kernel.bind_versions(versions)

    def uses_workers(self) -> bool:
        return bool(self.kernel.uses_workers())

    def channels_last_positions(self) -> Sequence[int]:
        return tuple(self.kernel.channels_last_positions())

    def use_channels_last(self, positions: Collection[int]) -> None:
        self.kernel.use_channels_last(positions)

    def __repr__(self) -> str:
        return repr(self.kernel)


def _qadd_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    check_num_inputs("qadd", inputs, 2)
    for i, spec in enumerate(inputs):
        _check_int8("qadd", f"input {i}", spec, ("uint8", "int8"))
    try:
        from numpy import broadcast_shapes
        shape = broadcast_shapes(tuple(inputs[0].shape), tuple(inputs[1].shape))
    except ValueError:
        raise op_error("qadd", f"shapes {tuple(inputs[0].shape)} and "
                               f"{tuple(inputs[1].shape)} do not broadcast") from None
    return [TensorSpec(tuple(shape), _out_dtype("qadd", attrs))]


class QAdd(PreparedKernel):
    """qadd over flat memory; operands of one 4-D shape may all be NHWC (same bytes order)."""

    def __init__(self, run: Callable[..., None], same_4d: bool) -> None:
        self.run = run
        self.same_4d = same_4d

    def __call__(self, a: Any, b: Any, out: Any) -> None:
        self.run(a, b, out)

    def channels_last_positions(self) -> Sequence[int]:
        return (0, 1, 2) if self.same_4d else ()

    def use_channels_last(self, positions: Collection[int]) -> None:
        """Nothing to change: run() reads whatever layout the three share."""


def _qadd_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
              outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    scales = tuple(float(float_attr("qadd", attrs, k)) for k in ("a_scale", "b_scale", "y_scale"))
    zeros = tuple(int(int_attr("qadd", attrs, k, 0)) for k in ("a_zero", "b_zero", "y_zero"))
    same = tuple(inputs[0].shape) == tuple(inputs[1].shape) == tuple(outputs[0].shape)
    table = qadd_table(scales, zeros, bool_attr("qadd", attrs, "relu", False),  # type: ignore
                       inputs[0].dtype, inputs[1].dtype, outputs[0].dtype)
    run = qadd_kernel(table, tuple(inputs[0].shape), tuple(inputs[1].shape),
                      tuple(outputs[0].shape))
    return QAdd(run, same and len(outputs[0].shape) == 4)


def _qdense_add_parts(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]
                      ) -> tuple[TensorSpec, TensorSpec, dict[str, Any], dict[str, Any]]:
    """(qdense's result, the sum's spec, qdense's attrs, qadd's attrs) of qdense_add."""
    dense_attrs = {k: v for k, v in attrs.items() if not k.startswith("add_")}
    add_attrs = {k[4:]: v for k, v in attrs.items() if k.startswith("add_")}
    (dense,) = _qdense_infer(inputs[:4], dense_attrs)
    (total,) = _qadd_infer([dense, inputs[4]], add_attrs)
    if tuple(total.shape) != tuple(dense.shape):
        raise op_error("qdense_add", f"input 4 of shape {tuple(inputs[4].shape)} does not "
                                     f"broadcast along the product's rows {tuple(dense.shape)}")
    return dense, total, dense_attrs, add_attrs


def _qdense_add_infer(inputs: Sequence[TensorSpec],
                      attrs: Mapping[str, Any]) -> list[TensorSpec]:
    return [_qdense_add_parts(inputs, attrs)[1]]


def _qdense_add_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                    outputs: Sequence[TensorSpec],
                    attrs: Mapping[str, Any]) -> Callable[..., None]:
    """qdense into a scratch array, then qadd's lookup with the constant: one call."""
    dense_spec, total, dense_attrs, add_attrs = _qdense_add_parts(inputs, attrs)
    dense = _qdense_cpu(backend, device_id, inputs[:4], [dense_spec], dense_attrs)
    add = _qadd_cpu(backend, device_id, [dense_spec, inputs[4]], [total], add_attrs)
    scratch = np.empty(tuple(dense_spec.shape), dense_spec.dtype)

    def run(x: Any, w: Any, m: Any, b: Any, addend: Any, out: Any) -> None:
        dense(x, w, m, b, scratch)
        add(scratch, addend, out)
    if isinstance(dense, PreparedKernel):
        return Forward(dense, run, int(scratch.nbytes))
    return run


define_op("qconv2d", _qconv2d_infer, 4, QCONV_ATTRS)
kernel("qconv2d", "cpu")(_qconv2d_cpu)
define_op("qdense", _qdense_infer, 4, ("x_zero", "y_zero", "relu", "dtype"))
kernel("qdense", "cpu")(_qdense_cpu)
define_op("qdense_add", _qdense_add_infer, 5,
          ("x_zero", "y_zero", "relu", "dtype") + tuple(f"add_{k}" for k in QADD_ATTRS))
kernel("qdense_add", "cpu")(_qdense_add_cpu)
define_op("qadd", _qadd_infer, 2, QADD_ATTRS)
kernel("qadd", "cpu")(_qadd_cpu)
