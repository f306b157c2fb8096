"""Segmented runs (runtime/segments.py, segmented_module.py): where a graph is cut, the cache of
specialised segments, sizes carried across segments, the profile's cut rows, `graphrun info`."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
import onnxruntime as ort
from click.testing import CliRunner
from onnx import TensorProto, helper

import graph_runtime as gr
from graph_runtime.cli.app import app
from graph_runtime.errors import GraphError
from graph_runtime.frontend import from_onnx
from graph_runtime.graph.model import Graph
from graph_runtime.runtime.graph_module import GraphModule
from graph_runtime.runtime.segmented_module import SegmentedGraphModule
from graph_runtime.runtime.segments import bind_outputs, find_cuts, split

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _nonzero_sum():
    """x -> NonZero -> ReduceSum: one cut, two segments."""
    return _model([helper.make_node("Sigmoid", ["x"], ["s"]),
                   helper.make_node("Greater", ["s", "half"], ["mask"]),
                   helper.make_node("NonZero", ["mask"], ["nz"]),
                   helper.make_node("ReduceSum", ["nz", "axis1"], ["total"], keepdims=0)],
                  [helper.make_tensor_value_info("x", F32, [8])],
                  [helper.make_tensor_value_info("total", I64, None)],
                  [helper.make_tensor("half", F32, [], [0.5]),
                   helper.make_tensor("axis1", I64, [1], [1])])


def _two_cuts():
    """A second cut whose segment also reads a value of size 2*n from the first: n is carried
    into it by a zero-size input (no input of that segment has n as a dim of its own)."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Reshape", ["nz", "flat"], ["f"]),
             helper.make_node("Concat", ["f", "f"], ["c"], axis=0),
             helper.make_node("Cast", ["c"], ["cf"], to=F32),
             helper.make_node("Greater", ["cf", "two"], ["big"]),
             helper.make_node("NonZero", ["big"], ["nz2"]),
             helper.make_node("ReduceSum", ["nz2"], ["s2"], keepdims=0),
             helper.make_node("Cast", ["s2"], ["s2f"], to=F32),
             helper.make_node("Mul", ["cf", "s2f"], ["out"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [9])],
                  [helper.make_tensor_value_info("out", F32, None)],
                  [helper.make_tensor("flat", I64, [1], [-1]),
                   helper.make_tensor("two", F32, [], [2.0])])


def _create(m, device="cpu"):
    graph_json, lib, params = from_onnx(m)
    module = gr.create(graph_json, lib, gr.device(device))
    module.load_params(gr.save_param_dict(params))
    return module, Graph.from_json(graph_json), lib


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def test_graph_is_cut_at_the_data_dependent_node() -> None:
    module, graph, lib = _create(_nonzero_sum())
    assert isinstance(module, SegmentedGraphModule)
    cuts = find_cuts(graph, lib)
    assert [(c.op, c.level, c.binds(graph)) for c in cuts] == [("nonzero", 0, ["NonZero_nz"])]
    segments = split(graph, lib, cuts)
    assert len(segments) == 2 and all(s is not None for s in segments)
    assert not segments[0].graph.is_symbolic and segments[1].graph.is_symbolic
    assert module.describe_cuts() == [
        f"cut 0: {cuts[0].label} (nonzero) after segment 0, binds NonZero_nz; outputs "
        "(1, NonZero_nz)"]


def test_each_size_is_specialised_once_and_cached() -> None:
    m = _nonzero_sum()
    module, _, _ = _create(m)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(8).astype(np.float32) for _ in range(6)]
    sizes = set()
    for x in xs + xs:
        module.run(x=x)
        np.testing.assert_array_equal(module.get_output(0).numpy(), _ort(m, {"x": x})[0])
        sizes.add(module.env["NonZero_nz"])
    assert module.modules[1].specializations == len(sizes)
    np.testing.assert_array_equal(module.get_input("x").numpy(), xs[-1])


