"""`graphrun import`: the folder it writes runs, plans and checks itself; refusals write nothing."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from support import require_backend

from graph_runtime.cli.app import app

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(3)


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def _init(name: str, array: Any) -> Any:
    return numpy_helper.from_array(np.asarray(array), name)


def _save(m: Any, path: Path) -> Path:
    m.ir_version = 8
    onnx.save_model(m, str(path))
    return path


def cnn_with_embedding(tmp_path: Path, batch: Any = 1) -> Path:
    """A conv net plus an int64 lookup into a 7-row table, with a symbolic batch dim option."""
    w = (RNG.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("Add", ["f", "e"], ["y"], name="add"),
             helper.make_node("ArgMax", ["y"], ["k"], axis=1, name="argmax")]
    graph = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 6, 6]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("k", TensorProto.INT64, None)],
        [_init("w", w), _init("b", np.zeros(4, np.float32)),
         _init("table", RNG.standard_normal((7, 4)).astype(np.float32))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return _save(m, tmp_path / "cnn.onnx")


def test_import_reference_then_run_on_cpu_and_opencl(tmp_path: Path) -> None:
    out = tmp_path / "cnn"
    result = invoke("import", cnn_with_embedding(tmp_path), "-o", out, "--reference")
    assert result.exit_code == 0, result.output
    assert "tvmgen_default_fused_nn_conv2d_add_nn_relu" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["expected.npz", "graph.json", "inputs.npz",
                                                     "lib.json", "params"]
    ids = np.load(out / "inputs.npz")["ids"]
    assert ids.dtype == np.int64 and 0 <= int(ids.min()) and int(ids.max()) < 7
    graph = json.loads((out / "graph.json").read_text())
    assert graph["attrs"]["dltype"][1][graph["heads"][1][0]] == "int64"
    assert invoke("run", out, "-d", "cpu").exit_code == 0
    require_backend("opencl")
    ran = invoke("run", out, "-d", "cpu", "-d", "opencl")
    assert ran.exit_code == 0, ran.output
    planned = tmp_path / "planned.json"
    plan = invoke("plan", out, "--place", "*conv2d*=opencl", "-o", planned)
    assert plan.exit_code == 0, plan.output
    both = invoke("run", planned, "--lib", out / "lib.json", "--params", out / "params",
                  "--inputs", out / "inputs.npz", "--expected", out / "expected.npz",
                  "-d", "cpu", "-d", "opencl")
    assert both.exit_code == 0, both.output
    assert "OK" in both.output


def encoder_head(tmp_path: Path, batch: Any = 2) -> Path:
    """Outputs named as Hugging Face exports them: last_hidden_state, then logits."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "g", "b"], ["last_hidden_state"]),
             helper.make_node("ReduceMean", ["last_hidden_state"], ["pooled"], axes=[1],
                              keepdims=0),
             helper.make_node("Gemm", ["pooled", "c"], ["logits"])]
    graph = helper.make_graph(
        nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 5, 4])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        [_init("w", RNG.standard_normal((4, 4)).astype(np.float32)),
         _init("g", np.ones(4, np.float32)), _init("b", np.zeros(4, np.float32)),
         _init("c", RNG.standard_normal((4, 3)).astype(np.float32))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return _save(m, tmp_path / "encoder.onnx")


def test_outputs_keep_the_models_names_in_every_command(tmp_path: Path) -> None:
    """graph.json declares them (metadata.output_names); import --reference, run -o, run and
    compare --expected, info all use them; TVM's fused-function names still answer."""
    import onnxruntime as ort
    model = encoder_head(tmp_path)
    out = tmp_path / "enc"
    assert invoke("import", model, "-o", out, "--reference").exit_code == 0
    graph = json.loads((out / "graph.json").read_text())
    assert graph["metadata"] == {"output_names": ["last_hidden_state", "logits"]}
    assert list(graph)[-1] == "metadata"  # after TVM's keys: its reader stops there
    assert np.load(out / "expected.npz").files == ["last_hidden_state", "logits"]
    saved = tmp_path / "out.npz"
    ran = invoke("run", out, "-o", saved)
    assert ran.exit_code == 0, ran.output
    assert "logits" in ran.output and "OK" in ran.output
    assert np.load(saved).files == ["last_hidden_state", "logits"]
    # Arrays keyed by the ONNX names, as ONNX Runtime's users have them.
    x = np.load(out / "inputs.npz")["x"]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    want = dict(zip(["last_hidden_state", "logits"], session.run(None, {"x": x})))
    np.savez(tmp_path / "ort.npz", **want)
    compared = invoke("compare", out, "--expected", tmp_path / "ort.npz", "--json")
    assert compared.exit_code == 0, compared.output
    assert [o["name"] for o in json.loads(compared.output)["outputs"]] == [
        "last_hidden_state", "logits"]
    nodes = [graph["nodes"][nid]["name"] for nid, *_ in graph["heads"]]
    assert nodes == ["tvmgen_default_fused_nn_layer_norm", "tvmgen_default_fused_nn_dense"]
    np.savez(tmp_path / "tvm.npz", **{nodes[1]: want["logits"]},
             last_hidden_state=want["last_hidden_state"])
    assert invoke("compare", out, "--expected", tmp_path / "tvm.npz").exit_code == 0
    np.savez(tmp_path / "wrong.npz", last_hidden_state=want["last_hidden_state"])
    missing = invoke("compare", out, "--expected", tmp_path / "wrong.npz")
    assert missing.exit_code == 2
    assert "no array for output 1 'logits' (key 'output_1' or 'logits' or " in missing.output
    info = invoke("info", out, "--json")
    assert info.exit_code == 0, info.output
    assert [(o["name"], o["node"]) for o in json.loads(info.output)["outputs"]] == [
        ("last_hidden_state", nodes[0]), ("logits", nodes[1])]


def test_symbolic_batch_imports_once_and_runs_any_batch(tmp_path: Path) -> None:
    model = cnn_with_embedding(tmp_path, batch="N")
    out = tmp_path / "sym"
    result = invoke("import", model, "-o", out)
    assert result.exit_code == 0, result.output
    graph = json.loads((out / "graph.json").read_text())
    assert graph["attrs"]["shape"][1][0] == ["N", 3, 6, 6]
    info = invoke("info", out)
    assert info.exit_code == 0, info.output
    assert "symbolic  x: (N, 3, 6, 6) float32" in info.output
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([3], np.int64))
    for batch in (1, 3):
        x = tmp_path / f"x{batch}.npy"
        np.save(x, RNG.standard_normal((batch, 3, 6, 6)).astype(np.float32))
        ran = invoke("run", out, "-d", "cpu", "--input", f"x={x}", "--input", f"ids={ids}")
        assert ran.exit_code == 0, ran.output
        assert f"({batch}, 4)" in ran.output
    assert invoke("import", model, "-o", tmp_path / "r", "--reference").exit_code == 2


