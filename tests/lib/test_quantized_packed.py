"""qdense_add_packed against the qdense_add kernels it replaces, run one projection at a time:
equal without oneDNN (the same reference requantization); with oneDNN the packed op requantizes
the int32 product by the reference steps where qdense_add lets oneDNN do it, so a value on a
half-step tie may land one step away."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import GraphRuntimeError
from graph_runtime.lib.kernels.cpu.quantized import qadd_table
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.ops.quantized import _qdense_add_cpu
from graph_runtime.lib.ops.quantized_packed import _cpu, _infer
from graph_runtime.settings import ONEDNN


@pytest.mark.parametrize("onednn", ["auto", "off"])
@pytest.mark.parametrize("x_dtype", ["int8", "uint8"])
def test_packed_projections_equal_each_qdense_add(onednn, x_dtype, monkeypatch) -> None:
    monkeypatch.setenv(ONEDNN.name, onednn)
    rng = np.random.default_rng(51)
    lo, hi = (-128, 127) if x_dtype == "int8" else (0, 255)
    x = rng.integers(lo, hi + 1, (2, 9, 24)).astype(x_dtype)
    parts, outs = [], []
    for i, n in enumerate((8, 8, 5)):
        w = rng.integers(-127, 128, (24, n)).astype(np.int8)
        m = rng.uniform(1e-3, 4e-3, n).astype(np.float32)
        b = rng.uniform(-3, 3, n).astype(np.float32)
        addend = (rng.integers(-128, 128, n) if i != 1 else rng.integers(-128, 128, 1)).astype(
            np.int8)
        attrs = dict(x_zero=int(lo + 3), y_zero=i - 1, relu=False, dtype="int8",
                     add_a_scale=0.02 + i / 100, add_a_zero=i - 1, add_b_scale=0.013,
                     add_b_zero=2, add_y_scale=0.03, add_y_zero=-i, add_relu=False,
                     add_dtype="int8")
        specs = [TensorSpec(a.shape, str(a.dtype)) for a in (x, w, m, b, addend)]
        out = np.empty((2, 9, n), np.int8)
        _qdense_add_cpu(None, 0, specs, [TensorSpec(out.shape, "int8")], attrs)(
            x, w, m, b, addend, out)
        outs.append(out)
        table = qadd_table((attrs["add_a_scale"], 0.013, 0.03), (i - 1, 2, -i), False, "int8",
                           "int8", "int8").reshape(256, 256)
        column = np.broadcast_to(addend, (n,)).view(np.uint8).astype(np.int64)
        parts.append((w, m, b, np.full(n, i - 1, np.int32), table[:, column].T))
    packed = [np.concatenate([p[j] for p in parts], axis=-1) for j in range(4)]
    colmap = np.concatenate([p[4] for p in parts]).reshape(-1).copy()
    arrays = [x, *packed, colmap]
    specs = [TensorSpec(a.shape, str(a.dtype)) for a in arrays]
    attrs = {"x_zero": int(lo + 3), "dense_dtype": "int8"}
    (spec,) = _infer(specs, attrs)
    assert spec == TensorSpec((2, 9, 21), "int8")
    got = np.empty((2, 9, 21), np.int8)
    _cpu(None, 0, specs, [spec], attrs)(*arrays, got)
    want = np.concatenate(outs, axis=-1)
    steps = np.abs(got.astype(np.int64) - want)
    if onednn == "off":
        np.testing.assert_array_equal(got, want)
    else:
        assert steps.max() <= 1 and np.mean(steps == 0) > 0.97


def test_packed_refuses_a_byte_map_of_another_length() -> None:
    specs = [TensorSpec((3, 4), "int8"), TensorSpec((4, 6), "int8"), TensorSpec((6,), "float32"),
             TensorSpec((6,), "float32"), TensorSpec((6,), "int32"),
             TensorSpec((6 * 255,), "int8")]
    with pytest.raises(GraphRuntimeError, match=r"input 5 \(colmap\) is int8 \(1530,\)"):
        _infer(specs, {"x_zero": 0, "dense_dtype": "int8"})
