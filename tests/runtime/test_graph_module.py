"""GraphModule API: inputs, outputs, zero copy, params, benchmark (TVM's graph_executor names)."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest
from support import make_graph, null, tvm_op

import graph_runtime as gr
from graph_runtime.errors import DeviceError, GraphError, GraphRuntimeError, ParamsError


def _axpy():
    """out = a * x + b, with a and b as params; shapes (2, 3)."""
    nodes = [null("x"), null("a"), null("b"), tvm_op("ax", "multiply", [1, 0]),
             tvm_op("axb", "add", [3, 2])]
    return gr.create(make_graph(nodes, [4], shapes=(2, 3)), None, gr.cpu())


X = np.arange(6, dtype="float32").reshape(2, 3)


def test_outputs_answer_to_declared_names_and_to_their_node_names() -> None:
    """metadata.output_names (an imported model's own names) and, as TVM's GetOutputIndex,
    the head node's name; an unknown name lists the outputs."""
    nodes = [null("x"), null("a"), null("b"), tvm_op("ax", "multiply", [1, 0]),
             tvm_op("axb", "add", [3, 2])]
    doc = make_graph(nodes, [4, 3], shapes=(2, 3)).to_dict()
    doc["metadata"] = {"output_names": ["logits", "scaled"]}
    m = gr.create(doc, None, gr.cpu())
    m.set_input(x=X, a=np.full((2, 3), 2, "float32"), b=np.ones((2, 3), "float32"))
    m.run()
    assert [m.get_output_index(n) for n in ("logits", "scaled", "axb", "ax")] == [0, 1, 0, 1]
    np.testing.assert_array_equal(m.get_output("logits").numpy(), 2 * X + 1)
    np.testing.assert_array_equal(m.get_output("ax").numpy(), 2 * X)
    out = np.empty((2, 3), "float32")
    m.get_output("scaled", out)
    np.testing.assert_array_equal(out, 2 * X)
    with pytest.raises(GraphError, match="graph has no output 'prob'; outputs are: logits, "
                                         "scaled"):
        m.get_output("prob")
    with pytest.raises(GraphError, match="get_output_index needs an output name"):
        m.get_output_index(0)  # type: ignore[arg-type]


def test_input_lookup_and_info() -> None:
    m = _axpy()
    assert m.get_num_inputs() == 3 and m.get_num_outputs() == 1
    assert m.get_input_index("b") == 2
    shapes, dtypes = m.get_input_info()
    assert shapes == {"x": (2, 3), "a": (2, 3), "b": (2, 3)}
    assert dtypes == {"x": "float32", "a": "float32", "b": "float32"}
    assert m.get_output_info() == ([(2, 3)], ["float32"])


def test_set_input_by_name_index_dict_and_kwargs() -> None:
    m = _axpy()
    m.set_input("x", X)
    m.set_input(1, np.full((2, 3), 2, "float32"))
    m.set_input({"b": np.ones((2, 3), "float32")})
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), 2 * X + 1)
    m.run(b=np.zeros((2, 3), "float32"))
    np.testing.assert_array_equal(m.get_output(0).numpy(), 2 * X)
    np.testing.assert_array_equal(m.get_input("x").numpy(), X)


def test_set_input_accepts_ndarray_and_dlpack() -> None:
    m = _axpy()
    m.set_input("x", gr.nd.array(X))
    m.set_input("a", np.from_dlpack(np.ones((2, 3), "float32")))
    m.set_input("b", [[0, 0, 0], [0, 0, 1]])  # a nested list takes the input's dtype
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), X + np.array([[0, 0, 0], [0, 0, 1]]))


def test_set_input_errors_name_the_inputs() -> None:
    m = _axpy()
    with pytest.raises(GraphError, match=r"graph has no input 'y'; inputs are: x, a, b"):
        m.set_input("y", X)
    with pytest.raises(GraphError, match=r"input index 3 is out of range: the graph has 3 inputs"):
        m.set_input(3, X)
    with pytest.raises(GraphError, match=r"input 'x' \(eid 0\): expected \(2, 3\) float32, "
                                         r"got \(3, 2\) float32"):
        m.set_input("x", X.T.copy())
    with pytest.raises(GraphError, match=r"expected \(2, 3\) float32, got \(2, 3\) float64"):
        m.set_input("x", X.astype("float64"))


