"""qdense_add_packed(x, w, m, b, y_zero, colmap) -> y: several qdense_add of one x side by side
(frontend/fusion/fuse_qdq_qkv.py packs an attention's Q, K and V projections).

x (..., K) uint8/int8 with zero point x_zero (attribute), w (K, N) int8, m and b float32 (N,):
qdense's requantization per column with y_zero (N,) int32 (qdense's dtype: attribute
dense_dtype); colmap (N * 256,) the sum's byte per column and dense byte (each projection's qadd
table at its constant): y = colmap[c, byte(qdense(x)[.., c])] as colmap's dtype. The same
values as the qdense_add nodes it replaces, without oneDNN; with it the product's int32 result
is requantized here, by qdense's reference steps (oneDNN's own requantization may round a
half-step tie the other way: kernels/onednn/int8_matmul.py). CPU only.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import int_attr, op_error
from ..kernels.cpu import jit_setup
from ..kernels.cpu.qdense_columns import requantize_columns
from ..kernels.cpu.quantized import QUANT_RANGES, dense_integer_reference
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import check_num_inputs, check_vector, size_of
from .quantized import Forward, _check_int8

OP = "qdense_add_packed"


def _check(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> tuple[int, int, int, str]:
    """(rows, N, K, the dense dtype)."""
    check_num_inputs(OP, inputs, 6)
    _check_int8(OP, "input 0 (x)", inputs[0], ("uint8", "int8"))
    _check_int8(OP, "input 1 (w)", inputs[1], ("int8",))
    x, w = tuple(inputs[0].shape), tuple(inputs[1].shape)
    if len(w) != 2 or not x or x[-1] != w[0]:
        raise op_error(OP, f"x {x} and w {w}: expected (..., K) and (K, N)")
    k, n = w
    for i, name, dtype, size in ((2, "m", "float32", n), (3, "b", "float32", n),
                                 (4, "y_zero", "int32", n), (5, "colmap", None, n * 256)):
        check_vector(OP, inputs, i, name, (dtype,) if dtype else ("int8", "uint8"), size)
    dense = str(attrs.get("dense_dtype", ""))
    if dense not in QUANT_RANGES:
        raise op_error(OP, f"attribute dense_dtype is {dense!r}; expected 'int8' or 'uint8'")
    return size_of(x) // max(k, 1), n, k, dense


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _check(inputs, attrs)
    return [TensorSpec(tuple(inputs[0].shape[:-1]) + (inputs[1].shape[1],), inputs[5].dtype)]


def _cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
         outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.onednn.choice import onednn_int8_or
    from ..kernels.onednn.int8_matmul import Int8Matmul, int8_matmul_applies
    rows, n, k, dense = _check(inputs, attrs)
    jit_setup.start()
    lo, hi = (np.float32(v) for v in QUANT_RANGES[dense])
    x_zero = np.array(int(int_attr(OP, attrs, "x_zero", 0)), inputs[0].dtype)
    acc = np.empty((rows, n), np.int32)

    def onednn() -> Int8Matmul:
        made = Int8Matmul(rows, n, k, inputs[0].dtype, "int32", None, 0, False)
        made.derived = (1,)  # the weight's position among this op's inputs
        return made
    chosen = onednn_int8_or(OP, int8_matmul_applies(inputs[0].dtype, inputs[1].dtype, rows, n, k),
                            onednn, dense_integer_reference)
    made = chosen if isinstance(chosen, Int8Matmul) else None
    integer = chosen if made is None else made.integer

    def run(x: Any, w: Any, m: Any, b: Any, y_zero: Any, colmap: Any, out: Any) -> None:
        integer(x.reshape(rows, k), x_zero, w, acc)
        requantize_columns(acc, m, b, y_zero, lo, hi, colmap.reshape(n, 256),
                           out.reshape(rows, n))
    return Forward(made, run, acc.nbytes) if made is not None else run


define_op(OP, _infer, 6, ("x_zero", "dense_dtype"))
kernel(OP, "cpu")(_cpu)
