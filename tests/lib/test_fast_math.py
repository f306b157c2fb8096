"""The vectorizable float32 exp (lib/kernels/cpu/fast_math.py) against float64."""
from __future__ import annotations

import numba
import numpy as np

from graph_runtime.lib.kernels.cpu.fast_math import exp32, exp_as, exp_f32, exp_neg32, mul_add


@numba.njit
def _exp_all(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        out[i] = np.float32(exp_f32(x[i]))


@numba.njit
def _exp_like(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        out[i] = exp_as(x[i], x[i])


def test_exp_f32_is_within_one_ulp() -> None:
    x = np.concatenate([np.linspace(-110, 95, 400_001), [0.0, -0.0, 1e-30, -1e-30]])
    x = x.astype(np.float32)
    out = np.empty_like(x)
    _exp_all(x, out)
    want = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        want32 = want.astype(np.float32)
    normal = np.isfinite(want32) & (want32 >= np.finfo(np.float32).tiny)
    # one float32 rounding of a value within 1e-9 relative: at most 1 ulp (2^-23 relative)
    np.testing.assert_allclose(out[normal], want[normal], rtol=2.0 ** -23)
    assert np.isinf(out[x > 89]).all() and (out[x < -104] == 0).all()
    # subnormal results: within one subnormal step
    tiny = ~normal & ~np.isinf(want32)
    assert np.abs(out[tiny] - want32[tiny]).max() <= np.float32(1.5e-45)


def test_exp_f32_special_values() -> None:
    x = np.array([np.nan, np.inf, -np.inf], np.float32)
    out = np.empty_like(x)
    _exp_all(x, out)
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == 0


def test_exp_as_float64_is_libm() -> None:
    x = np.linspace(-700, 700, 1001)
    out = np.empty_like(x)
    _exp_like(x, out)
    np.testing.assert_allclose(out, np.exp(x), rtol=4 * 2.0 ** -52)


@numba.njit
def _exp32_all(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        out[i] = exp32(x[i])


def test_exp32_is_within_one_ulp() -> None:
    """The float32-arithmetic exp softmax uses: 1 ulp for normal results, one subnormal step
    below them, 0 and inf past float32's range, NaN for NaN."""
    x = np.concatenate([np.linspace(-110, 95, 400_001), [0.0, -0.0, 1e-30, -1e-30, -87.33655,
                                                          88.72283]]).astype(np.float32)
    out = np.empty_like(x)
    _exp32_all(x, out)
    want = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        want32 = want.astype(np.float32)
    normal = np.isfinite(want32) & (want32 >= np.finfo(np.float32).tiny)
    np.testing.assert_allclose(out[normal], want[normal], rtol=2.0 ** -23)
    tiny = ~normal & ~np.isinf(want32)
    assert np.abs(out[tiny] - want32[tiny]).max() <= np.float32(1.5e-45)
    assert np.isinf(out[x > 88.73]).all() and (out[x < -104] == 0).all()
    special = np.array([np.nan, np.inf, -np.inf], np.float32)
    _exp32_all(special, out[:3])
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == 0


@numba.njit
def _exp_neg32_all(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.size):
        out[i] = exp_neg32(x[i])


def test_exp_neg32_is_within_one_ulp() -> None:
    """softmax's exp of x - max <= 0: 1 ulp where the result is above 2^-125, 0 below -86.9
    (a term under 2.2e-38 of a softmax row's sum), NaN for NaN, 0 for -inf."""
    x = np.concatenate([np.linspace(-110, 0, 400_001), np.linspace(0, 88, 1001),
                        [0.0, -0.0, -1e-30, -86.9, -86.89]]).astype(np.float32)
    out = np.empty_like(x)
    _exp_neg32_all(x, out)
    want = np.exp(x.astype(np.float64))
    kept = x >= np.float32(-86.9)
    np.testing.assert_allclose(out[kept], want[kept], rtol=2.0 ** -23)
    assert (out[~kept] == 0).all() and (want[~kept] < 2.0 ** -125).all()
    special = np.array([np.nan, -np.inf], np.float32)
    _exp_neg32_all(special, out[:2])
    assert np.isnan(out[0]) and out[1] == 0


@numba.njit
def _mul_adds(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
    for i in range(a.size):
        out[i] = mul_add(a[i], b[i], c[i])


def test_mul_add_rounds_once_where_the_cpu_fuses() -> None:
    """a * b + c in the arrays' type: the exactly rounded value where the CPU has fused
    multiply-adds (x86-64 with FMA3), else the twice-rounded one; NaN and inf as the two
    operations give them."""
    from llvmlite import binding
    fuses = bool(binding.get_host_cpu_features().get("fma", False))
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(10_000).astype(np.float32) for _ in range(3))
    out = np.empty_like(a)
    _mul_adds(a, b, c, out)
    # float32 products are exact in float64, so this rounds the exact result (almost always
    # once: a float64 sum on a float32 midpoint is rare enough for 10,000 random values)
    once = (a.astype(np.float64) * b.astype(np.float64) + c).astype(np.float32)
    np.testing.assert_array_equal(out, once if fuses else a * b + c)
    wide = [x.astype(np.float64) for x in (a, b, c)]
    out64 = np.empty(a.size, np.float64)
    _mul_adds(*wide, out64)
    np.testing.assert_allclose(out64, wide[0] * wide[1] + wide[2], rtol=1e-12, atol=1e-12)
    special = np.array([np.inf, np.nan, 0.0, np.inf, -np.inf], np.float32)
    out = np.empty(5, np.float32)
    _mul_adds(special, np.array([0.0, 1.0, np.inf, 1.0, 2.0], np.float32),
              np.array([1.0, 1.0, 1.0, -np.inf, 1.0], np.float32), out)
    assert np.isnan(out[:4]).all() and out[4] == -np.inf
