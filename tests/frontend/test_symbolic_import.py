"""Import without --shape: symbolic dims kept, shape chains fitted into attrs, one graph for all."""
from __future__ import annotations

import json

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


def test_constant_depending_on_dims_is_refused_with_the_fix() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["ones"],
                              value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("Add", ["x", "ones"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FrontendError, match=r"symbolic dims \(n\): a constant made at import "
                                            r"depends on the dims at params\..*--shape"):
        from_onnx(model)
    assert from_onnx(model, shape={"x": [3]})[2]
