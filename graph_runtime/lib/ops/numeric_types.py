"""convert_type (ONNX Cast to and from bfloat16, float8, float4, int4/uint4, int2/uint2)."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...dtypes import EXTENDED_DTYPES
from ..attrs import bool_attr, dtype_attr, op_error, str_attr
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import check_num_inputs

# NumPy's own numeric types plus ml_dtypes' (which NumPy casts between, rounding to nearest even).
CONVERT_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                  "uint16", "uint32", "uint64", "bool") + EXTENDED_DTYPES
_SUB_BYTE_INTS = ("int4", "uint4", "int2", "uint2")
ROUND_MODES = ("up", "down", "nearest")  # float8_e8m0fnu only


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    check_num_inputs("convert_type", inputs, 1)
    dtype = dtype_attr("convert_type", attrs, "dtype")
    bool_attr("convert_type", attrs, "saturate", True)
    str_attr("convert_type", attrs, "round_mode", "up", ROUND_MODES)
    for what, name in (("input 0", inputs[0].dtype), ("dtype", dtype)):
        if name not in CONVERT_DTYPES:
            raise op_error("convert_type", f"{what} is {name}; supported: "
                                           + ", ".join(CONVERT_DTYPES))
    return [TensorSpec(tuple(inputs[0].shape), dtype)]


def _to_e8m0(x: np.ndarray, up: bool, saturate: bool) -> np.ndarray:
    """x as float8_e8m0fnu (a power of two, 2^-127 to 2^127) rounded up or down (ONNX
    round_mode); NaN stays NaN, inf saturates (or becomes NaN), 0 becomes 2^-127."""
    wide = np.abs(x.astype(np.float64))
    mantissa, exponent = np.frexp(wide)
    exact = mantissa == 0.5
    power = np.where(exact | ~np.asarray(up), exponent - 1, exponent)
    power = np.where(wide == 0, -127, power)
    overflow = np.isinf(wide) | (power > 127)
    power = np.clip(power, -127, 127)
    out = np.ldexp(1.0, power)
    out = np.where(np.isnan(wide) | (overflow & (not saturate)), np.nan, out)
    return out.astype("float8_e8m0fnu")


def convert(x: np.ndarray, dtype: str, saturate: bool, round_mode: str = "up") -> np.ndarray:
    """x as dtype the way ONNX Cast defines it: to a narrow float, out-of-range values saturate
    to its largest finite value (saturate) or overflow to inf/NaN; to a 2- or 4-bit integer, a
    float rounds to nearest even and every value clips to the type's range."""
    target = np.dtype(dtype)
    source = np.dtype(x.dtype)
    if dtype in _SUB_BYTE_INTS:
        import ml_dtypes
        info = ml_dtypes.iinfo(target)
        wide = np.rint(x.astype(np.float64)).astype(np.int64) if source.kind not in "iub" \
            else x.astype(np.int64)
        # NOTE: as ONNX Cast to any integer type: the value wraps modulo 2^bits.
        span = int(info.max) - int(info.min) + 1
        return ((wide - int(info.min)) % span + int(info.min)).astype(target)
    if dtype == "float8_e8m0fnu" and round_mode != "nearest":
        return _to_e8m0(x, round_mode == "up", saturate)
    if dtype in EXTENDED_DTYPES and dtype != "bfloat16" and saturate:
        import ml_dtypes
        top = float(ml_dtypes.finfo(target).max)
        wide = x.astype(np.float32) if source.itemsize < 4 or source.kind != "f" else x
        return np.clip(wide, -top, top).astype(target)
    if source.name in EXTENDED_DTYPES and target.kind in "iub":
        return x.astype(np.float32).astype(target)
    return x.astype(target)


def _cpu_convert(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    dtype = dtype_attr("convert_type", attrs, "dtype")
    saturate = bool_attr("convert_type", attrs, "saturate", True)
    round_mode = str_attr("convert_type", attrs, "round_mode", "up", ROUND_MODES)

    def run(x: Any, out: Any) -> None:
        out[...] = convert(x, dtype, saturate, round_mode)
    return run


define_op("convert_type", _infer, 1, ("dtype", "saturate", "round_mode"))
kernel("convert_type", "cpu")(_cpu_convert)
