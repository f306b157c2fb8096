"""Replays on the CPU: a module's steps whose calls are oneDNN primitives and OpenMP-team
kernels, recorded at its second run and replayed from one compiled loop after
(runtime/native_runs.py, lib/kernels/replay.py). Each replayed run must give what a module
with replays off gives, and a replay must be recorded again whenever what it reads moves."""
from __future__ import annotations

import gc
import threading
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graph_runtime as gr
from graph_runtime.device import cpu
from graph_runtime.frontend import from_onnx
from graph_runtime.lib.kernels import replay
from graph_runtime.lib.kernels.onednn import binding
from graph_runtime.settings import NUM_THREADS, ONEDNN, ONEDNN_THREADS, REPLAY

pytestmark = pytest.mark.skipif(not binding.available(),
                                reason=f"oneDNN not loaded: {binding.unavailable_reason()}")
SHAPE = (2, 16, 64)


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": rng.standard_normal((64, 96)).astype(np.float32) * 0.1,
            "b1": rng.standard_normal(96).astype(np.float32),
            "g": rng.standard_normal(96).astype(np.float32),
            "beta": rng.standard_normal(96).astype(np.float32),
            "w2": rng.standard_normal((96, 64)).astype(np.float32) * 0.1}


def _model() -> Any:
    """A transformer block's shape of work: a product with a bias, a layer norm, a second
    product, a residual add and a softmax: oneDNN products with their tails, and row kernels,
    one after another."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("LayerNormalization", ["a1", "g", "beta"], ["n1"], axis=-1),
             helper.make_node("MatMul", ["n1", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "x"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))],
        [numpy_helper.from_array(v, k) for k, v in _weights(0).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _module(monkeypatch: pytest.MonkeyPatch, word: str) -> Any:
    monkeypatch.setenv(REPLAY.name, word)
    monkeypatch.setenv(ONEDNN.name, "on")  # oneDNN's products whatever the tuning file says
    graph_json, lib, params = from_onnx(_model())
    m = gr.create(graph_json, lib, cpu(0))
    m.load_params(gr.save_param_dict(params))
    return m


def _inputs(count: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(count)]


def _same(m: Any, want: Any, x: np.ndarray) -> None:
    m.run(x=x)
    want.run(x=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), want.get_output(0).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_replayed_runs_match_plain_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain, recorded, then replayed: every run's output is a replay-off module's for that
    run's input, and the products, the norm and the chains are replayed together."""
    want = _module(monkeypatch, "off")
    assert want.executor.native is None
    assert want.executor.native_reason == "GRAPH_RUNTIME_REPLAY=off"
    m = _module(monkeypatch, "on")
    states = []
    for x in _inputs(5):
        _same(m, want, x)
        states.append(m.executor.native.state)
    assert states == ["recording", "replaying", "replaying", "replaying", "replaying"]
    native = m.executor.native
    assert native.replayed == 4 and len(native.replays) == 1, native.reasons


