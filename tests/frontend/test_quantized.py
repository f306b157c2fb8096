"""Quantized inference: QLinearConv / QLinearMatMul per channel against float64 NumPy written
from ONNX's definitions (exact integers); the QDQ form fused into integer ops and
ConvInteger / MatMulInteger with constant weights on the integer ops, against ONNX Runtime and
exact references; and ONNX Runtime's own quantization tool applied to the committed ResNet and
BERT exports (quantize_dynamic; quantize_static, QDQ, per channel) compared with ONNX Runtime
running the same quantized models, with oneDNN and without it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx_builders import init, model, run_ort_int8, run_ours, tensor
from quantize_models import MODES, feeds_for, quantized

from graph_runtime.frontend.importer import import_onnx
from graph_runtime.settings import IMPORT_INT8, ONEDNN

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
    np.testing.assert_array_equal(got, run_ort_int8(m, {"x": x})[0])


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


def _output_scales(m) -> dict[str, float]:
    """Each graph output made by a DequantizeLinear -> its (constant) scale."""
    from onnx import numpy_helper
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    scales = {}
    for node in m.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[1] in consts:
            scales[node.output[0]] = float(np.max(consts[node.input[1]]))
    return scales


@pytest.mark.parametrize("onednn", ["auto", "off"])
@pytest.mark.parametrize("name", ["resnet_ts", "bert_ts"])
@pytest.mark.parametrize("mode", MODES)
def test_onnxruntime_quantized_model_matches(name: str, mode: str, onednn: str,
                                             tmp_path: Path, monkeypatch) -> None:
    """Within 3 output quantisation steps where the output is dequantized, else 1e-5 relative
    (float ops after the last integer one: summation order only); with oneDNN's integer kernels
    and without them (GRAPH_RUNTIME_ONEDNN=off)."""
    pytest.importorskip("onnxruntime.quantization")
    monkeypatch.setenv(ONEDNN.name, onednn)
    source = DATA / f"{name}.onnx"
    m = onnx.load(str(quantized(source, mode, tmp_path)))
    feeds = feeds_for(source, 99)
    imported = import_onnx(m)
    fused = {"QConv", "QAdd"} if name.startswith("resnet") else {"QDenseAdd", "QAdd",
                                                                 "qdq_attention", "qlookup",
                                                                 "qdq_qkv_packed",
                                                                 "qadd_layer_norm"}
    if mode == "static_qdq":
        assert fused <= set(imported.patterns), imported.patterns
    elif name.startswith("bert"):  # Q, K, V one product; every quantize inside its matmul
        assert {"qkv_packed", "dense_dynamic_scaled"} <= set(imported.patterns)
        assert not any(f.endswith("_dynamic_quantize") for f in imported.func_names)
    got = run_ours(m, feeds, "cpu")
    want = run_ort_int8(m, feeds)
    scales = _output_scales(m)
    for info, g, w in zip(m.graph.output, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        diff = float(np.abs(g - w).max())
        bound = 3 * scales[info.name] if info.name in scales else 1e-5 * float(np.abs(w).max())
        print(f"{name} {mode} {info.name}: max|diff| {diff:.3g} (bound {bound:.3g})")
        assert diff <= bound


def _qdq(x: str, scale: float, zero: int, dtype, out: str, inits: list) -> object:
    """A DequantizeLinear node reading x with initializer parameters (appended to inits)."""
    inits += [init(f"{out}_s", np.float32(scale)), init(f"{out}_z", np.array(zero, dtype))]
    return helper.make_node("DequantizeLinear", [x, f"{out}_s", f"{out}_z"], [out])


def _q(x: str, scale: float, zero: int, dtype, out: str, inits: list) -> object:
    inits += [init(f"{out}_s", np.float32(scale)), init(f"{out}_z", np.array(zero, dtype))]
    return helper.make_node("QuantizeLinear", [x, f"{out}_s", f"{out}_z"], [out])


@pytest.mark.parametrize("onednn", ["auto", "off"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qdq_conv_add_gemm_fused_and_match_onnxruntime(dtype, onednn, monkeypatch) -> None:
    """DQ -> Conv (groups, pads, stride, per-channel int32 bias) -> Relu -> Q, DQ + DQ -> Add ->
    Q, DQ -> Gemm (transposed int8 weights) -> Q, DQ -> MatMul -> Relu -> Q: each fused into
    one integer op, DQ -> MaxPool / Reshape -> Q run on the integers, and within one step of
    ONNX Runtime (which fuses them into its own QLinear kernels)."""
    monkeypatch.setenv(ONEDNN.name, onednn)
    rng = np.random.default_rng(3)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    zero = 128 if dtype == np.uint8 else 5
    inits: list = []
    w = rng.integers(-127, 128, (6, 2, 3, 3)).astype(np.int8)
    ws = rng.uniform(0.002, 0.01, 6).astype(np.float32)
    bias = rng.integers(-300, 300, 6).astype(np.int32)
    inits += [init("w", w), init("ws", ws), init("wz", np.zeros(6, np.int8)), init("bias", bias),
              init("bs", (np.float32(0.05) * ws).astype(np.float32))]
    g_w = rng.integers(-127, 128, (7, 6 * 6 * 5)).astype(np.int8)
    m_w = rng.integers(-127, 128, (7, 4)).astype(np.int8)
    inits += [init("gw", g_w), init("gws", np.float32(0.004)), init("gwz", np.int8(0)),
              init("mw", m_w), init("mws", rng.uniform(0.01, 0.02, 4).astype(np.float32)),
              init("mwz", np.zeros(4, np.int8)), init("shape", np.array([2, -1], np.int64))]
    nodes = [
        _qdq("x", 0.05, zero, dtype, "xf", inits),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
        helper.make_node("DequantizeLinear", ["bias", "bs"], ["bf"], axis=0),
        helper.make_node("Conv", ["xf", "wf", "bf"], ["c"], group=2, pads=[1, 0, 2, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        _q("r", 0.1, 0 if dtype == np.uint8 else -20, dtype, "rq", inits),
        _qdq("rq", 0.1, 0 if dtype == np.uint8 else -20, dtype, "rf", inits),
        _qdq("rq", 0.1, 0 if dtype == np.uint8 else -20, dtype, "rf2", inits),
        helper.make_node("Add", ["rf", "rf2"], ["sum"]),
        _q("sum", 0.15, 3, dtype, "sq", inits),
        _qdq("sq", 0.15, 3, dtype, "sf0", inits),
        helper.make_node("MaxPool", ["sf0"], ["mp"], kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
        _q("mp", 0.15, 3, dtype, "mq", inits),
        _qdq("mq", 0.15, 3, dtype, "sf", inits),
        helper.make_node("Reshape", ["sf", "shape"], ["flat"]),
        _q("flat", 0.15, 3, dtype, "fq", inits),
        _qdq("fq", 0.15, 3, dtype, "ff", inits),
        helper.make_node("DequantizeLinear", ["gw", "gws", "gwz"], ["gwf"]),
        helper.make_node("Gemm", ["ff", "gwf"], ["gemm"], transB=1),
        _q("gemm", 0.2, zero, dtype, "gq", inits),
        _qdq("gq", 0.2, zero, dtype, "gf", inits),
        helper.make_node("DequantizeLinear", ["mw", "mws", "mwz"], ["mwf"], axis=1),
        helper.make_node("MatMul", ["gf", "mwf"], ["mm"]),
        helper.make_node("Relu", ["mm"], ["mr"]),
        _q("mr", 0.3, zero, dtype, "y", inits),
    ]
    m = model(nodes, [tensor("x", elem, (2, 4, 9, 9))], [tensor("y", elem, None)], inits,
              opset=13)
    x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, (2, 4, 9, 9)).astype(dtype)
    patterns = import_onnx(m).patterns
    assert (patterns["QConv"], patterns["QAdd"], patterns["QDense"],
            patterns["QDQ pass-through"]) == (1, 1, 2, 2), patterns
    (got,) = run_ours(m, {"x": x}, "cpu")
    (want,) = run_ort_int8(m, {"x": x})
    steps = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert steps.max() <= 1


@pytest.mark.parametrize("onednn", ["auto", "off"])
@pytest.mark.parametrize("bias_first", [False, True])
def test_qdq_matmul_and_its_quantized_bias_add_merged(onednn, bias_first, monkeypatch) -> None:
    """DQ -> MatMul -> Q -> DQ -> Add(DQ(Q(Identity(DQ(int32 bias))))) -> Q, as quantize_static
    writes a BERT projection: one qdense_add, within one step of ONNX Runtime."""
    monkeypatch.setenv(ONEDNN.name, onednn)
    rng = np.random.default_rng(15)
    inits: list = []
    w = rng.integers(-127, 128, (20, 12)).astype(np.int8)
    inits += [init("w", w), init("ws", rng.uniform(0.005, 0.01, 12).astype(np.float32)),
              init("wz", np.zeros(12, np.int8)),
              init("bq", rng.integers(-2000, 2000, 12).astype(np.int32)),
              init("bqs", np.float32(0.0007)), init("bqz", np.int32(0))]
    nodes = [
        _qdq("x", 0.04, 3, np.int8, "xf", inits),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=1),
        helper.make_node("MatMul", ["xf", "wf"], ["mm"]),
        _q("mm", 0.3, -4, np.int8, "mq", inits),
        _qdq("mq", 0.3, -4, np.int8, "mf", inits),
        helper.make_node("DequantizeLinear", ["bq", "bqs", "bqz"], ["bf0"]),
        helper.make_node("Identity", ["bf0"], ["bf1"]),
        _q("bf1", 0.01, 2, np.int8, "bq8", inits),
        _qdq("bq8", 0.01, 2, np.int8, "bf", inits),
        helper.make_node("Add", ["bf", "mf"] if bias_first else ["mf", "bf"], ["sum"]),
        _q("sum", 0.35, 1, np.int8, "y", inits),
    ]
    m = model(nodes, [tensor("x", TensorProto.INT8, (2, 3, 20))],
              [tensor("y", TensorProto.INT8, None)], inits, opset=13)
    assert import_onnx(m).patterns["QDenseAdd"] == 1
    x = rng.integers(-128, 128, (2, 3, 20)).astype(np.int8)
    (got,), (want,) = run_ours(m, {"x": x}, "cpu"), run_ort_int8(m, {"x": x})
    assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max() <= 1


@pytest.mark.parametrize("onednn", ["auto", "off"])
def test_conv_and_matmul_integer_with_constant_weights(onednn, monkeypatch) -> None:
    """quantize_dynamic's form (constant int8 weights, zero point 0; x's zero point computed)
    as conv2d_integer / dense_integer: the exact int32 accumulators."""
    monkeypatch.setenv(ONEDNN.name, onednn)
    rng = np.random.default_rng(4)
    w = rng.integers(-128, 128, (5, 3, 3, 3)).astype(np.int8)
    mw = rng.integers(-128, 128, (11, 6)).astype(np.int8)
    nodes = [helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MatMulInteger", ["a", "mw", "az"], ["mm"])]
    m = model(nodes, [tensor("x", TensorProto.UINT8, (2, 3, 7, 8)),
                      tensor("xz", TensorProto.UINT8, ()),
                      tensor("a", TensorProto.UINT8, (2, 3, 11)),
                      tensor("az", TensorProto.UINT8, ())],
              [tensor("c", TensorProto.INT32, None), tensor("mm", TensorProto.INT32, None)],
              [init("w", w), init("wz", np.int8(0)), init("mw", mw)], opset=13)
    feeds = {"x": rng.integers(0, 256, (2, 3, 7, 8)).astype(np.uint8), "xz": np.uint8(77),
             "a": rng.integers(0, 256, (2, 3, 11)).astype(np.uint8), "az": np.uint8(200)}
    funcs = " ".join(import_onnx(m).func_names)
    assert "conv2d_integer" in funcs and "dense_integer" in funcs, funcs
    got_c, got_mm = run_ours(m, feeds, "cpu")
    acc = _conv_reference(feeds["x"].astype(np.float64) - 77, w.astype(np.float64), 1)
    np.testing.assert_array_equal(got_c, acc.astype(np.int32))
    np.testing.assert_array_equal(got_mm, (feeds["a"].astype(np.int64) - 200) @ mw)


def test_per_channel_dequantize_of_1x1_conv_weights_folds() -> None:
    """A per-output-channel DequantizeLinear of (O, C, 1, 1) weights read by a float Conv (no
    QuantizeLinear after it, so not fused) folds to a constant of the weights' shape (the fold
    size check once broadcast the (O,) scale against the last axis: (O, C, 1, O))."""
    rng = np.random.default_rng(9)
    w = rng.integers(-127, 128, (300, 200, 1, 1)).astype(np.int8)
    ws = rng.uniform(0.001, 0.01, 300).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
             helper.make_node("Conv", ["x", "wf"], ["y"])]
    m = model(nodes, [tensor("x", TensorProto.FLOAT, (1, 200, 3, 3))],
              [tensor("y", TensorProto.FLOAT, None)],
              [init("w", w), init("ws", ws), init("wz", np.zeros(300, np.int8))], opset=13)
    x = rng.standard_normal((1, 200, 3, 3)).astype(np.float32)
    (got,) = run_ours(m, {"x": x}, "cpu")
    want = np.einsum("nchw,oc->nohw", x.astype(np.float64),
                     (w[:, :, 0, 0] * ws[:, None].astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("readers", [1, 2])
def test_matmul_integer_cast_mul_add_fused_into_one_op(readers: int) -> None:
    """quantize_dynamic's MatMulInteger -> Cast -> Mul(x_scale * w_scale) -> Add(bias, behind
    PyTorch's Identity) as dense_integer_scaled, against ONNX Runtime (float: summation order
    only); its DynamicQuantizeLinear merged into it (dense_dynamic_scaled) where that product
    alone reads it, kept as its own node where two do."""
    rng = np.random.default_rng(13)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"])]
    inits = [init("wz", np.int8(0)), init("ws", np.float32(0.0042))]
    for i in range(readers):
        nodes += [helper.make_node("MatMulInteger", ["xq", f"w{i}", "xz", "wz"], [f"acc{i}"]),
                  helper.make_node("Cast", [f"acc{i}"], [f"accf{i}"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["xs", "ws"], [f"scale{i}"]),
                  helper.make_node("Mul", [f"accf{i}", f"scale{i}"], [f"y0{i}"]),
                  helper.make_node("Identity", [f"bias{i}"], [f"b{i}"]),
                  helper.make_node("Add", [f"b{i}", f"y0{i}"], [f"y{i}"])]
        inits += [init(f"w{i}", rng.integers(-128, 128, (24, 10)).astype(np.int8)),
                  init(f"bias{i}", rng.standard_normal(10).astype(np.float32))]
    m = model(nodes, [tensor("x", TensorProto.FLOAT, (3, 5, 24))],
              [tensor(f"y{i}", TensorProto.FLOAT, None) for i in range(readers)], inits,
              opset=13)
    imported = import_onnx(m)
    assert imported.patterns["IntegerToFloatMatMul"] == readers
    funcs = " ".join(imported.func_names)
    assert len(imported.func_names) == (1 if readers == 1 else 3), funcs
    assert ("dense_dynamic_scaled" in funcs) == (readers == 1), funcs
    x = rng.standard_normal((3, 5, 24)).astype(np.float32)
    for got, want in zip(run_ours(m, {"x": x}, "cpu"), run_ort_int8(m, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_conv_integer_cast_mul_add_fused_into_one_op() -> None:
    """quantize_dynamic's ConvInteger -> Cast -> Mul(x_scale * w_scale) -> Add(Reshape(bias)) as
    conv2d_integer_scaled, against ONNX Runtime (float: summation order only)."""
    rng = np.random.default_rng(14)
    w = rng.integers(-128, 128, (6, 4, 3, 3)).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1],
                              strides=[2, 1]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["scale"]),
             helper.make_node("Mul", ["accf", "scale"], ["y0"]),
             helper.make_node("Reshape", ["bias", "bshape"], ["b3"]),
             helper.make_node("Add", ["y0", "b3"], ["y1"]),
             helper.make_node("Relu", ["y1"], ["y"])]
    m = model(nodes, [tensor("x", TensorProto.FLOAT, (2, 4, 9, 7))],
              [tensor("y", TensorProto.FLOAT, None)],
              [init("w", w), init("wz", np.int8(0)),
               init("ws", rng.uniform(0.001, 0.01, (6, 1, 1)).astype(np.float32)),
               init("bias", rng.standard_normal(6).astype(np.float32)),
               init("bshape", np.array([6, 1, 1], np.int64))], opset=13)
    assert import_onnx(m).patterns["IntegerToFloatConv"] == 1
    x = rng.standard_normal((2, 4, 9, 7)).astype(np.float32)
    (got,), (want,) = run_ours(m, {"x": x}, "cpu"), run_ort_int8(m, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name,mode", [("resnet_ts", "static_qdq"), ("bert_ts", "dynamic")])
def test_int8_import_off_keeps_the_float_lowering(name, mode, tmp_path, monkeypatch) -> None:
    """GRAPH_RUNTIME_IMPORT_INT8=off: no integer op (they are CPU-only), outputs as before."""
    pytest.importorskip("onnxruntime.quantization")
    monkeypatch.setenv(IMPORT_INT8.name, "off")
    source = DATA / f"{name}.onnx"
    m = onnx.load(str(quantized(source, mode, tmp_path)))
    imported = import_onnx(m)
    funcs = " ".join(imported.func_names)
    assert not any(op in funcs for op in ("qconv2d", "qdense", "qadd", "_integer",
                                          "dynamic_quantize", "qlookup", "qdq_attention")), funcs
    feeds = feeds_for(source, 99)
    scales = _output_scales(m)
    for info, g, w in zip(m.graph.output, run_ours(m, feeds, "cpu"), run_ort_int8(m, feeds)):
        bound = 3 * scales[info.name] if info.name in scales else 1e-5 * float(np.abs(w).max())
        assert float(np.abs(g - w).max()) <= bound


def test_int8_activations_stay_nhwc_between_integer_kernels(tmp_path: Path) -> None:
    """The static ResNet's 8-bit activations between qconv2d / qadd nodes are kept NHWC
    (runtime/layouts.py), and the output still matches ONNX Runtime's."""
    pytest.importorskip("onnxruntime.quantization")
    from graph_runtime.lib.kernels.onednn import binding
    if not binding.available():
        pytest.skip(f"oneDNN not available: {binding.unavailable_reason()}")
    if not binding.exact_int8():
        pytest.skip("oneDNN's int8 kernels saturate on this CPU (no VNNI): the NumPy ones run")
    import graph_runtime as gr
    from graph_runtime.frontend import from_onnx
    source = DATA / "resnet_ts.onnx"
    m = onnx.load(str(quantized(source, "static_qdq", tmp_path)))
    graph_json, lib, params = from_onnx(m)
    module = gr.create(graph_json, lib, gr.cpu())
    module.load_params(gr.save_param_dict(params))
    dtypes = module.executor.graph.dtype
    kept = [eid for eid in module.executor.channels_last if dtypes(eid) in ("uint8", "int8")]
    assert len(kept) >= 10, kept
    feeds = feeds_for(source, 99)
    module.run(**feeds)
    (want,) = run_ort_int8(m, feeds)
    np.testing.assert_allclose(module.get_output(0).numpy(), want,
                               atol=3 * _output_scales(m)[m.graph.output[0].name])


