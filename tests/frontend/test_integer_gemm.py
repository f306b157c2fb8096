"""MatMulInteger with constant weights (float32 GEMMs split along K) is exact: equal to int64
NumPy, including a depth that needs several chunks and extreme operands."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_builders import init, model, run_ours, tensor

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

from graph_runtime.frontend.convert_integer_gemm import exact_chunk


@pytest.mark.parametrize("a_type,depth", [("uint8", 1000), ("int8", 64), ("uint8", 1)])
def test_matmulinteger_const_weights_exact(a_type: str, depth: int) -> None:
    rng = np.random.default_rng(depth)
    info = np.iinfo(a_type)
    a = rng.integers(info.min, info.max + 1, (2, 3, depth)).astype(a_type)
    a[0, 0] = info.max  # the largest products, all of one sign
    w = rng.integers(-128, 128, (depth, 5)).astype(np.int8)
    w[:, 0] = -128
    a_zero = np.array(info.min, a_type)
    w_zero = rng.integers(-3, 3, 5).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["a", "w", "az", "wz"], ["y"])
    elem = TensorProto.UINT8 if a_type == "uint8" else TensorProto.INT8
    m = model([node], [tensor("a", elem, a.shape)], [tensor("y", TensorProto.INT32, (2, 3, 5))],
              [init("w", w), init("az", a_zero), init("wz", w_zero)])
    (got,) = run_ours(m, {"a": a}, "cpu")
    want = (a.astype(np.int64) - int(a_zero)) @ (w.astype(np.int64) - w_zero.astype(np.int64))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    centered = w.astype(np.int64) - w_zero
    assert exact_chunk(centered.astype(np.float64)) * 255 * np.abs(centered).max() < 2 ** 24
