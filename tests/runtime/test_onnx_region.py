"""Shape-deciding inputs at run time: a model deferred to one onnx_region node, specialised per value."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import graph_runtime as gr  # noqa: E402
from graph_runtime.errors import FrontendError, GraphError  # noqa: E402
from graph_runtime.frontend import from_onnx  # noqa: E402


def reshape_topk_model() -> onnx.ModelProto:
    """y = Reshape(x, shape) + 1; values, indices = TopK(y flattened, k): shape and k are inputs."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"]),
             helper.make_node("TopK", ["y", "k"], ["v", "i"], axis=-1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                     helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
                     helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_inputs_are_read_while_specialising_and_key_the_cache() -> None:
    graph_json, lib, params = from_onnx(reshape_topk_model())
    module = gr.create(graph_json, lib)
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    for shape, k in [((3, 4), 2), ((4, 3), 2), ((3, 4), 3), ((3, 4), 2)]:
        module.run(x=x, shape=np.array(shape, np.int64), k=np.array([k], np.int64))
        y = np.maximum(x.reshape(shape), 0)
        want = -np.sort(-y, axis=-1)[:, :k]
        np.testing.assert_allclose(module.get_output(0).numpy(), want, rtol=1e-6)
        assert module.get_output(1).numpy().shape == (shape[0], k)
    assert module.specializations == 3  # the fourth is the first again: cached


def test_region_outputs_answer_to_the_models_names() -> None:
    graph_json, lib, params = from_onnx(reshape_topk_model())
    module = gr.create(graph_json, lib)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    module.run(x=x, shape=np.array((3, 4), np.int64), k=np.array([2], np.int64))
    assert [module.get_output_index(n) for n in ("v", "i")] == [0, 1]
    np.testing.assert_array_equal(module.get_output("i").numpy(), module.get_output(1).numpy())


def test_freeze_keeps_the_refusal() -> None:
    with pytest.raises(FrontendError, match=r"Reshape: input 1 \(shape\) must be a constant"):
        from_onnx(reshape_topk_model(), freeze=True)


def test_a_bad_value_names_the_node_and_the_values() -> None:
    module = gr.create(*from_onnx(reshape_topk_model())[:2])
    with pytest.raises(GraphError, match=r"onnx_region.*input 1 = \[5, 5\]"):
        module.run(x=np.zeros((2, 6), np.float32), shape=np.array([5, 5], np.int64),
                   k=np.array([1], np.int64))


@pytest.mark.opencl
def test_runs_on_opencl(opencl_available: None) -> None:
    module = gr.create(*from_onnx(reshape_topk_model())[:2], gr.device("opencl"))
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    module.run(x=x, shape=np.array([6, 2], np.int64), k=np.array([1], np.int64))
    np.testing.assert_array_equal(module.get_output(0).numpy(), x.reshape(6, 2)[:, 1:])