def test_size_carried_into_a_later_segment() -> None:
    m = _two_cuts()
    module, graph, lib = _create(m)
    segments = split(graph, lib, find_cuts(graph, lib))
    assert len(segments) == 3 and segments[2].carriers == ("NonZero_nz",)
    rng = np.random.default_rng(1)
    for _ in range(4):
        x = (rng.uniform(size=9) > 0.5).astype(np.float32)
        module.run(x=x)
        np.testing.assert_array_equal(module.get_output(0).numpy(), _ort(m, {"x": x})[0])


def test_profile_shows_the_cut_and_new_specialisations() -> None:
    module, _, _ = _create(_nonzero_sum())
    x = np.linspace(-2, 2, 8).astype(np.float32)
    module.set_input("x", x)
    rows = module.profile()
    labels = [r.label for r in rows]
    assert any("[cut: NonZero_nz=4]" in label for label in labels), labels
    assert any(label.startswith("segment 1: specialise") for label in labels), labels
    again = [r.label for r in module.profile()]  # the same size: nothing specialised
    assert not any("specialise" in label for label in again), again


def test_a_cut_result_against_the_declared_shape_is_refused() -> None:
    _, graph, lib = _create(_nonzero_sum())
    cut = find_cuts(graph, lib)[0]
    with pytest.raises(GraphError, match=r"\(nonzero\) output eid \d+ dim 0: 3, the graph "
                                         r"declares 1"):
        bind_outputs(cut, graph, [np.zeros((3, 4), np.int64)], {})


def test_a_static_graph_is_no_segmented_module() -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", F32, [4])],
               [helper.make_tensor_value_info("y", F32, None)])
    module, _, _ = _create(m)
    assert type(module) is GraphModule


def test_graphrun_info_run_and_profile_say_where_the_graph_is_cut(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_nonzero_sum(), str(path))
    out = tmp_path / "imported"
    runner = CliRunner()
    assert runner.invoke(app, ["import", str(path), "-o", str(out)]).exit_code == 0
    result = runner.invoke(app, ["info", str(out)])
    assert result.exit_code == 0, result.output
    assert "cuts      1 (the graph runs in segments" in result.output
    assert "(nonzero) after segment 0, binds NonZero_nz" in result.output
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.linspace(-2, 2, 8).astype(np.float32))
    ran = runner.invoke(app, ["run", str(out), "--inputs", str(inputs)])
    assert ran.exit_code == 0, ran.output
    assert "placement  kernels: 3 on cpu:0" in ran.output and "min 22, max 22" in ran.output
    profiled = runner.invoke(app, ["profile", str(out), "--inputs", str(inputs)])
    assert profiled.exit_code == 0, profiled.output
    assert "[cut: NonZero_nz=4]" in profiled.output


@pytest.mark.opencl
def test_planned_across_devices(opencl_available: None) -> None:
    """plan_graph on the symbolic graph (the sum on OpenCL, the rest on the CPU): the copies it
    inserts run inside the segments, the cut on the host."""
    from graph_runtime.planner.plan import plan_graph
    m = _nonzero_sum()
    graph_json, lib, params = from_onnx(m)
    planned = plan_graph(graph_json, {"default_device": "cpu",
                                      "node_devices": {"tvmgen_default_fused_sum": "opencl"}}, lib)
    module = gr.create(planned.graph, lib, [gr.cpu(), gr.opencl()])
    module.load_params(gr.save_param_dict(params))
    for x in (np.linspace(-2, 2, 8), np.linspace(-3, 1, 8)):
        x = x.astype(np.float32)
        module.run(x=x)
        np.testing.assert_array_equal(module.get_output(0).numpy(), _ort(m, {"x": x})[0])
    view = module.executor
    devices = {planned.graph.nodes[n].name: str(d) for n, d in enumerate(view.node_device)}
    assert "opencl" in devices["tvmgen_default_fused_sum"]
    assert "cpu" in devices["tvmgen_default_fused_nonzero"]
