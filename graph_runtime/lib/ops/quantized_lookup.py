"""qlookup(x, table) -> y: y = table[x's byte] for an int8/uint8 x and a constant table of 256
values (indexed by the byte's unsigned value), the form frontend/fusion/fuse_lookup.py gives an
elementwise quantize-dequantize region of one int8 tensor. CPU only, as the quantized ops."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ...backends.base import Backend
from ..attrs import op_error
from ..kernels.cpu.quantized import lookup_kernel
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import check_num_inputs
from .quantized import _check_int8


def _qlookup_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    check_num_inputs("qlookup", inputs, 2)
    _check_int8("qlookup", "input 0 (x)", inputs[0], ("uint8", "int8"))
    _check_int8("qlookup", "input 1 (table)", inputs[1], ("uint8", "int8"))
    if tuple(inputs[1].shape) != (256,):
        raise op_error("qlookup", f"input 1 (table) has shape {tuple(inputs[1].shape)}; "
                                  "expected (256,): one value per byte")
    return [TensorSpec(tuple(inputs[0].shape), inputs[1].dtype)]


def _qlookup_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    return lookup_kernel()


define_op("qlookup", _qlookup_infer, 2)
kernel("qlookup", "cpu")(_qlookup_cpu)
