"""Comparison, logical and bitwise standard ops (ONNX Equal ... BitShift) with broadcasting."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..attrs import DTYPE_KEY
from ..expr_ops import ExprOp, register_family, ufunc
from ..shapes import FLOAT_DTYPES

# Every integer dtype with an OpenCL type (OpenCL C has no 16-bit unsigned name in CL_TYPES).
INT_ALL_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint32", "uint64")
UNSIGNED_DTYPES = ("uint8", "uint32", "uint64")
COMPARE_DTYPES = FLOAT_DTYPES + INT_ALL_DTYPES + ("bool",)


def _const(template: str) -> Any:
    return lambda attrs: template


def _compare(ufunc_name: str, c_op: str) -> ExprOp:
    # C's comparisons are false for NaN except !=, as NumPy's are.
    return ExprOp(ufunc(ufunc_name), _const(f"({{0}} {c_op} {{1}})"), COMPARE_DTYPES,
                  out_dtype="bool", in_place=True)


def _bits(attrs: Mapping[str, Any]) -> int:
    return int(np.dtype(attrs.get(DTYPE_KEY) or "int64").itemsize * 8)


def _in_range(attrs: Mapping[str, Any]) -> str:
    """C test that shift count {1} is in [0, bits): NumPy gives 0 (or -1) outside; C, UB."""
    if attrs.get(DTYPE_KEY) in UNSIGNED_DTYPES:
        return f"({{1}} < {_bits(attrs)})"
    return f"({{1}} >= 0 && {{1}} < {_bits(attrs)})"


def _left_shift_expr(attrs: Mapping[str, Any]) -> str:
    return f"({_in_range(attrs)} ? ({{0}} << {{1}}) : ({{T}})0)"


def _right_shift_expr(attrs: Mapping[str, Any]) -> str:
    # Out of range, NumPy's signed shift keeps only the sign: -1 for negative values, else 0.
    fill = "({T})0" if attrs.get(DTYPE_KEY) in UNSIGNED_DTYPES else "({0} < 0 ? ({T})-1 : ({T})0)"
    return f"({_in_range(attrs)} ? ({{0}} >> {{1}}) : {fill})"


COMPARE: dict[str, ExprOp] = {
    "equal": _compare("equal", "=="),
    "not_equal": _compare("not_equal", "!="),
    "less": _compare("less", "<"),
    "less_equal": _compare("less_equal", "<="),
    "greater": _compare("greater", ">"),
    "greater_equal": _compare("greater_equal", ">="),
}
LOGICAL_BINARY: dict[str, ExprOp] = {
    "logical_and": ExprOp(ufunc("logical_and"), _const("({0} && {1})"), ("bool",),
                          in_place=True),
    "logical_or": ExprOp(ufunc("logical_or"), _const("({0} || {1})"), ("bool",), in_place=True),
    "logical_xor": ExprOp(ufunc("logical_xor"), _const("(({0} != 0) != ({1} != 0))"), ("bool",),
                          in_place=True),
}
BITWISE_BINARY: dict[str, ExprOp] = {
    "bitwise_and": ExprOp(ufunc("bitwise_and"), _const("({0} & {1})"), INT_ALL_DTYPES,
                          in_place=True),
    "bitwise_or": ExprOp(ufunc("bitwise_or"), _const("({0} | {1})"), INT_ALL_DTYPES,
                         in_place=True),
    "bitwise_xor": ExprOp(ufunc("bitwise_xor"), _const("({0} ^ {1})"), INT_ALL_DTYPES,
                          in_place=True),
    "left_shift": ExprOp(ufunc("left_shift"), _left_shift_expr, INT_ALL_DTYPES, in_place=True),
    "right_shift": ExprOp(ufunc("right_shift"), _right_shift_expr, INT_ALL_DTYPES,
                          in_place=True),
}
LOGICAL_UNARY: dict[str, ExprOp] = {
    "logical_not": ExprOp(ufunc("logical_not"), _const("({0} == 0)"), ("bool",), in_place=True),
    "bitwise_not": ExprOp(ufunc("invert"), _const("(~{0})"), INT_ALL_DTYPES, in_place=True),
}

register_family(COMPARE, 2)
register_family(LOGICAL_BINARY, 2)
register_family(BITWISE_BINARY, 2)
register_family(LOGICAL_UNARY, 1)

__all__ = ["BITWISE_BINARY", "COMPARE", "COMPARE_DTYPES", "INT_ALL_DTYPES", "LOGICAL_BINARY",
           "LOGICAL_UNARY", "UNSIGNED_DTYPES"]