def test_get_output_is_not_overwritten_and_out_copies() -> None:
    m = _axpy()
    m.run(x=X, a=np.ones((2, 3), "float32"), b=np.zeros((2, 3), "float32"))
    first = m.get_output(0)
    m.run(x=X + 10)
    np.testing.assert_array_equal(first.numpy(), X)
    out = np.empty((2, 3), "float32")
    m.get_output(0, out=out)
    np.testing.assert_array_equal(out, X + 10)
    nd_out = gr.nd.empty((2, 3), "float32")
    m.get_output(0, out=nd_out)
    np.testing.assert_array_equal(nd_out.numpy(), X + 10)
    with pytest.raises(GraphError, match="out= is \\(3,\\) float32"):
        m.get_output(0, out=np.empty(3, "float32"))
    with pytest.raises(GraphError, match="output index 1 is out of range"):
        m.get_output(1)


def _reusing_graph():
    # x (sid 0) -> a = relu(x) (sid 1) -> b = negative(a) (sid 2) -> c = exp(b) (sid 1: the
    # output shares a's storage id). Reusing an input's id is refused (runtime/storage_check.py).
    nodes = [null("x"), tvm_op("a", "relu", [0]), tvm_op("b", "negative", [1]),
             tvm_op("c", "exp", [2])]
    return make_graph(nodes, [3], shapes=(5,), storage_ids=[0, 1, 2, 1])


def test_zero_copy_input_sharing_a_storage_id_is_not_overwritten() -> None:
    # apache/tvm#17152: binding an input whose storage id a later node reuses let that node
    # write into the user's array. Here only the input's own references are rebound.
    m = gr.create(_reusing_graph(), None, gr.cpu())
    x = np.linspace(-2, 2, 5).astype("float32")
    user = x.copy()
    m.set_input_zero_copy("x", user)
    m.run()
    np.testing.assert_array_equal(user, x)
    np.testing.assert_allclose(m.get_output(0).numpy(), np.exp(-np.maximum(x, 0)), rtol=1e-6)
    user[:] = 1.0  # zero copy: the next run sees the new values without set_input
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), np.exp(-np.ones(5)), rtol=1e-6)


def test_zero_copy_output_sharing_a_storage_id() -> None:
    # apache/tvm#9448: binding an output rebound every entry of its storage id.
    m = gr.create(_reusing_graph(), None, gr.cpu())
    out = np.zeros(5, "float32")
    m.set_output_zero_copy(0, out)
    x = np.linspace(-2, 2, 5).astype("float32")
    m.run(x=x)
    expected = np.exp(-np.maximum(x, 0))
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    np.testing.assert_allclose(m.get_output(0).numpy(), expected, rtol=1e-6)


def test_zero_copy_refuses_wrong_device_shape_dtype(opencl_available: None) -> None:
    m = gr.create(_reusing_graph(), None, gr.cpu())
    with pytest.raises(DeviceError, match=r"lives on cpu:0 but the array given is on opencl"):
        m.set_input_zero_copy("x", gr.nd.empty((5,), "float32", gr.opencl()))
    with pytest.raises(GraphError, match=r"expected \(5,\) float32, got \(4,\) float32"):
        m.set_input_zero_copy("x", np.zeros(4, "float32"))
    with pytest.raises(GraphError, match=r"expected \(5,\) float32, got \(5,\) int32"):
        m.set_output_zero_copy(0, np.zeros(5, "int32"))
    with pytest.raises(GraphError, match="C-contiguous"):
        m.set_input_zero_copy("x", np.zeros(10, "float32")[::2])


