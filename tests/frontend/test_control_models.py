"""PyTorch's control flow exported to ONNX (If, Loop) against ONNX Runtime, on CPU and OpenCL.

tests/data/onnx/loop_if_ts.onnx (a torch.jit.script'ed `for` over an input trip count, then an
`if` on the data; TorchScript exporter) and cond_dynamo.onnx (torch.cond; dynamo exporter),
rebuilt by make_control_models.py. Each runs for inputs that take each branch and, for the
Loop, several trip counts (0 included), one module created once for all of them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the ONNX frontend tests need onnx (pip install .[test])")
ort = pytest.importorskip("onnxruntime",
                          reason="ONNX Runtime is the reference here (pip install .[test])")

import graph_runtime as gr
from graph_runtime.frontend import import_onnx

DATA = Path(__file__).resolve().parents[1] / "data" / "onnx"
# float32 GEMMs and tanh summed in another order, iterated up to 7 times.
RELATIVE = 1e-5


def _cases(name: str) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    cases = []
    for trial, trips in enumerate([0, 1, 3, 7, 2, 5]):
        x = (rng.standard_normal((2, 8)) + (1.0 if trial % 2 else -1.0)).astype(np.float32)
        feeds = {"x": x}
        if name == "loop_if_ts":
            feeds["n"] = np.array(trips, np.int64)
        cases.append(feeds)
    return cases


def _branch(name: str, feeds: dict[str, np.ndarray]) -> bool:
    """The branch the model takes, computed in float64 NumPy from its weights."""
    import onnx
    from onnx import numpy_helper
    x = feeds["x"].astype(np.float64)
    if name == "cond_dynamo":
        return bool(x.sum() > 0)
    weights = {t.name: numpy_helper.to_array(t).astype(np.float64)
               for t in onnx.load(str(DATA / f"{name}.onnx")).graph.initializer}
    h = x
    for _ in range(int(feeds["n"])):
        h = np.tanh(h @ weights["lin.weight"].T + weights["lin.bias"]) + x
    return bool(h.sum() > 0)


@pytest.mark.parametrize("name", ["loop_if_ts", "cond_dynamo"])
def test_control_flow_export_matches_onnxruntime(name: str, backend_name: str) -> None:
    path = DATA / f"{name}.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    result = import_onnx(str(path))
    assert "onnx_if" in " ".join(result.func_names)
    assert ("onnx_loop" in " ".join(result.func_names)) == (name == "loop_if_ts")
    module = gr.create(result.graph_json, result.module(), gr.device(backend_name))
    if result.params:
        module.load_params(gr.save_param_dict(result.params))
    branches = set()
    for feeds in _cases(name):
        want = session.run(None, feeds)[0]
        module.run(**feeds)
        got = module.get_output(0).numpy()
        assert got.shape == want.shape and got.dtype == want.dtype
        error = np.abs(got - want).max() / np.abs(want).max()
        assert error <= RELATIVE, f"{name} {feeds}: relative error {error:.2e}"
        branches.add(_branch(name, feeds))
    assert {True, False} <= branches, f"both branches must be taken: {branches}"
    # The sub-graphs were created on the node's device: their ops run there.
    subs = _sub_modules(module)
    assert subs and all(sub.ctxs[0] == gr.device(backend_name) for sub in subs)


def _sub_modules(module: gr.GraphModule) -> list:
    """The body modules the control-flow kernels of module hold (PreparedKernel.sub_modules)."""
    return [m for step in module.executor.steps for m in step.kernel.sub_modules()]


def test_control_flow_under_a_symbolic_batch_matches_onnxruntime() -> None:
    """The same export with its batch dim named: imported once, specialised per batch size
    (the sub-graphs' model text holds no sizes, so every probe import agrees)."""
    import onnx
    model = onnx.load(str(DATA / "loop_if_ts.onnx"))
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "batch"
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    result = import_onnx(model)
    module = gr.create(result.graph_json, result.module(), gr.cpu())
    if result.params:
        module.load_params(gr.save_param_dict(result.params))
    rng = np.random.default_rng(2)
    for batch, trips in [(1, 3), (5, 0), (5, 4), (1, 2)]:
        x = rng.standard_normal((batch, 8)).astype(np.float32)
        want = session.run(None, {"x": x, "n": np.array(trips, np.int64)})[0]
        module.run(x=x, n=np.array(trips, np.int64))
        got = module.get_output(0).numpy()
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= RELATIVE * np.abs(want).max()
    assert module.specializations == 2
    # the bodies the shapes' kernels hold are counted in what the shapes keep
    bodies = {id(body): body for shape in module._cache.values() for body in _sub_modules(shape)}
    held = sum(body.held_bytes()[gr.cpu()] for body in bodies.values())
    assert bodies and module._shape_cost().kept_bytes >= held
    assert module.held_bytes()[gr.cpu()] >= held + module.scratch.held_bytes()[gr.cpu()]


def test_lib_json_written_and_loaded_runs_the_sub_graphs(tmp_path: Path) -> None:
    """The sub-graphs travel inside lib.json (their model bytes as base64): the files
    `graphrun import` writes run as loaded back."""
    import json
    session = ort.InferenceSession(str(DATA / "loop_if_ts.onnx"),
                                   providers=["CPUExecutionProvider"])
    result = import_onnx(str(DATA / "loop_if_ts.onnx"))
    (tmp_path / "lib.json").write_text(json.dumps(result.lib_doc), encoding="utf-8")
    module = gr.create(result.graph_json, gr.load_module(tmp_path / "lib.json"), gr.cpu())
    if result.params:
        module.load_params(gr.save_param_dict(result.params))
    feeds = _cases("loop_if_ts")[3]
    module.run(**feeds)
    want = session.run(None, feeds)[0]
    assert np.abs(module.get_output(0).numpy() - want).max() <= RELATIVE * np.abs(want).max()


def test_clones_run_their_own_sub_graphs_on_threads_at_once() -> None:
    """Each module (a clone too) creates its own body modules: two threads running clones
    at the same moment get each its own answer."""
    import threading
    session = ort.InferenceSession(str(DATA / "loop_if_ts.onnx"),
                                   providers=["CPUExecutionProvider"])
    result = import_onnx(str(DATA / "loop_if_ts.onnx"))
    first = gr.create(result.graph_json, result.module(), gr.cpu())
    if result.params:
        first.load_params(gr.save_param_dict(result.params))
    modules = [first, first.clone()]
    assert not set(map(id, _sub_modules(modules[0]))) & set(map(id, _sub_modules(modules[1])))
    cases = _cases("loop_if_ts")
    errors: list[str] = []

    def work(module: gr.GraphModule, feeds: dict[str, np.ndarray]) -> None:
        want = session.run(None, feeds)[0]
        for _ in range(20):
            got = module.run_with(**feeds)[0]
            if np.abs(got - want).max() > RELATIVE * np.abs(want).max():
                errors.append(f"n={feeds['n']}: wrong result")
                return

    threads = [threading.Thread(target=work, args=(m, cases[k + 2]))
               for k, m in enumerate(modules)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
