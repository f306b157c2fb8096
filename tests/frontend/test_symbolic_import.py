"""Import without --shape: symbolic dims kept, shape chains fitted into attrs, one graph for all."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import graph_runtime as gr  # noqa: E402
from graph_runtime.errors import FrontendError  # noqa: E402
from graph_runtime.frontend import from_onnx  # noqa: E402
from graph_runtime.frontend.symbolic_import import _expression  # noqa: E402

RNG = np.random.default_rng(0)


def reshape_model() -> onnx.ModelProto:
    """x (batch, seq, 8) -> MatMul -> Relu -> Reshape to (batch, -1) through Shape/Gather/Concat."""
    w = RNG.standard_normal((8, 16)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Concat", ["b", "m1"], ["ns"], axis=0),
             helper.make_node("Reshape", ["r", "ns"], ["flat"]),
             helper.make_node("Softmax", ["flat"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([0], np.int64), "i0"),
         numpy_helper.from_array(np.array([-1], np.int64), "m1")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_expressions_fit_the_probes() -> None:
    names, base, other = ["b", "s"], [37, 41], [53, 59]
    assert _expression(37 * 41 * 4, [53 * 41 * 4, 37 * 59 * 4], names, base, other) == "4*b*s"
    assert _expression(42, [42, 60], names, base, other) == "s+1"
    assert _expression(41 * 41, [41 * 41, 59 * 59], names, base, other) == "s*s"
    assert _expression(5, [6, 7], names, base, other) is None


def test_one_import_runs_every_shape_like_onnxruntime() -> None:
    model = reshape_model()
    graph_json, lib, params = from_onnx(model)
    shapes = json.loads(graph_json)["attrs"]["shape"][1]
    assert shapes[0] == ["batch", "seq", 8] and shapes[-1] == ["batch", "16*seq"]
    module = gr.create(graph_json, lib)
    module.load_params(params)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, seq in [(1, 3), (2, 5), (4, 1)]:
        x = RNG.standard_normal((batch, seq, 8)).astype(np.float32)
        module.run(x=x)
        np.testing.assert_allclose(module.get_output(0).numpy(),
                                   session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert module.specializations == 3


def test_symbolic_module_outputs_answer_to_the_models_names() -> None:
    """The fitted graph keeps the ONNX output name; every specialisation answers to it."""
    graph_json, lib, params = from_onnx(reshape_model())
    assert json.loads(graph_json)["metadata"] == {"output_names": ["y"]}
    module = gr.create(graph_json, lib)
    module.load_params(params)
    assert module.get_output_index("y") == 0
    for batch in (1, 3):
        x = RNG.standard_normal((batch, 2, 8)).astype(np.float32)
        module.run(x=x)
        np.testing.assert_array_equal(module.get_output("y").numpy(),
                                      module.get_output(0).numpy())


def test_constant_depending_on_dims_is_refused_with_the_fix() -> None:
    # Trilu's converter builds its (n, n) mask at import: no ONNX node to compute instead.
    nodes = [helper.make_node("Trilu", ["x"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FrontendError, match=r"symbolic dims \(n\): a constant made at import "
                                            r"depends on the dims at params\..*--shape"):
        from_onnx(model)
    assert from_onnx(model, shape={"x": [3, 3]})[2]


def positions_model() -> onnx.ModelProto:
    """y = x + Range(0, seq) + seq + ConstantOfShape([seq]): folded values that follow the dims,
    read as data (as BERT's position ids and GPT-2's causal mask are)."""
    one = numpy_helper.from_array(np.array([1.0], np.float32))
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i1"], ["seq"], axis=0),
             helper.make_node("Range", ["zero", "seq", "step"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["seq"], ["seqf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["seq", "i0"], ["seq1"]),
             helper.make_node("ConstantOfShape", ["seq1"], ["ones"], value=one),
             helper.make_node("Add", ["x", "rf"], ["a"]),
             helper.make_node("Add", ["a", "seqf"], ["b"]),
             helper.make_node("Add", ["b", "ones"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(1, np.int64), "i1"),
         numpy_helper.from_array(np.array([0], np.int64), "i0"),
         numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array(1, np.int64), "step")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_values_that_follow_the_dims_are_computed_not_folded() -> None:
    model = positions_model()
    graph_json, lib, params = from_onnx(model)
    assert all(a.shape in ((), (1,)) for a in params.values()), {
        k: a.shape for k, a in params.items()}
    module = gr.create(graph_json, lib)
    module.load_params(params)
    for batch, seq in [(1, 3), (2, 7), (3, 1)]:
        x = RNG.standard_normal((batch, seq)).astype(np.float32)
        module.run(x=x)
        want = x + np.arange(seq, dtype=np.float32) + seq + 1
        np.testing.assert_allclose(module.get_output(0).numpy(), want, rtol=1e-6)


DYNAMIC = Path(__file__).resolve().parents[1] / "data" / "onnx"


@pytest.mark.parametrize("name", ["bert_dyn", "gpt2_dyn"])
def test_transformers_import_once_and_match_onnxruntime_at_every_shape(name: str) -> None:
    path = DYNAMIC / f"{name}.onnx"
    graph_json, lib, params = from_onnx(path)
    module = gr.create(graph_json, lib)
    module.load_params(params)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    takes_mask = len(session.get_inputs()) > 1
    for batch, seq in [(1, 8), (1, 57), (4, 32), (2, 128)]:
        feeds = {"input_ids": RNG.integers(0, 100, (batch, seq)).astype(np.int64)}
        if takes_mask:
            mask = np.ones((batch, seq), np.int64)
            mask[0, seq - 3:] = 0  # padding, so the mask changes the result
            feeds["attention_mask"] = mask
        want = session.run(None, feeds)
        module.run(**feeds)
        for i, expected in enumerate(want):
            np.testing.assert_allclose(module.get_output(i).numpy(), expected, rtol=1e-4,
                                       atol=1e-5, err_msg=f"{name} {batch}x{seq} output {i}")
    assert module.specializations == 4
    # A cached shape: no specialisation, and the profile has no `specialise` row.
    module.run(**feeds)
    assert module.specializations == 4
    assert all(t.func_name != "__specialise" for t in module.profile())
    module.set_input(**{k: v[:, :5] for k, v in feeds.items()})
    rows = module.profile()
    assert rows[0].func_name == "__specialise" and rows[0].label.startswith("specialise (")
    assert module.specializations == 5