def test_symbolic_batch_needs_shape_when_frozen(tmp_path: Path) -> None:
    model = cnn_with_embedding(tmp_path, batch="N")
    out = tmp_path / "out"
    refused = invoke("import", model, "-o", out, "--freeze")
    assert refused.exit_code == 2
    assert "--shape x=N,3,6,6" in refused.output and "Traceback" not in refused.output
    assert not out.exists()
    ok = invoke("import", model, "-o", out, "--shape", "x=2,3,6,6")
    assert ok.exit_code == 0, ok.output
    bad = invoke("import", model, "-o", tmp_path / "o2", "--shape", "x=2;3")
    assert bad.exit_code == 2 and "--shape" in bad.output


def test_unsupported_model_writes_nothing(tmp_path: Path) -> None:
    nodes = [helper.make_node("MaxUnpool", ["x", "i"], ["h"], kernel_shape=[1], name="unpool"),
             helper.make_node("Det", ["h"], ["y"], name="det")]
    graph = helper.make_graph(nodes, "bad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3]),
                               helper.make_tensor_value_info("i", TensorProto.INT64, [3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                  tmp_path / "bad.onnx")
    out = tmp_path / "bad"
    result = invoke("import", model, "-o", out)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("graphrun: error: cannot import bad.onnx")
    assert "MaxUnpool" in lines[0] and "'unpool'" in lines[0] and "Det" in lines[0]
    assert "opset 17" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]  # no temporary left


def test_existing_folder_needs_force(tmp_path: Path) -> None:
    model = cnn_with_embedding(tmp_path)
    out = tmp_path / "cnn"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    refused = invoke("import", model, "-o", out)
    assert refused.exit_code == 2 and "--force" in refused.output
    assert (out / "keep.txt").is_file()
    replaced = invoke("import", model, "-o", out, "--force")
    assert replaced.exit_code == 0, replaced.output
    assert not (out / "keep.txt").exists() and (out / "graph.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn", "cnn.onnx"]


def test_missing_model_file(tmp_path: Path) -> None:
    result = invoke("import", tmp_path / "nope.onnx", "-o", tmp_path / "o")
    assert result.exit_code == 2 and "does not exist" in result.output


def test_reference_without_onnxruntime_is_one_line(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model = cnn_with_embedding(tmp_path)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    out = tmp_path / "cnn"
    result = invoke("import", model, "-o", out, "--reference")
    assert result.exit_code == 2
    assert "--reference needs onnxruntime: pip install onnxruntime" in result.output
    assert not out.exists()
