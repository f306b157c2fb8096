"""cumprod (cpu) against a float64 loop reference of ONNX CumProd."""
from __future__ import annotations

import numpy as np
import pytest


def cumprod_reference(x, axis, exclusive, reverse):
    x64 = np.moveaxis(x.astype(np.float64), axis, -1)
    out = np.ones_like(x64)
    n = x64.shape[-1]
    for i in range(n):
        span = range(i, n) if reverse else range(i + 1)
        for j in span:
            if not (exclusive and j == i):
                out[..., i] *= x64[..., j]
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_cumprod(exclusive, reverse, dtype, run_op, random_array, assert_close) -> None:
    x = random_array((3, 5, 2), dtype, -2, 2, seed=1)
    for axis in (1, -1, 0):
        (got,) = run_op("cpu", "cumprod", [x], {"axis": axis, "exclusive": int(exclusive),
                                                 "reverse": int(reverse)})
        want = cumprod_reference(x, axis, exclusive, reverse)
        assert_close(got, want if dtype == "float32" else want.astype(dtype), dtype)
