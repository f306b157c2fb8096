"""qdq_attention(q, k, v, mask, q_table, k_table, v_table, add_table, a_table, p_table) -> y:
multi-head attention of quantize_static's QDQ form (frontend/fusion/fuse_qdq_attention.py).

q, k, v: int8/uint8 (batch, tokens, heads * dim), or one packed tensor read from the columns
q_offset, k_offset, v_offset on (attribute width: heads * dim); mask: int8/uint8 (batch or 1, 1, tokens or 1, tokens)
added to the quantized scores by add_table (qadd's table: (scores byte * 256 + mask byte));
q/k/v_table: the float32 operand of each product per byte of q, k, v (their DQ and what the
model does before the product); a_table: softmax's float32 input per byte of the sum; p_table:
the second product's float32 left operand per byte of the quantized probabilities. Attributes:
heads; s_, p_, y_ scale / zero / dtype: the scores', probabilities' and output's quantization.
CPU only, as the other quantized ops (kernels/cpu/qdq_attention.py).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ...backends.base import Backend
from ..attrs import float_attr, int_attr, op_error
from ..kernels.cpu.qdq_attention import qdq_attention_kernel
from ..kernels.cpu.quantized import QUANT_RANGES
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import check_num_inputs, check_vector
from .quantized import _check_int8

ATTRS = ("heads", "s_scale", "s_zero", "s_dtype", "p_scale", "p_zero", "p_dtype", "y_scale",
         "y_zero", "y_dtype", "width", "q_offset", "k_offset", "v_offset")
TABLES = (("q_table", "float32", 256), ("k_table", "float32", 256), ("v_table", "float32", 256),
          ("add_table", None, 65536), ("a_table", "float32", 256), ("p_table", "float32", 256))


def _dtype(attrs: Mapping[str, Any], key: str) -> str:
    value = str(attrs.get(key, ""))
    if value not in ("int8", "uint8"):
        raise op_error("qdq_attention", f"attribute {key} is {value!r}; expected 'int8' or "
                                        "'uint8'")
    return value


def _shape(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(batch, heads, tokens, dim), the inputs checked."""
    op = "qdq_attention"
    check_num_inputs(op, inputs, 10)
    names = ("q", "k", "v", "mask")
    for i, name in enumerate(names):
        _check_int8(op, f"input {i} ({name})", inputs[i], ("int8", "uint8"))
    shape = tuple(inputs[0].shape)
    heads = int(int_attr(op, attrs, "heads", 0))
    width = int(int_attr(op, attrs, "width", shape[-1] if shape else 0))
    if len(shape) != 3 or heads < 1 or width < 1 or width % heads:
        raise op_error(op, f"q {shape} with {heads} heads of width {width}: expected (batch, "
                           "tokens, at least heads * dim)")
    batch, tokens, _ = shape
    for i in (0, 1, 2):
        offset = int(int_attr(op, attrs, f"{names[i]}_offset", 0))
        got = tuple(inputs[i].shape)
        if got[:2] != (batch, tokens) or len(got) != 3 or offset < 0 \
                or offset + width > got[2]:
            raise op_error(op, f"input {i} ({names[i]}) is {got} with columns from {offset}; "
                               f"expected ({batch}, {tokens}, at least {offset + width})")
    mask = tuple(inputs[3].shape)
    if len(mask) != 4 or mask[0] not in (1, batch) or mask[1] != 1 \
            or mask[2] not in (1, tokens) or mask[3] != tokens:
        raise op_error(op, f"input 3 (mask) is {mask}; expected ({batch} or 1, 1, {tokens} or "
                           f"1, {tokens})")
    for i, (name, dtype, size) in enumerate(TABLES, start=4):
        check_vector(op, inputs, i, name, (dtype,) if dtype else ("int8", "uint8"), size)
    return batch, heads, tokens, width // heads


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    batch, heads, tokens, dim = _shape(inputs, attrs)
    return [TensorSpec((batch, tokens, heads * dim), _dtype(attrs, "y_dtype"))]


def _cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
         outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    batch, heads, tokens, dim = _shape(inputs, attrs)
    params = {}
    for key in ("s", "p", "y"):
        lo, hi = QUANT_RANGES[_dtype(attrs, f"{key}_dtype")]
        params[key] = (float(float_attr("qdq_attention", attrs, f"{key}_scale")),
                       int(int_attr("qdq_attention", attrs, f"{key}_zero", 0)), int(lo), int(hi))
    offsets = tuple(int(int_attr("qdq_attention", attrs, f"{n}_offset", 0)) for n in "qkv")
    return qdq_attention_kernel(batch, heads, tokens, dim, params, offsets)  # type: ignore


define_op("qdq_attention", _infer, 10, ATTRS)
kernel("qdq_attention", "cpu")(_cpu)