def test_new_weights_are_read_after_load_params(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights loaded again while replaying: the next runs compute with them (the products'
    packed copies are made again, and the replay is recorded again)."""
    want = _module(monkeypatch, "off")
    m = _module(monkeypatch, "on")
    xs = _inputs(6)
    for x in xs[:3]:
        _same(m, want, x)
    assert m.executor.native.state == "replaying"
    _, _, params = from_onnx(_model())
    other = gr.save_param_dict({name: np.asarray(value) * 0.5 for name, value in params.items()})
    m.load_params(other)
    want.load_params(other)
    for x in xs[3:]:
        _same(m, want, x)
    assert m.executor.native.state == "replaying"


def test_zero_copy_input_is_read_where_it_lies(monkeypatch: pytest.MonkeyPatch) -> None:
    """An input bound zero copy while replaying: the replay reads the new array, not the
    buffer it recorded."""
    want = _module(monkeypatch, "off")
    m = _module(monkeypatch, "on")
    xs = _inputs(5)
    for x in xs[:3]:
        _same(m, want, x)
    bound = xs[3].copy()
    m.set_input_zero_copy("x", bound)
    m.run()
    want.run(x=xs[3])
    np.testing.assert_allclose(m.get_output(0).numpy(), want.get_output(0).numpy(),
                               rtol=1e-5, atol=1e-6)
    _same(m, want, xs[4])


def test_another_thread_runs_the_steps_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A oneDNN stream and an OpenMP team belong to a thread: a run on another thread than
    the recording one records the steps again there, with the same answers on both."""
    want = _module(monkeypatch, "off")
    m = _module(monkeypatch, "on")
    xs = _inputs(4)
    for x in xs[:3]:
        _same(m, want, x)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            _same(m, want, xs[3])
        except BaseException as e:  # noqa: BLE001 (reported on the test's thread)
            errors.append(e)
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert not errors, errors
    assert m.executor.native.state == "replaying"  # recorded again there
    for x in xs:  # and again back on this thread
        _same(m, want, x)
        assert m.executor.native.state == "replaying"


def test_refusals_say_why() -> None:
    """A call its kernel did not vouch for, and one with nothing recorded, are refused with
    the reason."""
    def numpy_only(a: np.ndarray, out: np.ndarray) -> None:
        np.add(a, 1, out=out)
    a = np.ones(4, np.float32)
    out = np.empty_like(a)
    recording, why = replay.record(numpy_only, (a, out))
    assert recording is None and why == "its kernel did not vouch for the calls recorded"
    np.testing.assert_array_equal(out, a + 1)

    def vouching_alone(a: np.ndarray, out: np.ndarray) -> None:
        np.add(a, 2, out=out)
        replay.whole_call(vouching_alone)
    recording, why = replay.record(vouching_alone, (a, out))
    assert recording is None and why == "no foreign call recorded"


def test_a_kernel_timed_as_replayed_computes_as_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuning service times a vouching kernel as its one-call replay (replayed_call):
    that replay writes what the kernel's own call writes."""
    m = _module(monkeypatch, "on")
    for x in _inputs(3):
        m.run(x=x)
    executor = m.executor
    index = next(i for i, step in enumerate(executor._call_steps) if "dense" in step.label)
    fn, args = executor._calls[index]
    args = [np.array(a) for a in args]  # arrays of the test's own
    args[-1][...] = 0
    timed = replay.replayed_call(fn, args)
    assert timed is not None
    want = args[-1].copy()
    gc.collect()  # what the replay reaches (its scratchpad too) is its own, held by it
    litter = [np.full(1 << 16, np.nan, np.float32) for _ in range(64)]
    for _ in range(3):
        args[-1][...] = 0
        timed()
        np.testing.assert_array_equal(args[-1], want)
    del litter


def _two_branch_model() -> Any:
    """A branch of a product, a layer norm, a product and a softmax beside a softmax of
    another input: a decoder's products beside its KV cache."""
    nodes = [helper.make_node("MatMul", ["a", "w1"], ["m1"]),
             helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("LayerNormalization", ["a1", "g", "beta"], ["n1"], axis=-1),
             helper.make_node("MatMul", ["n1", "w2"], ["m2"]),
             helper.make_node("Softmax", ["m2"], ["y"], axis=-1),
             helper.make_node("Softmax", ["r"], ["z"], axis=-1)]
    return _a_and_r(nodes, "two", [4, 64], _weights(0))


def _a_and_r(nodes: list[Any], name: str, a_shape: list[int],
             initializers: dict[str, np.ndarray]) -> Any:
    """A model of nodes reading inputs a (a_shape) and r (5 x 8) and writing y (a's shape)
    and z (r's)."""
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [5, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, a_shape),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [5, 8])],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _on_and_off(monkeypatch: pytest.MonkeyPatch, model: Any) -> tuple[Any, Any]:
    """The model imported and made twice: with replays on, and off (the reference)."""
    modules = {}
    for word in ("off", "on"):
        monkeypatch.setenv(REPLAY.name, word)
        graph_json, lib, params = from_onnx(model)
        modules[word] = gr.create(graph_json, lib, cpu(0))
        modules[word].load_params(gr.save_param_dict(params))
    return modules["on"], modules["off"]