def test_load_params_bytes_file_and_dict(tmp_path) -> None:
    m = _axpy()
    params = {"a": np.full((2, 3), 3, "float32"), "b": np.ones((2, 3), "float32")}
    m.load_params(gr.save_param_dict(params))
    m.run(x=X)
    np.testing.assert_array_equal(m.get_output(0).numpy(), 3 * X + 1)
    path = tmp_path / "p.params"
    path.write_bytes(gr.save_param_dict({"b": np.zeros((2, 3), "float32")}))
    m.load_params(str(path))
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), 3 * X)
    m.load_params({"a": np.ones((2, 3), "float32")})
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), X)


def test_load_params_file_reads_weights_into_place(tmp_path, monkeypatch) -> None:
    """A params file's arrays are read straight into the module's storage (one preadv); each
    counts as a write, so a kernel's data derived from a weight is redone."""
    from graph_runtime.lib import Module
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.params import read_params_into
    from graph_runtime.settings import DENSE_TRANSPOSE
    monkeypatch.setenv(DENSE_TRANSPOSE.name, "on")  # keeps a transposed copy of the weight
    lib = Module("denselib")
    lib.register("fc", Chain("fc", [Step("dense"), Step("add")]))
    nodes = [null("data"), null("weight"), null("bias"), tvm_op("fc", "fc", [0, 1, 2])]
    m = gr.create(make_graph(nodes, [3], shapes=[[8, 30], [26, 30], [26], [8, 26]]), lib,
                  gr.cpu())
    calls = []
    monkeypatch.setattr("graph_runtime.params.read_params_into",
                        lambda *a: calls.append(a[2]) or read_params_into(*a))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 30)).astype("float32")
    for version in range(2):
        params = {"weight": rng.standard_normal((26, 30)).astype("float32"),
                  "bias": rng.standard_normal(26).astype("float32")}
        path = tmp_path / f"p{version}.params"
        path.write_bytes(gr.save_param_dict(params))
        m.load_params(path)
        m.run(data=x)
        want = x.astype(np.float64) @ params["weight"].T.astype(np.float64) + params["bias"]
        np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=1e-5, atol=1e-5)
    assert [sorted(c) for c in calls] == [["bias", "weight"]] * 2


def test_load_params_file_with_an_empty_array(tmp_path) -> None:
    """An empty param has no bytes to read into place; the others still are."""
    nodes = [null("x"), null("e"), tvm_op("y", "add", [0, 0]), tvm_op("z", "concatenate", [1, 1])]
    m = gr.create(make_graph(nodes, [2, 3], shapes=[[2, 3], [0, 3], [2, 3], [0, 3]]), None,
                  gr.cpu())
    path = tmp_path / "p.params"
    path.write_bytes(gr.save_param_dict({"e": np.zeros((0, 3), "float32"), "x": X}))
    m.load_params(path)
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), 2 * X)


def test_load_params_mismatch_and_unknown(caplog: pytest.LogCaptureFixture) -> None:
    m = _axpy()
    with pytest.raises(ParamsError, match=r"param 'a' is \(3, 2\) float32 but the graph's input "
                                          r"'a' \(eid 1\) is \(2, 3\) float32"):
        m.load_params(gr.save_param_dict({"a": np.ones((3, 2), "float32")}))
    with caplog.at_level(logging.WARNING, logger="graph_runtime"):
        m.load_params(gr.save_param_dict({"zz": np.ones(1, "float32")}))
    assert "'zz'" in caplog.text
    strict = gr.create(_axpy().graph, None, gr.cpu(), strict=True)
    with pytest.raises(ParamsError, match=r"1 param is not an input of the graph: 'zz'"):
        strict.load_params(gr.save_param_dict({"zz": np.ones(1, "float32")}))


def test_share_params_uses_the_other_modules_arrays() -> None:
    owner = _axpy()
    blob = gr.save_param_dict({"a": np.full((2, 3), 2, "float32")})
    owner.load_params(blob)
    user = _axpy()
    user.share_params(owner, blob)
    user.run(x=X, b=np.zeros((2, 3), "float32"))
    np.testing.assert_array_equal(user.get_output(0).numpy(), 2 * X)
    owner.load_params({"a": np.full((2, 3), 5, "float32")})
    user.run()
    np.testing.assert_array_equal(user.get_output(0).numpy(), 5 * X)


