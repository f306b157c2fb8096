"""exp for compiled float32 loops in forms LLVM vectorizes (libm's expf is one call per value).

exp_f32: exp(x) = exp(x / 256) ** 256: the Taylor series of degree 11 at |x / 256| <= 0.41 and
eight squarings, all in float64 (relative error below 1e-9 over [-104, 89], far under float32's
6e-8), with no integer exponent bits to assemble: branch-free multiply-adds that numba's LLVM
turns into SIMD. Below -104 the float32 result is 0, above 88.73 it is inf; NaN stays NaN.
Compiled chains use it (their exp mirrors NumPy's).
exp32: the classic range reduction in float32 arithmetic with 2^n from exponent bits, within 1
ulp and 3x faster (16 float32 lanes against 8 float64 ones).
exp_neg32: exp32 for softmax's x - max <= 0, with one scaling and a shorter polynomial (1.4x
exp32's speed), results below 2^-125 flushed to 0 (softmax_as).
Their Horner steps are mul_add, fused multiply-adds: the loops around them are compiled
without contraction (every other operation rounds as NumPy's), and as separate multiplies and
adds the polynomials took up to twice as long (softmax's pass 1.2x, docs/measurements.md).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from .jit_cache import install

install()  # before any cache=True function here (jit_cache.py)


@intrinsic
def _fmuladd(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """a * b + c as LLVM's fmuladd: one fused multiply-add (a single rounding) where the CPU
    has them, else a multiply and an add; vectorizes. Written where a polynomial wants it
    (Horner's steps), so that the loops around keep every other operation rounded as NumPy
    rounds it: contract flags on a whole loop would fuse its ops too."""
    if not (a == b == c and isinstance(a, types.Float)):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        t = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fmuladd", [t], ir.FunctionType(t, [t, t, t]))
        return builder.call(fn, args)
    return a(a, a, a), codegen


# mul_add(a, b, c) in compiled code (the intrinsic's typing context is numba's)
mul_add: Callable[[Any, Any, Any], Any] = _fmuladd  # type: ignore[assignment]


@numba.njit(inline="always", cache=True, error_model="numpy")
def exp_f32(x: Any) -> float:
    """exp(x) as a float64 accurate to float32 (x float32 or float64)."""
    v = numba.float64(x)
    t = (-104.0 if v < -104.0 else (88.73 if v > 88.73 else v)) * (1.0 / 256.0)
    p = 1.0 / 39916800.0
    p = mul_add(p, t, 1.0 / 3628800.0)
    p = mul_add(p, t, 1.0 / 362880.0)
    p = mul_add(p, t, 1.0 / 40320.0)
    p = mul_add(p, t, 1.0 / 5040.0)
    p = mul_add(p, t, 1.0 / 720.0)
    p = mul_add(p, t, 1.0 / 120.0)
    p = mul_add(p, t, 1.0 / 24.0)
    p = mul_add(p, t, 1.0 / 6.0)
    p = mul_add(p, t, 0.5)
    p = mul_add(p, t, 1.0)
    p = mul_add(p, t, 1.0)
    for _ in range(8):
        p = p * p
    if v < -104.0:
        p = 0.0
    elif v > 88.73:
        p = v * 1e300 * 1e300  # inf, with NaN never reaching here
    return p


@intrinsic
def _float_of_bits(typingctx: Any, bits: Any) -> Any:
    """The float32 whose IEEE bits are the int32 bits (LLVM's bitcast: vectorizes)."""
    if bits != types.int32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def _bits_of_float(typingctx: Any, x: Any) -> Any:
    """The int32 holding a float32's IEEE bits (LLVM's bitcast: vectorizes)."""
    if x != types.float32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@numba.njit(inline="always", cache=True, error_model="numpy")
def exp32(x: Any) -> Any:
    """exp of a float32 in float32 arithmetic, within 1 ulp (2^-23 relative) for normal
    results, 0 below -104, inf above 88.73, NaN for NaN: 3x exp_f32's speed for softmax.

    x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact), e^r by its Taylor
    series of degree 7 (truncation below 5e-9 relative), and 2^n as two float32 powers of two
    made from their exponent bits, so that results down to the subnormals come out of one
    product.
    """
    # NOTE: float32 constants throughout: a float64 one widens the comparison, and the loop
    # then runs at half the vector width (exp took 0.41 ns per value, 0.26 without)
    lo = np.float32(-104.0)
    hi = np.float32(88.73)
    v = lo if x < lo else (hi if x > hi else x)
    # round to nearest: adding 1.5 * 2^23 pushes the fraction bits out
    k = v * np.float32(1.4426950408889634) + np.float32(12582912.0)
    n = k - np.float32(12582912.0)
    r = v - n * np.float32(0.693145751953125)
    r = r - n * np.float32(1.428606765330187e-06)
    p = np.float32(1.0 / 5040.0)
    p = mul_add(p, r, np.float32(1.0 / 720.0))
    p = mul_add(p, r, np.float32(1.0 / 120.0))
    p = mul_add(p, r, np.float32(1.0 / 24.0))
    p = mul_add(p, r, np.float32(1.0 / 6.0))
    p = mul_add(p, r, np.float32(0.5))
    p = mul_add(p, r, np.float32(1.0))
    p = mul_add(p, r, np.float32(1.0))
    half = np.int32(n) >> 1
    rest = np.int32(n) - half
    p = p * _float_of_bits(np.int32((half + 127) << 23))  # type: ignore[call-arg]
    p = p * _float_of_bits(np.int32((rest + 127) << 23))  # type: ignore[call-arg]
    if x < lo:
        p = np.float32(0.0)
    elif x > hi:
        p = np.float32(np.inf)
    return p


# e^r on |r| <= ln2 / 2 by a degree-6 polynomial: coefficients fitted here to the relative error
# (numpy least squares on 2000 Chebyshev nodes), 1.9e-9 at most, under float32's 6e-8
EXP_POLY6 = (1.0000000005920202, 1.0000000361258987, 0.49999991493036655, 0.16666420832120407,
             0.04166835803306901, 0.008374771520009944, 0.0013829420592237828)
_C0, _C1, _C2, _C3, _C4, _C5, _C6 = (np.float32(c) for c in EXP_POLY6)


@numba.njit(inline="always", cache=True, error_model="numpy")
def exp_neg32(x: Any) -> Any:
    """exp of a float32 x <= 88 (softmax's x - max <= 0) in float32 arithmetic, within 1 ulp
    for results above 2^-125, 0 below (x < -86.9: a softmax term under 2.2e-38 of the row's
    sum), NaN for NaN: 1.4x exp32's speed (one power of two, a degree-6 polynomial).
    """
    lo = np.float32(-86.9)  # n >= -125 below: 2^n * e^r stays normal
    v = lo if x < lo else x
    k = v * np.float32(1.4426950408889634) + np.float32(12582912.0)
    n = k - np.float32(12582912.0)
    r = v - n * np.float32(0.693145751953125)
    r = r - n * np.float32(1.428606765330187e-06)
    p = _C6
    p = mul_add(p, r, _C5)
    p = mul_add(p, r, _C4)
    p = mul_add(p, r, _C3)
    p = mul_add(p, r, _C2)
    p = mul_add(p, r, _C1)
    p = mul_add(p, r, _C0)
    # NOTE: a float multiply by 2^n, not an add to p's exponent bits, so a NaN stays NaN
    p = p * _float_of_bits(np.int32((np.int32(n) + 127) << 23))  # type: ignore[call-arg]
    return np.float32(0.0) if x < lo else p


def exp_as(x: Any, like: Any) -> float:
    """exp(x) to the precision of like's type: exp32 for float32, libm's exp otherwise."""
    return math.exp(x)


@overload(exp_as, inline="always")
def _exp_as(x: Any, like: Any) -> Any:
    if isinstance(like, types.Float) and like.bitwidth == 32:
        def narrow(x: Any, like: Any) -> float:
            return exp32(np.float32(x))  # type: ignore[no-any-return]
        return narrow

    def wide(x: Any, like: Any) -> float:
        return math.exp(x)
    return wide


def softmax_exp_as(x: Any, like: Any) -> float:
    """exp(x) of softmax's x - max <= 0 to the precision of like's type: exp_neg32 for
    float32, libm's exp otherwise."""
    return math.exp(x)


@overload(softmax_exp_as, inline="always")
def _softmax_exp_as(x: Any, like: Any) -> Any:
    if isinstance(like, types.Float) and like.bitwidth == 32:
        def narrow(x: Any, like: Any) -> float:
            return exp_neg32(np.float32(x))  # type: ignore[no-any-return]
        return narrow

    def wide(x: Any, like: Any) -> float:
        return math.exp(x)
    return wide



def as_type_of(x: Any, like: Any) -> Any:
    """x in like's float type (a float32 multiplier keeps a float32 loop at full width)."""
    return x


@overload(as_type_of, inline="always")
def _as_type_of(x: Any, like: Any) -> Any:
    if isinstance(like, types.Float) and like.bitwidth == 32:
        def narrow(x: Any, like: Any) -> Any:
            return np.float32(x)
        return narrow

    def same(x: Any, like: Any) -> Any:
        return x
    return same
