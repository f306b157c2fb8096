"""`graphrun plan` on a graph with symbolic dims: constraints and --auto at sample shapes.

The planned graph stays symbolic; it runs split between cpu and opencl at several shapes and
matches float64 NumPy (a hand-built graph) and ONNX Runtime (an imported model).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from support import require_backend

import graph_runtime as gr
from graph_runtime.cli.app import app
from graph_runtime.params import save_params_file

RNG = np.random.default_rng(5)


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def _op(name: str, func: str, inputs: list[int]) -> dict:
    return {"op": "tvm_op", "name": name, "inputs": [[i, 0, 0] for i in inputs],
            "attrs": {"func_name": func, "num_inputs": str(len(inputs)), "num_outputs": "1",
                      "flatten_data": "0"}}


@pytest.fixture
def symbolic_dense(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """x (batch, 16) -> relu -> dense w (8, 16) -> tanh: a folder with graph.json and params."""
    g = gr.Graph.build(
        [{"op": "null", "name": "x"}, {"op": "null", "name": "w"}, _op("relu0", "relu", [0]),
         _op("dense0", "dense", [2, 1]), _op("tanh0", "tanh", [3])],
        [4], shapes=[["batch", 16], [8, 16], ["batch", 16], ["batch", 8], ["batch", 8]],
        dtypes="float32")
    folder = tmp_path / "sym"
    folder.mkdir()
    (folder / "graph.json").write_text(g.to_json())
    w = RNG.standard_normal((8, 16)).astype(np.float32)
    save_params_file(folder / "params", {"w": w})
    return folder, w


def _check_runs_split(planned: Path, w: np.ndarray) -> None:
    m = gr.create(str(planned), None, [gr.cpu(), gr.opencl()])
    m.load_params({"w": w})
    for batch in (1, 7):
        x = RNG.standard_normal((batch, 16)).astype(np.float32)
        m.run(x=x)
        want = np.tanh(np.maximum(x.astype(np.float64), 0) @ w.T.astype(np.float64))
        np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=1e-5, atol=1e-5)
        kinds = {dev.kind for *_, dev in m.placement()}
        assert kinds == {"cpu", "opencl"}


@pytest.mark.opencl
def test_plan_with_constraints_stays_symbolic_and_reports_samples(
        symbolic_dense: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    require_backend("opencl")
    folder, w = symbolic_dense
    planned = tmp_path / "planned.json"
    result = invoke("plan", folder, "--place", "dense0=opencl", "-o", planned,
                    "--shape", "x=2,16", "--shape", "x=64,16")
    assert result.exit_code == 0, result.output
    assert "symbolic dims: their entries count 0 B above" in result.output
    # dense0's output (batch, 8) float32 is copied back to the cpu for tanh0
    assert "at x=(2, 16): pool cpu:0" in result.output
    assert "copies 64 B per run" in result.output and "copies 2.0 KiB per run" in result.output
    assert json.loads(planned.read_text())["attrs"]["shape"][1][0] == ["batch", 16]
    _check_runs_split(planned, w)
    doc = json.loads(invoke("plan", folder, "--place", "dense0=opencl", "--json",
                            "--shape", "x=3,16").output)
    assert doc["samples"][0]["copy_bytes"] == 3 * 8 * 4


@pytest.mark.opencl
def test_plan_auto_measures_at_samples_and_runs_at_two_shapes(
        symbolic_dense: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    require_backend("opencl")
    folder, w = symbolic_dense
    planned = tmp_path / "auto.json"
    cache = tmp_path / "costs.json"
    args = ["plan", folder, "--auto", "-d", "cpu", "-d", "opencl", "--place", "relu0=opencl",
            "--output", "0=cpu", "--shape", "x=4,16", "--shape", "x=256,16", "--budget", "1",
            "--profile-cache", cache, "-o", planned]
    result = invoke(*args, "--verify")
    assert result.exit_code == 0, result.output
    assert "== at x=(4, 16)" in result.output and "== at x=(256, 16)" in result.output
    assert "one plan for 2 sample shapes" in result.output
    assert "auto at x=(256, 16)" in result.output  # --verify ran each sample's plan
    _check_runs_split(planned, w)
    doc = json.loads(invoke(*args, "--json").output)
    assert doc["symbolic"] and [s["shapes"] for s in doc["samples"]] == ["x=(4, 16)",
                                                                         "x=(256, 16)"]
    assert doc["samples"][1]["kernels_measured"] == 0  # the cache from the first plan
    assert abs(doc["predicted_seconds"]
               - sum(s["predicted_seconds"] for s in doc["samples"])) < 1e-12
    by_name = {n["name"]: n["device"] for n in doc["nodes"]}
    assert by_name["relu0"] == "opencl:0"


def test_plan_auto_on_a_symbolic_graph_needs_samples(symbolic_dense: tuple[Path, np.ndarray]
                                                     ) -> None:
    folder, _ = symbolic_dense
    result = invoke("plan", folder, "--auto", "-d", "cpu")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "symbolic dims (x: (batch, 16))" in result.output and "--shape" in result.output
    wrong = invoke("plan", folder, "--auto", "-d", "cpu", "--shape", "x=2,15")
    assert wrong.exit_code == 2
    assert "sample x=(2, 15): input 'x' (eid 0) dim 1: expected 16, got 15" in wrong.output
    nobody = invoke("plan", folder, "--auto", "-d", "cpu", "--shape", "y=2,16")
    assert "the graph has no input 'y'; inputs are: x, w" in nobody.output
    uneven = invoke("plan", folder, "--shape", "x=1,16", "--shape", "x=2,16", "--shape",
                    "w=8,16", "--shape", "w=8,16", "--shape", "w=8,16")
    assert uneven.exit_code == 2 and "x x2, w x3" in uneven.output
    bad = invoke("plan", folder, "--shape", "x=1;16")
    assert bad.exit_code == 2 and "--shape" in bad.output


def test_shape_on_a_static_graph_is_a_usage_error(addw: Path) -> None:
    result = invoke("plan", addw, "--shape", "x=4")
    assert result.exit_code == 2 and "has none" in result.output


@pytest.mark.opencl
def test_imported_model_auto_placed_once_matches_onnxruntime_at_two_batches(
        tmp_path: Path) -> None:
    require_backend("opencl")
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort
    from test_import_command import cnn_with_embedding
    model = cnn_with_embedding(tmp_path, batch="N")
    out = tmp_path / "sym"
    assert invoke("import", model, "-o", out).exit_code == 0
    planned = tmp_path / "planned.json"
    result = invoke("plan", out, "--auto", "-d", "cpu", "-d", "opencl", "--place",
                    "*conv2d*=opencl", "--shape", "x=1,3,6,6", "--shape", "x=5,3,6,6",
                    "--budget", "1", "--no-calibrate", "-o", planned)
    assert result.exit_code == 0, result.output
    m = gr.create(str(planned), str(out / "lib.json"), [gr.cpu(), gr.opencl()])
    m.load_params(str(out / "params"))
    session = ort.InferenceSession(str(model))
    for batch in (2, 5):
        feeds = {"x": RNG.standard_normal((batch, 3, 6, 6)).astype(np.float32),
                 "ids": np.array([4], np.int64)}
        m.run(**feeds)
        want = session.run(None, feeds)
        np.testing.assert_allclose(m.get_output(0).numpy(), want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(m.get_output(1).numpy(), want[1])
        assert {dev.kind for *_, dev in m.placement()} == {"cpu", "opencl"}


def test_auto_place_of_a_symbolic_graph_points_to_samples(
        symbolic_dense: tuple[Path, np.ndarray]) -> None:
    from graph_runtime.errors import PlanError
    from graph_runtime.lib import standard_module
    from graph_runtime.planner import auto_place
    folder, _ = symbolic_dense
    with pytest.raises(PlanError, match=r"symbolic dims \(x: \(batch, 16\)\).*"
                                        "auto_place_symbolic"):
        auto_place(folder / "graph.json", standard_module(), [gr.cpu()], budget_s=0.1)


def test_plan_auto_refuses_sizes_only_the_data_decides(tmp_path: Path) -> None:
    """A graph cut at NonZero: --auto cannot specialise past the cut from sample shapes; the
    plan with constraints still works (the segments run where it puts them)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"]),
         helper.make_node("ReduceSum", ["nz"], ["total"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("total", TensorProto.INT64, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    model = tmp_path / "nz.onnx"
    onnx.save(proto, str(model))
    out = tmp_path / "nz"
    assert invoke("import", model, "-o", out).exit_code == 0
    refused = invoke("plan", out, "--auto", "-d", "cpu", "--shape", "x=8")
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert "sizes decided by data (node 1 'tvmgen_default_fused_nonzero')" in refused.output
    assert "place it with constraints (--default, --place) and no --shape" in refused.output
    plain = invoke("plan", out, "--default", "cpu")
    assert plain.exit_code == 0, plain.output


def test_plan_auto_refuses_shapes_decided_by_input_values(tmp_path: Path) -> None:
    """Reshape's target as a graph input: the graph is one onnx_region specialised per value,
    which sample shapes cannot give."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
              helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = tmp_path / "r.onnx"
    onnx.save(proto, str(model))
    out = tmp_path / "r"
    assert invoke("import", model, "-o", out).exit_code == 0
    for extra in ((), ("--shape", "x=2,6")):
        refused = invoke("plan", out, "--auto", "-d", "cpu", *extra)
        assert refused.exit_code == 2 and "Traceback" not in refused.output
        assert "the values of inputs 's' decide shapes" in refused.output
    assert invoke("plan", out, "--default", "cpu").exit_code == 0