def test_benchmark_reports_statistics() -> None:
    m = _axpy()
    result = m.benchmark(repeat=3, number=2, x=X)
    assert len(result.results) == 3
    assert result.min <= result.median <= result.max and result.mean > 0
    assert "median (ms)" in str(result)
    e2e = m.benchmark(repeat=2, number=1, end_to_end=True, x=X)
    assert len(e2e.results) == 2


def test_create_accepts_json_text_path_dict(tmp_path) -> None:
    g = _axpy().graph
    path = tmp_path / "g.json"
    path.write_text(g.to_json())
    for source in (g.to_json(), str(path), g.to_dict()):
        m = gr.create(source, None, "cpu")
        m.run(x=X, a=np.ones((2, 3), "float32"), b=np.ones((2, 3), "float32"))
        np.testing.assert_array_equal(m.get_output(0).numpy(), X + 1)


# ---- threads (issue 13: one module used by two threads gave wrong answers) -----------------------

def _blocking_module(started: "threading.Event", release: "threading.Event"):
    """out = x + 1 through a user kernel that waits for release, so a run is held mid-way."""
    lib = gr.Module("slow")

    @lib.register("slow_add1", device="cpu")
    def slow_add1(x: np.ndarray, out: np.ndarray) -> None:
        started.set()
        release.wait(10)
        np.add(x, 1, out=out)

    return gr.create(make_graph([null("x"), tvm_op("y", "slow_add1", [0])], [1]), lib, gr.cpu())


def test_a_second_thread_is_refused_while_a_run_is_under_way() -> None:
    started, release = threading.Event(), threading.Event()
    m = _blocking_module(started, release)
    errors: list[BaseException] = []
    worker = threading.Thread(target=lambda: _catch(errors, m.run, x=np.zeros(4, "float32")),
                              name="first")
    worker.start()
    assert started.wait(10)
    try:
        for call in (lambda: m.run(), lambda: m.set_input("x", np.ones(4, "float32")),
                     lambda: m.get_output(0)):
            with pytest.raises(GraphRuntimeError, match=r"called from thread 'MainThread' while "
                                                        r"another thread is in run"):
                call()
    finally:
        release.set()
        worker.join(10)
    assert errors == []
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.ones(4, "float32"))


