"""fuse_lookup.py: a QDQ GELU (one int8 tensor to one int8 tensor through Erf, a quantized Add of
a constant and Muls) becomes one qlookup whose table is the region's own float32 steps: within
one output step of ONNX Runtime and of the same import without the table; regions of cheap
arithmetic alone, regions reading a second tensor, and models without the QDQ fusion are left."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_builders import init, model, run_ort, run_ort_int8, run_ours, tensor

from graph_runtime.frontend.importer import import_onnx
from graph_runtime.settings import IMPORT_FUSE

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

ELEM = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8}


def _qdq_gelu(dtype, second_input: bool = False, erf: bool = True) -> object:
    """x -> QDQ MatMul -> QDQ GELU (as quantize_static writes BERT's) -> DQ -> y; with
    second_input the last Mul reads another tensor, without erf the region is arithmetic."""
    rng = np.random.default_rng(5)
    zero = 128 if dtype == np.uint8 else 3
    inits = [init("w", rng.integers(-127, 128, (16, 24)).astype(np.int8)),
             init("ws", np.float32(0.01)), init("wz", np.int8(0)),
             init("c_sqrt2", np.float32(1.4142135)), init("c_one", np.float32(1.0)),
             init("c_half", np.float32(0.5))]
    names = {}
    for i, s in enumerate([0.05, 0.04, 0.01, 0.012, 0.03, 0.02, 0.02]):
        names[i] = (f"s{i}", f"z{i}")
        inits += [init(f"s{i}", np.float32(s)), init(f"z{i}", np.array(zero, dtype))]

    def q(x: str, i: int, out: str) -> list:
        return [helper.make_node("QuantizeLinear", [x, *names[i]], [out + "_q"]),
                helper.make_node("DequantizeLinear", [out + "_q", *names[i]], [out])]
    nodes = q("x", 0, "xd")
    nodes += [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
              helper.make_node("MatMul", ["xd", "wd"], ["h"])]
    nodes += q("h", 1, "hd")
    nodes += [helper.make_node("Div", ["hd", "c_sqrt2"], ["u"]),
              helper.make_node("Erf" if erf else "Neg", ["u"], ["e"])]
    nodes += q("e", 2, "ed")
    nodes += [helper.make_node("Add", ["ed", "c_one"], ["a"])]
    nodes += q("a", 3, "ad")
    nodes += [helper.make_node("Mul", ["hd", "ad"] if not second_input else ["xm", "ad"],
                               ["m"])]
    nodes += q("m", 4, "md")
    nodes += [helper.make_node("Mul", ["md", "c_half"], ["g"])]
    nodes += q("g", 5, "y")
    inputs = [tensor("x", TensorProto.FLOAT, (3, 16))]
    if second_input:
        inputs.append(tensor("xm", TensorProto.FLOAT, (3, 24)))
    return model(nodes, inputs, [tensor("y", TensorProto.FLOAT, None)], inits, opset=13)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qdq_gelu_is_one_lookup_within_one_step(dtype, monkeypatch) -> None:
    m = _qdq_gelu(dtype)
    imported = import_onnx(m)
    assert imported.patterns["qlookup"] == 1, imported.patterns
    assert not any("erf" in f for f in imported.func_names), imported.func_names
    rng = np.random.default_rng(6)
    feeds = {"x": (rng.standard_normal((3, 16)) * 2).astype(np.float32)}
    (got,) = run_ours(m, feeds, "cpu")
    (want,) = run_ort_int8(m, feeds)  # exact where ONNX Runtime's int8 products saturate
    step = np.float32(0.02)
    assert np.abs(got - want).max() <= step * 1.01
    monkeypatch.setenv(IMPORT_FUSE.name, "off")  # the same import without the table
    assert "qlookup" not in import_onnx(m).patterns
    (plain,) = run_ours(m, feeds, "cpu")
    assert np.abs(got - plain).max() <= step * 1.01
    assert np.mean(got == plain) > 0.98  # erf's last bits may move a half-step boundary


@pytest.mark.parametrize("second_input,erf", [(True, True), (False, False)])
def test_regions_left_as_they_are(second_input, erf) -> None:
    """A region reading a second tensor is no function of one byte: only its part before that
    Mul (Erf, Add 1) is a table; arithmetic alone stays in its compiled chain
    (fuse_lookup.CHEAP)."""
    m = _qdq_gelu(np.int8, second_input=second_input, erf=erf)
    imported = import_onnx(m)
    assert imported.patterns["qlookup"] == (1 if erf else 0), imported.patterns
    assert any("multiply" in f for f in imported.func_names), imported.func_names
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((3, 16)).astype(np.float32)}
    if second_input:
        feeds["xm"] = rng.standard_normal((3, 24)).astype(np.float32)
    (got,), (want,) = run_ours(m, feeds, "cpu"), run_ort(m, feeds)
    assert np.abs(got - want).max() <= 0.02 * 1.01


def test_no_lookup_without_the_qdq_fusion() -> None:
    """Cast int8 -> float -> Erf -> ... -> int8 with no QDQ pattern (as ONNX's node tests
    write them) keeps ops every device has."""
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xd"]),
             helper.make_node("Erf", ["xd"], ["e"]),
             helper.make_node("QuantizeLinear", ["e", "s", "z"], ["y"])]
    m = model(nodes, [tensor("x", TensorProto.INT8, (4, 5))],
              [tensor("y", TensorProto.INT8, None)],
              [init("s", np.float32(0.01)), init("z", np.int8(1))], opset=13)
    assert "qlookup" not in import_onnx(m).patterns
    x = {"x": np.random.default_rng(8).integers(-128, 128, (4, 5)).astype(np.int8)}
    (got,), (want,) = run_ours(m, x, "cpu"), run_ort(m, x)
    assert np.abs(got.astype(int) - want).max() <= 1


def test_a_lookup_after_a_projection_folds_into_its_byte_map(monkeypatch) -> None:
    """QDQ MatMul + bias (a qdense_add) then the GELU lookup: one qdense_add_packed whose byte
    map is the two composed; the same bytes as the two nodes without oneDNN (where both
    requantize by the reference steps)."""
    from graph_runtime.settings import ONEDNN
    monkeypatch.setenv(ONEDNN.name, "off")
    rng = np.random.default_rng(9)
    m = _qdq_gelu(np.int8)
    # the MatMul's bias: Add(DQ(h) , DQ(Q(bias))) -> Q, as quantize_static writes BERT's
    bias = rng.standard_normal(24).astype(np.float32)
    graph = m.graph
    add_nodes = [helper.make_node("QuantizeLinear", ["bias", "s1", "z1"], ["bias_q"]),
                 helper.make_node("DequantizeLinear", ["bias_q", "s1", "z1"], ["bias_d"]),
                 helper.make_node("Add", ["hb_in", "bias_d"], ["hb"]),
                 helper.make_node("QuantizeLinear", ["hb", "s1", "z1"], ["hb_q"]),
                 helper.make_node("DequantizeLinear", ["hb_q", "s1", "z1"], ["hb_d"])]
    nodes = list(graph.node)
    for n in nodes:  # the MatMul's Q/DQ now feed the Add; the GELU reads the sum
        for i, name in enumerate(n.input):
            if name == "hd" and n.op_type != "DequantizeLinear":
                n.input[i] = "hb_d"
    at = next(i for i, n in enumerate(nodes) if n.output[0] == "hd") + 1
    nodes[at:at] = add_nodes
    for n in nodes:
        if n.op_type == "Add" and n.output[0] == "hb":
            n.input[0] = "hd"
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.append(init("bias", bias))
    imported = import_onnx(m)
    assert imported.patterns["qlookup_folded"] == 1, imported.patterns
    assert not any("qlookup" in f for f in imported.func_names), imported.func_names
    feeds = {"x": (rng.standard_normal((3, 16)) * 2).astype(np.float32)}
    (got,) = run_ours(m, feeds, "cpu")
    # node by node: its fused integer MatMul saturates on AVX2 hosts without VNNI (two outputs
    # 32 steps off on an AMD EPYC without AVX-512)
    (want,) = run_ort(m, feeds, node_by_node=True)
    assert np.abs(got - want).max() <= 0.02 * 1.01
    monkeypatch.setenv(IMPORT_FUSE.name, "off")
    (plain,) = run_ours(m, feeds, "cpu")
    assert np.abs(got - plain).max() <= 0.02 * 1.01