def test_quantize_dequantize_of_constants_fold_as_their_converters_compute() -> None:
    """Opset 13 (ONNX's reference evaluator has these ops from 19): DequantizeLinear per axis
    with zero points and of an int32 bias, QuantizeLinear with saturation, folded at import
    (no run-time node left) and equal to ONNX Runtime's."""
    rng = np.random.default_rng(16)
    w = rng.integers(-128, 128, (4, 3, 2)).astype(np.int8)
    x = (rng.standard_normal((5, 7)) * 40).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["a"], axis=1),
             helper.make_node("DequantizeLinear", ["b", "bs"], ["c"]),
             helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["d"]),
             helper.make_node("Add", ["a", "in"], ["y"])]
    m = model(nodes, [tensor("in", TensorProto.FLOAT, (4, 3, 2))],
              [tensor("y", TensorProto.FLOAT, None), tensor("c", TensorProto.FLOAT, None),
               tensor("d", TensorProto.INT8, None)],
              [init("w", w), init("ws", rng.uniform(0.01, 0.1, 3).astype(np.float32)),
               init("wz", rng.integers(-5, 5, 3).astype(np.int8)),
               init("b", rng.integers(-2 ** 30, 2 ** 30, 6).astype(np.int32)),
               init("bs", np.float32(3e-5)), init("x", x), init("xs", np.float32(0.3)),
               init("xz", np.int8(-7))], opset=13)
    imported = import_onnx(m)
    assert imported.folded["DequantizeLinear"] == 2 and imported.folded["QuantizeLinear"] == 1
    feeds = {"in": rng.standard_normal((4, 3, 2)).astype(np.float32)}
    for got, want in zip(run_ours(m, feeds, "cpu"), run_ort_int8(m, feeds)):
        np.testing.assert_array_equal(got, want)


def test_a_dynamic_quantize_no_integer_op_reads_keeps_the_lowering() -> None:
    """DynamicQuantizeLinear becomes the CPU-only dynamic_quantize op only where integer ops
    read it; alone (ONNX's node tests, other consumers) it stays ops every device has."""
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    m = model([node], [tensor("x", TensorProto.FLOAT, (4, 9))],
              [tensor("y", TensorProto.UINT8, None), tensor("s", TensorProto.FLOAT, None),
               tensor("z", TensorProto.UINT8, None)], opset=13)
    assert "dynamic_quantize" not in " ".join(import_onnx(m).func_names)
    x = {"x": np.random.default_rng(17).standard_normal((4, 9)).astype(np.float32)}
    for got, want in zip(run_ours(m, x, "cpu"), run_ort_int8(m, x)):
        np.testing.assert_array_equal(got, want)