def _catch(errors: list, fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - reported to the test thread
        errors.append(e)


def test_run_with_is_atomic_across_many_threads() -> None:
    m = _axpy()
    m.load_params({"a": np.full((2, 3), 3, "float32"), "b": np.ones((2, 3), "float32")})
    wrong: list[str] = []
    errors: list[BaseException] = []

    def work(k: int) -> None:
        for r in range(40):
            x = np.full((2, 3), k * 100 + r, "float32")
            (out,) = m.run_with(x=x)
            if not np.array_equal(out, 3 * x + 1):
                wrong.append(f"thread {k} run {r}")

    threads = [threading.Thread(target=_catch, args=(errors, work, k)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and wrong == []


def test_clones_share_the_weights_and_run_in_parallel() -> None:
    m = _axpy()
    m.load_params({"a": np.full((2, 3), 2, "float32"), "b": np.ones((2, 3), "float32")})
    clones = [m.clone() for _ in range(4)]
    for c in clones:
        assert c.get_input("a").native is m.get_input("a").native  # one copy of the weights
        assert c.get_input("x").native is not m.get_input("x").native
    wrong: list[int] = []
    errors: list[BaseException] = []

    def work(k: int) -> None:
        for r in range(40):
            x = np.full((2, 3), k + r, "float32")
            clones[k].run(x=x)
            if not np.array_equal(clones[k].get_output(0).numpy(), 2 * x + 1):
                wrong.append(k)

    threads = [threading.Thread(target=_catch, args=(errors, work, k)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and wrong == []


# ---- inputs never set -------------------------------------------------------------------------

def test_run_refuses_inputs_never_set_naming_them() -> None:
    m = _axpy()
    m.set_input("x", X)
    with pytest.raises(GraphError, match=r"2 inputs never set: a, b; .*allow_uninitialized=True"):
        m.run()
    m.load_params({"a": np.ones((2, 3), "float32")})
    with pytest.raises(GraphError, match=r"1 input never set: b;"):
        m.run()
    m.set_input_zero_copy("b", np.zeros((2, 3), "float32"))
    m.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), X)


def test_allow_uninitialized_and_benchmark_run_without_inputs() -> None:
    nodes = [null("x"), tvm_op("y", "relu", [0])]
    m = gr.create(make_graph(nodes, [1]), None, gr.cpu(), allow_uninitialized=True)
    m.run()
    strict = gr.create(make_graph(nodes, [1]), None, gr.cpu())
    assert strict.benchmark(repeat=1, number=1).mean >= 0
    assert len(strict.profile()) == 1


# ---- Python API type errors become typed errors -------------------------------------------------

def test_api_type_errors_are_typed() -> None:
    m = _axpy()
    for bad in (None, 1.5, True):
        with pytest.raises(GraphError, match="get_output needs an output index"):
            m.get_output(bad)
    with pytest.raises(GraphError, match="graph has no output '0'; outputs are: "):
        m.get_output("0")
    with pytest.raises(GraphError, match=r"input 'x' \(eid 0\): cannot make a float32 array of "
                                         r"a str"):
        m.set_input("x", "abc")
    with pytest.raises(GraphError, match=r"set_input\('x'\) needs a value; got None"):
        m.set_input("x")


def test_create_with_bad_arguments_is_typed() -> None:
    from graph_runtime.errors import LibraryError
    g = make_graph([null("x"), tvm_op("y", "relu", [0])], [1])
    with pytest.raises(LibraryError, match="load_module needs the path .* got float"):
        gr.create(g, 3.5)  # type: ignore[arg-type]
    text = "[" * 200_000
    with pytest.raises(GraphError) as info:
        gr.create(text, None, gr.cpu())
    assert "not valid JSON" in str(info.value) and len(str(info.value)) < 300
    with pytest.raises(GraphError, match="is a directory"):
        gr.create(Path(__file__).parent, None, gr.cpu())


def test_a_new_onednn_thread_mode_makes_the_executor_again(monkeypatch) -> None:
    """When oneDNN's thread mode changes (policy.recheck: a neighbour came or went), a static
    module makes its executor (and kernels) again; params, inputs bound zero copy, a view of an
    input handed out and an output bound zero copy keep their arrays."""
    from graph_runtime.runtime import module_base
    g = make_graph([null("x"), null("w"), null("y"), tvm_op("relu0", "relu", [0]),
                    tvm_op("dense0", "dense", [3, 1]), tvm_op("add0", "add", [4, 2])],
                   [5], shapes=[[2, 4], [3, 4], [2, 3], [2, 4], [2, 3], [2, 3]])
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    y = rng.standard_normal((2, 3)).astype(np.float32)
    m = gr.create(g)
    m.load_params({"w": w})
    m.set_input_zero_copy("y", y)
    out = np.empty((2, 3), np.float32)
    m.set_output_zero_copy(0, out)
    view = m.get_input("x")
    m.set_input(x=x)
    m.run()
    before = m.executor
    monkeypatch.setattr(module_base, "threads_generation", lambda: 1)
    x[0, 0] = 5.0
    view.native[0, 0] = 5.0  # written through the view handed out before the change
    y[1, 2] += 1.0
    m.run()
    assert m.executor is not before
    np.testing.assert_allclose(out, np.maximum(x, 0) @ w.T + y, rtol=1e-5, atol=1e-6)
    m.run()  # no change since: the same executor
    assert m.executor is not before and m._threads_made_in == 1