def _run_moved(m: Any, want: Any, a: np.ndarray, r: np.ndarray) -> None:
    """a set and r bound zero copy (a new array each run: its readers' arguments move) in m,
    both given to want; both run, and their two outputs agree."""
    m.set_input("a", a)
    m.set_input_zero_copy("r", r)
    m.run()
    want.run(a=a, r=r)
    for i in range(2):
        np.testing.assert_allclose(m.get_output(i).numpy(), want.get_output(i).numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_moved_arguments_record_only_their_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """One input bound zero copy to a new array before each run: only the step reading it is
    recorded again, the other branch's recorded rows are kept, and each run's answers are a
    replay-off module's."""
    monkeypatch.setenv(ONEDNN.name, "on")
    m, want = _on_and_off(monkeypatch, _two_branch_model())
    rng = np.random.default_rng(3)
    kept = []
    for _ in range(6):
        _run_moved(m, want, rng.standard_normal((4, 64)).astype(np.float32),
                   rng.standard_normal((5, 8)).astype(np.float32))
        native = m.executor.native
        kept.append([None if k is None else k.rows for k in native.known])
    assert native.replayed >= 2, native.reasons
    recorded = [i for i, rows in enumerate(kept[-1]) if rows is not None]
    moved = [i for i in recorded if kept[-2][i] is not kept[-1][i]]
    assert len(moved) == 1 and len(recorded) >= 3, (recorded, moved)  # r's softmax alone


def test_a_moved_step_between_steps_never_replayed_is_not_recorded_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A softmax whose input moves every run (bound zero copy) between two cumulative sums
    (NumPy's, never replayed): its rows could join no stretch, so after the first recording
    it is called plainly (a decoder's rotary chain between its mask steps cost a recording at
    every new length), and every run's answers are a replay-off module's."""
    from graph_runtime.runtime.native_runs import ALONE
    nodes = [helper.make_node("CumSum", ["a", "axis"], ["c"]),
             helper.make_node("Softmax", ["r"], ["z"], axis=-1),
             helper.make_node("CumSum", ["c", "axis"], ["y"])]
    model = _a_and_r(nodes, "alone", [4, 8], {"axis": np.array(1, np.int64)})
    m, want = _on_and_off(monkeypatch, model)
    rng = np.random.default_rng(4)
    labels = [step.label for step in m.executor._call_steps]
    softmax = next(i for i, label in enumerate(labels) if "softmax" in label)
    assert 0 < softmax < len(labels) - 1, labels  # between the two sums
    for run in range(5):
        _run_moved(m, want, rng.standard_normal((4, 8)).astype(np.float32),
                   rng.standard_normal((5, 8)).astype(np.float32))
        if run >= 2:  # plain, recorded, then recorded again where arguments moved
            assert m.executor.native.reasons[softmax] == ALONE


def test_a_decoders_split_and_rotary_steps_are_replayed_with_its_layers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A LLaMA-style prompt (the tiny TorchScript export, imported once with symbolic dims):
    the split of the fused q, k, v product and the two rotary steps of each layer are replayed
    with the products (oneDNN's, any rows in pieces) and the attention around them (their
    team functions on this thread), and every run's logits are a replay-off module's for
    that run's tokens."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "data" / "onnx" / "llama_tiny_ts.onnx"
    # oneDNN's threads in OpenMP mode, whatever a neighbour does meanwhile (on the runtime's
    # workers, the pieces and the rotary's rows go to them, not replayed)
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    m, want = _on_and_off(monkeypatch, str(path))
    rng = np.random.default_rng(5)
    for _ in range(4):
        feeds = {"input_ids": rng.integers(0, 100, (2, 17)).astype(np.int64),
                 "attention_mask": np.ones((2, 17), np.int64)}
        got, expected = m.run_with(**feeds), want.run_with(**feeds)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    executor = m.executor
    reasons = executor.native.reasons
    labels = {i: step.label for i, step in enumerate(executor._call_steps)}
    for kind in ("split", "rotary", "nn_dense"):
        steps = [i for i, label in labels.items() if f"fused_{kind}" in label]
        assert steps and not any(i in reasons for i in steps), \
            {labels[i]: reasons.get(i) for i in steps}


def test_a_kernel_timed_as_replayed_is_recorded_after_its_first_call() -> None:
    """A fresh oneDNN product's first call reorders its steady weight into oneDNN's layout (a
    primitive of its own); its one-call replay for a race is recorded after that call, as a
    module records at its second run, so the replay runs the product alone, not the reorder
    at every sample too."""
    from graph_runtime.lib.kernels.onednn.matmul import OnednnMatmul
    from graph_runtime.lib.library import InputVersion
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    w = rng.standard_normal((96, 256)).astype(np.float32)
    out = np.zeros((4, 96), np.float32)
    product = OnednnMatmul(1, 4, 96, 256, False, True, 1, 1, split=False)
    product.bind_versions({1: InputVersion()})  # a param's: reordered once
    timed = replay.replayed_call(product, [x, w, out])
    assert timed is not None
    assert [len(rows.table) for rows in timed.rows] == [1]  # the product's execute alone
    out[...] = 0
    timed()
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-4)
