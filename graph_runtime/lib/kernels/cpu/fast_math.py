"""exp for compiled float32 loops in a form LLVM vectorizes (libm's expf is one call per value).

exp(x) = exp(x / 256) ** 256: the Taylor series of degree 11 at |x / 256| <= 0.41 and eight
squarings, all in float64 (relative error below 1e-9 over [-104, 89], far under float32's
6e-8), with no integer exponent bits to assemble: branch-free multiply-adds that numba's LLVM
turns into SIMD. Below -104 the float32 result is 0, above 88.73 it is inf; NaN stays NaN.
"""
from __future__ import annotations

import math
from typing import Any

import numba
from numba import types
from numba.extending import overload


@numba.njit(inline="always", cache=True, error_model="numpy")
def exp_f32(x: Any) -> float:
    """exp(x) as a float64 accurate to float32 (x float32 or float64)."""
    v = numba.float64(x)
    t = (-104.0 if v < -104.0 else (88.73 if v > 88.73 else v)) * (1.0 / 256.0)
    p = 1.0 / 39916800.0
    p = p * t + 1.0 / 3628800.0
    p = p * t + 1.0 / 362880.0
    p = p * t + 1.0 / 40320.0
    p = p * t + 1.0 / 5040.0
    p = p * t + 1.0 / 720.0
    p = p * t + 1.0 / 120.0
    p = p * t + 1.0 / 24.0
    p = p * t + 1.0 / 6.0
    p = p * t + 0.5
    p = p * t + 1.0
    p = p * t + 1.0
    for _ in range(8):
        p = p * p
    if v < -104.0:
        p = 0.0
    elif v > 88.73:
        p = v * 1e300 * 1e300  # inf, with NaN never reaching here
    return p


def exp_as(x: Any, like: Any) -> float:
    """exp(x) to the precision of like's type: exp_f32 for float32, libm's exp otherwise."""
    return math.exp(x)


@overload(exp_as, inline="always")
def _exp_as(x: Any, like: Any) -> Any:
    if isinstance(like, types.Float) and like.bitwidth == 32:
        def narrow(x: Any, like: Any) -> float:
            return exp_f32(x)  # type: ignore[no-any-return]
        return narrow

    def wide(x: Any, like: Any) -> float:
        return math.exp(x)
    return wide
