"""convert_type (ONNX Cast to and from bfloat16, float8, int4...) against float64 references: the
nearest value of every float8 format found by search over all 256 codes, ties to the even code."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graph_runtime as gr
from graph_runtime.params import load_param_dict, save_param_dict

FLOAT8 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"]


def nearest_float8(x: np.ndarray, dtype: str, saturate: bool) -> np.ndarray:
    """Each value's nearest finite code of dtype (ties: even code), saturating past the largest;
    NaN stays NaN; without saturation, past the largest becomes inf (e5m2) or NaN."""
    codes = np.arange(256, dtype=np.uint8).view(dtype)
    values = codes.astype(np.float64)
    finite = np.isfinite(values)
    values, codes = values[finite], codes[finite]
    top = values.max()
    out = []
    for v in x.astype(np.float64).ravel():
        if np.isnan(v):
            out.append(np.nan)
            continue
        if abs(v) > top:
            if saturate:
                out.append(np.sign(v) * top)
                continue
            if dtype == "float8_e5m2" and (np.isinf(v) or abs(v) >= 61440):
                out.append(np.sign(v) * np.inf)
                continue
            if np.isinf(v) or abs(v) >= top * (1 + 2.0 ** -(4 if "e4m3" in dtype else 3)):
                out.append(np.nan)
                continue
        gap = np.abs(values - v)
        best = np.flatnonzero(gap == gap.min())
        pick = best[np.argmin(codes[best].view(np.uint8) & 1)] if len(best) > 1 else best[0]
        out.append(values[pick])
    return np.array(out).reshape(x.shape)


@pytest.mark.parametrize("dtype", FLOAT8)
@pytest.mark.parametrize("saturate", [True, False])
def test_float_to_float8(dtype: str, saturate: bool, run_op) -> None:
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(200) * 30, [0.0, -0.0, 1e6, -1e6, np.inf, -np.inf,
                                                        np.nan, 2.0 ** -9, 3 * 2.0 ** -10]])
    x = x.astype(np.float32)
    (got,) = run_op("cpu", "convert_type", [x], {"dtype": dtype, "saturate": int(saturate)})
    assert str(got.dtype) == dtype
    want = nearest_float8(x, dtype, saturate)
    np.testing.assert_array_equal(got.astype(np.float64), want)


@pytest.mark.parametrize("dtype", FLOAT8 + ["bfloat16", "int4", "uint4"])
def test_back_to_float32_is_exact(dtype: str, run_op) -> None:
    codes = np.arange(256 if dtype != "bfloat16" else 65536, dtype=np.uint16 if dtype ==
                      "bfloat16" else np.uint8)
    if dtype in ("int4", "uint4"):
        x = np.arange(-8, 8) if dtype == "int4" else np.arange(16)
        x = x.astype(dtype)
    else:
        x = codes.view(dtype)
    (got,) = run_op("cpu", "convert_type", [x], {"dtype": "float32"})
    np.testing.assert_array_equal(got, x.astype(np.float64).astype(np.float32))


def test_int4_wraps_as_onnx_cast(run_op) -> None:
    x = np.arange(-9, 15).astype(np.float32)
    (got,) = run_op("cpu", "convert_type", [x], {"dtype": "int4"})
    want = (x.astype(np.int64) + 8) % 16 - 8
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2fnuz", "int4",
                                   "uint4", "float4_e2m1fn"])
def test_params_round_trip_with_dlpack_codes(dtype: str) -> None:
    x = np.arange(6).reshape(2, 3).astype(np.float32).astype(dtype)
    data = save_param_dict({"w": x})
    back = load_param_dict(data)["w"].numpy()
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back.astype(np.float32), x.astype(np.float32))
    assert isinstance(gr.nd.array(x).numpy(), np.ndarray)
