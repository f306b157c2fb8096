"""CUDA graphs: a module on one GPU captured at its second run and replayed after
(runtime/cuda_graph.py). The GPU tests skip without one; the choice of when to capture is
tested everywhere."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graph_runtime as gr
from graph_runtime.device import cpu, cuda
from graph_runtime.frontend import from_onnx
from graph_runtime.runtime.cuda_graph import CudaGraphRuns, cuda_graph_runs
from graph_runtime.settings import CUDA_GRAPHS


def _model() -> Any:
    """Conv+Relu, a dense product with a bias, Softmax: a convolution, cuBLAS and elementwise
    kernels, with the temporaries CuPy allocates inside them."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    fc = rng.standard_normal((4 * 6 * 6, 10)).astype(np.float32) * 0.1
    bias = rng.standard_normal(10).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["m"]),
             helper.make_node("Add", ["m", "bias"], ["a"]),
             helper.make_node("Softmax", ["a"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(fc, "fc"),
         numpy_helper.from_array(bias, "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _module(device: Any) -> Any:
    graph_json, lib, params = from_onnx(_model())
    m = gr.create(graph_json, lib, device)
    m.load_params(gr.save_param_dict(params))
    return m


def _inputs(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal((2, 3, 6, 6)).astype(np.float32) for _ in range(count)]


@pytest.mark.cuda
def test_replayed_runs_give_each_input_its_own_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain first run, captured second, replays after: each run's output is the one the host
    computes for that run's input, and the module says it replays."""
    m = _module(cuda(0))
    want_module = _module(cpu(0))
    xs = _inputs(4) + _inputs(1)  # the last input seen before: a replay with old data again
    states = []
    for x in xs:
        m.run(x=x)
        states.append(m.executor.cuda_graph.state)
        want_module.run(x=x)
        np.testing.assert_allclose(m.get_output(0).numpy(), want_module.get_output(0).numpy(),
                                   rtol=1e-5, atol=1e-6)
    assert states == ["capture", "replaying", "replaying", "replaying", "replaying"]
    assert m.executor.cuda_graph_reason == ""


@pytest.mark.cuda
def test_setting_off_runs_each_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CUDA_GRAPHS.name, "off")
    m = _module(cuda(0))
    assert m.executor.cuda_graph is None
    assert m.executor.cuda_graph_reason == "GRAPH_RUNTIME_CUDA_GRAPHS=off"
    x = _inputs(1)[0]
    m.run(x=x)
    first = m.get_output(0).numpy()
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(), first)


@pytest.mark.cuda
def test_a_rebound_input_is_captured_again() -> None:
    """set_input_zero_copy gives the input another buffer: the graph holding the old address
    is dropped, and the next runs read the new one."""
    import cupy
    m = _module(cuda(0))
    want_module = _module(cpu(0))
    xs = _inputs(3)
    for x in xs[:2]:
        m.run(x=x)
    assert m.executor.cuda_graph.state == "replaying"
    with cupy.cuda.Device(0):
        bound = gr.nd.array(xs[2], cuda(0))
    m.set_input_zero_copy("x", bound)
    assert m.executor.cuda_graph.state == "warming"
    for _ in range(3):
        m.run()
    assert m.executor.cuda_graph.state == "replaying"
    want_module.run(x=xs[2])
    np.testing.assert_allclose(m.get_output(0).numpy(), want_module.get_output(0).numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_a_run_that_reads_back_to_the_host_runs_plainly() -> None:
    """A read to the host cannot be captured: the capture fails, the run is done plainly (the
    captured calls were only recorded), and every later run is plain, with the reason kept."""
    import cupy
    from graph_runtime.backends import get_backend
    backend = get_backend("cuda")
    with backend.scope(0):
        value = cupy.arange(4, dtype=cupy.float32)
    seen: list[float] = []

    def run_plain() -> None:
        with backend.scope(0):
            value[...] += 1
            seen.append(float(value.sum().get()))  # a device -> host copy

    runs = CudaGraphRuns(0, run_plain, "test")
    for _ in range(4):
        runs.run()
    assert runs.state == "plain" and runs.reason
    assert float(value.sum().get()) == 6 + 4 * 4  # four increments, none lost or doubled


def test_only_a_module_on_one_gpu_is_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs on the host, or over several devices, or deciding on the host from an input each
    run, are never captured; the setting turns capture off."""
    def noop() -> None:
        return None
    assert cuda_graph_runs([cpu(0)], False, noop, "g") == (None, "not on one GPU alone")
    assert cuda_graph_runs([cpu(0), cuda(0)], False, noop, "g")[0] is None
    runs, reason = cuda_graph_runs([cuda(0)], True, noop, "g")
    assert runs is None and "derive" in reason
    runs, reason = cuda_graph_runs([cuda(0)], False, noop, "g")
    assert isinstance(runs, CudaGraphRuns) and reason == ""
    monkeypatch.setenv(CUDA_GRAPHS.name, "off")
    assert cuda_graph_runs([cuda(0)], False, noop, "g") == (None, "GRAPH_RUNTIME_CUDA_GRAPHS=off")


def test_a_host_module_has_no_graph() -> None:
    m = _module(cpu(0))
    assert m.executor.cuda_graph is None
    assert m.executor.cuda_graph_reason == "not on one GPU alone"
