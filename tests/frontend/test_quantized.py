"""Quantized inference: QLinearConv / QLinearMatMul per channel against float64 NumPy written
from ONNX's definitions (exact integers), and ONNX Runtime's own quantization tool applied to
the committed ResNet and BERT exports (quantize_dynamic; quantize_static, QDQ, per channel)
compared with ONNX Runtime running the same quantized models."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx_builders import init, model, run_ort, run_ours, tensor

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

DATA = Path(__file__).resolve().parents[1] / "data" / "onnx"
RNG = np.random.default_rng(11)


def _requantize(acc: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    info = np.iinfo(zero.dtype)
    return np.clip(np.rint(acc * scale.astype(np.float64) + zero), info.min,
                   info.max).astype(zero.dtype)


def _conv_reference(x: np.ndarray, w: np.ndarray, pads: int) -> np.ndarray:
    """Direct 2-D convolution of integer-valued float64 arrays (stride 1)."""
    x = np.pad(x, ((0, 0), (0, 0), (pads, pads), (pads, pads)))
    n, _, h, wd = x.shape
    co, _, kh, kw = w.shape
    out = np.zeros((n, co, h - kh + 1, wd - kw + 1))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + out.shape[2], j:j + out.shape[3]]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinearconv_per_channel(dtype) -> None:
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, (1, 3, 6, 6)).astype(dtype)
    w = RNG.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    bias = RNG.integers(-500, 500, 4).astype(np.int32)
    xs, xz = np.float32(0.02), np.array(3, dtype)
    ws, wz = (RNG.uniform(0.001, 0.01, 4).astype(np.float32), np.zeros(4, np.int8))
    ys, yz = np.float32(0.05), np.array(5, dtype)
    names = ["xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"]
    node = helper.make_node("QLinearConv", ["x"] + names[:7] + ["bias"], ["y"], pads=[1] * 4)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    m = model([node], [tensor("x", elem, x.shape)], [tensor("y", elem, None)],
              [init(n, v) for n, v in zip(names, [xs, xz, w, ws, wz, ys, yz, bias])], opset=13)
    acc = _conv_reference(x.astype(np.float64) - int(xz), w.astype(np.float64), 1) \
        + bias.reshape(1, 4, 1, 1)
    want = _requantize(acc, (xs * ws / ys).reshape(1, 4, 1, 1), yz)
    (got,) = run_ours(m, {"x": x}, "cpu")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, run_ort(m, {"x": x})[0])


def test_qlinearmatmul_per_column_and_matmulinteger() -> None:
    a = RNG.integers(0, 256, (2, 5, 64)).astype(np.uint8)
    b = RNG.integers(-128, 128, (64, 7)).astype(np.int8)
    az, bz = np.array(128, np.uint8), RNG.integers(-3, 3, 7).astype(np.int8)
    a_s, b_s = np.float32(0.01), RNG.uniform(0.001, 0.01, 7).astype(np.float32)
    ys, yz = np.float32(0.5), np.array(-2, np.int8)
    q = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    mi = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["acc"])
    m = model([q, mi], [tensor("a", TensorProto.UINT8, a.shape)],
              [tensor("y", TensorProto.INT8, None), tensor("acc", TensorProto.INT32, None)],
              [init(n, v) for n, v in [("as", a_s), ("az", az), ("b", b), ("bs", b_s),
                                       ("bz", bz), ("ys", ys), ("yz", yz)]], opset=21)
    acc = (a.astype(np.int64) - 128) @ (b.astype(np.int64) - bz)
    got_y, got_acc = run_ours(m, {"a": a}, "cpu")
    np.testing.assert_array_equal(got_acc, acc.astype(np.int32))
    np.testing.assert_array_equal(got_y, _requantize(acc, a_s * b_s / ys, yz))


def _feeds(path: Path, seed: int) -> dict[str, np.ndarray]:
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in session.get_inputs():
        if info.type == "tensor(int64)":
            high = 2 if "mask" in info.name else 100
            feeds[info.name] = rng.integers(1 if high == 2 else 0, high, info.shape)
        else:
            feeds[info.name] = rng.standard_normal(info.shape).astype(np.float32)
    return feeds


def _output_scales(m) -> dict[str, float]:
    """Each graph output made by a DequantizeLinear -> its (constant) scale."""
    from onnx import numpy_helper
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    scales = {}
    for node in m.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[1] in consts:
            scales[node.output[0]] = float(np.max(consts[node.input[1]]))
    return scales


@pytest.mark.parametrize("name", ["resnet_ts", "bert_ts"])
@pytest.mark.parametrize("mode", ["dynamic", "static_qdq"])
def test_onnxruntime_quantized_model_matches(name: str, mode: str, tmp_path: Path) -> None:
    """Within 3 output quantisation steps where the output is dequantized, else 1e-5 relative
    (float ops after the last integer one: summation order only)."""
    pytest.importorskip("onnxruntime.quantization")
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)
    source = DATA / f"{name}.onnx"
    out = tmp_path / f"{name}_{mode}.onnx"
    if mode == "dynamic":
        quantize_dynamic(str(source), str(out), weight_type=QuantType.QInt8)
    else:
        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.batches = iter([_feeds(source, seed) for seed in range(4)])

            def get_next(self):
                return next(self.batches, None)
        quantize_static(str(source), str(out), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True)
    m = onnx.load(str(out))
    feeds = _feeds(source, 99)
    got = run_ours(m, feeds, "cpu")
    want = run_ort(m, feeds)
    scales = _output_scales(m)
    for info, g, w in zip(m.graph.output, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        diff = float(np.abs(g - w).max())
        bound = 3 * scales[info.name] if info.name in scales else 1e-5 * float(np.abs(w).max())
        print(f"{name} {mode} {info.name}: max|diff| {diff:.3g} (bound {bound:.3g})")
        assert diff <= bound
