"""Elementwise math standard ops (reciprocal, rounding, sign, trigonometry, isnan/isinf, mod)."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..attrs import DTYPE_KEY, bool_attr
from ..expr_ops import ExprOp, register_family, ufunc
from ..library import TensorSpec
from ..shapes import FLOAT_DTYPES, INT_DTYPES, NUMERIC_DTYPES


def _const(template: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda attrs: template


def _float_ufunc(name: str, c_name: str | None = None, in_place: bool = True) -> ExprOp:
    """A float-only ufunc whose C function has the same name (or c_name)."""
    return ExprOp(ufunc(name), _const(f"{c_name or name}({{0}})"), FLOAT_DTYPES,
                  in_place=in_place)


def _isinf_flags(attrs: Mapping[str, Any]) -> tuple[bool, bool]:
    return (bool_attr("isinf", attrs, "detect_positive", True),
            bool_attr("isinf", attrs, "detect_negative", True))


def _isinf_expr(attrs: Mapping[str, Any]) -> str:
    pos, neg = _isinf_flags(attrs)
    if pos and neg:
        return "(isinf({0}) != 0)"
    if pos:
        return "(isinf({0}) && {0} > 0)"
    if neg:
        return "(isinf({0}) && {0} < 0)"
    return "(0)"


def _isinf_host(attrs: Mapping[str, Any], inputs: Sequence[TensorSpec]) -> Callable[..., None]:
    pos, neg = _isinf_flags(attrs)
    if pos and neg:
        return lambda x, out: np.isinf(x, out=out)
    if pos or neg:
        inf = np.inf if pos else -np.inf
        return lambda x, out: np.equal(x, inf, out=out)
    return lambda x, out: out.fill(False)


def _is_int(attrs: Mapping[str, Any]) -> bool:
    return np.dtype(attrs.get(DTYPE_KEY) or "float32").kind in "iu"


def _fmod(attrs: Mapping[str, Any]) -> bool:
    return bool_attr("mod", attrs, "fmod", False)


def _mod_expr(attrs: Mapping[str, Any]) -> str:
    # fmod 1: C's fmod / %, sign of the dividend (np.fmod); 0: sign of the divisor (np.mod).
    if _is_int(attrs):
        # NOTE: x % 0 and INT_MIN % -1 trap on x86 (SIGFPE, PoCL runs there); NumPy gives 0.
        rem = "{0} % {1}"
        if not _fmod(attrs):
            rem = f"(({rem} != 0 && (({rem} < 0) != ({{1}} < 0))) ? {rem} + {{1}} : {rem})"
        return f"(({{1}} == 0 || {{1}} == -1) ? ({{T}})0 : {rem})"
    rem = "fmod({0}, {1})"
    if _fmod(attrs):
        return rem
    return f"(({rem} != 0 && (({rem} < 0) != ({{1}} < 0))) ? {rem} + {{1}} : {rem})"


def _mod_host(attrs: Mapping[str, Any], inputs: Sequence[TensorSpec]) -> Callable[..., None]:
    fn = np.fmod if _fmod(attrs) else np.mod
    if inputs[0].dtype not in INT_DTYPES:
        return lambda a, b, out: fn(a, b, out=out)

    def run(a: Any, b: Any, out: Any) -> None:
        # NOTE: NumPy warns on a zero divisor (and gives 0, as the GPU kernels do).
        with np.errstate(divide="ignore", invalid="ignore"):
            fn(a, b, out=out)
    return run


def _floor_divide_host(attrs: Mapping[str, Any],
                       inputs: Sequence[TensorSpec]) -> Callable[..., None]:
    def run(a: Any, b: Any, out: Any) -> None:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            np.floor_divide(a, b, out=out)
    return run


# Integers only: NumPy's float floor_divide goes through fmod and rounds unlike floor(a / b).
# x // 0 is 0 as in NumPy; x // -1 is -x (INT_MIN // -1 traps in C).
_FLOOR_DIVIDE = ("({1} == 0 ? ({T})0 : ({1} == -1 ? -{0} : "
                 "({0} / {1} - (({0} % {1} != 0 && (({0} < 0) != ({1} < 0))) ? 1 : 0))))")

MATH_UNARY: dict[str, ExprOp] = {
    "reciprocal": ExprOp(ufunc("reciprocal"), _const("(({T})1 / {0})"), FLOAT_DTYPES,
                         in_place=True),
    "floor": _float_ufunc("floor"),
    "ceil": _float_ufunc("ceil"),
    # ONNX Round: half to even, as np.rint and C's rint in the default rounding mode.
    "round": _float_ufunc("rint"),
    "sign": ExprOp(ufunc("sign"), _const("({0} > 0 ? ({T})1 : ({0} < 0 ? ({T})-1 : {0}))"),
                   NUMERIC_DTYPES, in_place=True),
    "sin": _float_ufunc("sin"),
    "cos": _float_ufunc("cos"),
    "tan": _float_ufunc("tan"),
    "asin": _float_ufunc("arcsin", "asin"),
    "acos": _float_ufunc("arccos", "acos"),
    "atan": _float_ufunc("arctan", "atan"),
    "sinh": _float_ufunc("sinh"),
    "cosh": _float_ufunc("cosh"),
    "asinh": _float_ufunc("arcsinh", "asinh"),
    "acosh": _float_ufunc("arccosh", "acosh"),
    "atanh": _float_ufunc("arctanh", "atanh"),
    "isnan": ExprOp(ufunc("isnan"), _const("({0} != {0})"), FLOAT_DTYPES, out_dtype="bool",
                    in_place=True),
    "isinf": ExprOp(_isinf_host, _isinf_expr, FLOAT_DTYPES,
                    ("detect_positive", "detect_negative"), out_dtype="bool", in_place=True),
}

MATH_BINARY: dict[str, ExprOp] = {
    "mod": ExprOp(_mod_host, _mod_expr, NUMERIC_DTYPES, ("fmod",), in_place=True),
    "floor_divide": ExprOp(_floor_divide_host, _const(_FLOOR_DIVIDE), INT_DTYPES,
                           in_place=True),
}

register_family(MATH_UNARY, 1)
register_family(MATH_BINARY, 2)

__all__ = ["MATH_BINARY", "MATH_UNARY"]
