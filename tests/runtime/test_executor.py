"""Executor behaviour: TVM's heterogeneous graphs, device fallback, copies, storage sharing."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import copy_op, make_graph, null, require_backend, tvm_op

import graph_runtime as gr
from graph_runtime.errors import DeviceError, GraphError, LibraryError
from graph_runtime.lib import Module, standard_module
from graph_runtime.lib.prepared import PreparedKernel

CPU, OPENCL, CUDA = 1, 2 + 2, 2
DEVICE_CODES = {"cpu": 1, "cuda": 2, "opencl": 4}


def simplex(host: int, dev: int):
    """TVM's simplex graph: (A + B) on the device, one __copy back, minus C on the host."""
    nodes = [null("A"), null("B"), tvm_op("elemwise_add", "add", [0, 1]),
             copy_op("__copy_add_to_sub", 2), null("C"),
             tvm_op("elemwise_sub", "subtract", [3, 4])]
    return make_graph(nodes, [5], device_index=[dev, dev, dev, host, host, host])


def duplex(host: int, dev: int):
    """TVM's duplex graph: copies back and forth; ((A + B) - C) + D with the adds on the device."""
    nodes = [null("A"), null("B"), tvm_op("elemwise_add0", "add", [0, 1]),
             copy_op("__copy_add_to_sub", 2), null("C"), tvm_op("elemwise_sub", "subtract", [3, 4]),
             copy_op("__copy_sub_to_add", 5), null("D"), tvm_op("elemwise_add1", "add", [6, 7])]
    return make_graph(nodes, [8],
                      device_index=[dev, dev, dev, host, host, host, dev, dev, dev])


def _inputs(names: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(4).astype("float32") for n in names}


PAIRS = [
    pytest.param("cpu", "opencl", marks=pytest.mark.opencl, id="cpu+opencl"),
    pytest.param("cpu", "cuda", marks=pytest.mark.cuda, id="cpu+cuda"),
    pytest.param("cuda", "opencl", marks=[pytest.mark.cuda, pytest.mark.opencl], id="cuda+opencl"),
]


@pytest.mark.parametrize("host,dev", PAIRS)
def test_simplex_runs_across_two_devices(host: str, dev: str) -> None:
    require_backend(host)
    require_backend(dev)
    m = gr.create(simplex(DEVICE_CODES[host], DEVICE_CODES[dev]), standard_module(),
                  [gr.device(host), gr.device(dev)], strict=True)
    x = _inputs("ABC")
    m.run(**x)
    np.testing.assert_allclose(m.get_output(0).numpy(), x["A"] + x["B"] - x["C"], rtol=1e-6)
    devices = {name: d.kind for _, name, _, d in m.placement()}
    assert devices["elemwise_add"] == dev and devices["elemwise_sub"] == host
    assert devices["__copy_add_to_sub"] == host
    assert m.copies() == []


@pytest.mark.parametrize("host,dev", PAIRS)
def test_duplex_copies_back_and_forth(host: str, dev: str) -> None:
    require_backend(host)
    require_backend(dev)
    m = gr.create(duplex(DEVICE_CODES[host], DEVICE_CODES[dev]), None,
                  [gr.device(host), gr.device(dev)], strict=True)
    x = _inputs("ABCD", seed=1)
    m.run(**x)
    expected = x["A"] + x["B"] - x["C"] + x["D"]
    np.testing.assert_allclose(m.get_output(0).numpy(), expected, rtol=1e-6)
    assert m.get_output(0).device.kind == dev


@pytest.mark.cuda
def test_host_ends_of_gpu_copies_are_page_locked() -> None:
    """The host storage a copy moves to or from a GPU is pinned (DMA at the bus's speed); the
    answer is the same."""
    require_backend("cuda")
    from cupy.cuda import runtime
    m = gr.create(duplex(CPU, CUDA), None, [gr.cpu(), gr.cuda()], strict=True)
    x = _inputs("ABCD", seed=2)
    m.run(**x)
    np.testing.assert_allclose(m.get_output(0).numpy(), x["A"] + x["B"] - x["C"] + x["D"],
                               rtol=1e-6)
    ex = m.executor
    pinned = ex.pinned_ids()
    assert len(pinned) == 2  # the subtraction's input and output, both on the host
    for sid in pinned:
        attrs = runtime.pointerGetAttributes(ex.pool.buffers[sid].ctypes.data)
        assert attrs.type == getattr(runtime, "memoryTypeHost", 1)


def test_a_host_only_module_pins_nothing() -> None:
    m = gr.create(simplex(CPU, CPU), standard_module(), [gr.cpu()])
    assert m.executor.pinned_ids() == set()


@pytest.mark.parametrize("make", [simplex, duplex], ids=["simplex", "duplex"])
def test_only_cpu_given_falls_back_and_warns(make, caplog: pytest.LogCaptureFixture) -> None:
    graph = make(CPU, OPENCL)
    from graph_runtime.runtime import placement
    placement._warned.clear()  # given once per process
    with caplog.at_level(logging.WARNING, logger="graph_runtime"):
        m = gr.create(graph, None, gr.cpu())
    assert "asks for opencl, not in ctxs (cpu:0)" in caplog.text
    names = "ABCD" if make is duplex else "ABC"
    x = _inputs(names, seed=2)
    m.run(**x)
    expected = x["A"] + x["B"] - x["C"] + (x["D"] if make is duplex else 0)
    np.testing.assert_allclose(m.get_output(0).numpy(), expected, rtol=1e-6)
    assert all(d == gr.cpu() for *_, d in m.placement())


def test_fallback_is_an_error_when_strict() -> None:
    with pytest.raises(GraphError, match=r"opencl.*elemwise_add.*strict=False"):
        gr.create(simplex(CPU, OPENCL), None, gr.cpu(), strict=True)


def test_absent_device_index_puts_everything_on_ctxs0(opencl_available: None) -> None:
    nodes = [null("x"), null("y"), tvm_op("a", "add", [0, 1])]
    m = gr.create(make_graph(nodes, [2]), None, [gr.opencl(), gr.cpu()])
    assert {d for *_, d in m.placement()} == {gr.opencl()}
    x = _inputs("xy")
    m.run(**x)
    np.testing.assert_allclose(m.get_output(0).numpy(), x["x"] + x["y"], rtol=1e-6)


def _missing_copy_graph():
    # 'a' runs on opencl; 's' and 't' on cpu read it directly, with no __copy in between.
    nodes = [null("x"), null("y"), tvm_op("a", "add", [0, 1]), tvm_op("s", "negative", [2]),
             tvm_op("t", "multiply", [2, 3])]
    return make_graph(nodes, [4], device_index=[OPENCL, OPENCL, OPENCL, CPU, CPU])


def test_missing_copy_is_inserted_once_and_reported(opencl_available: None) -> None:
    m = gr.create(_missing_copy_graph(), None, [gr.cpu(), gr.opencl()])
    copies = m.copies()
    assert len(copies) == 1, copies
    c = copies[0]
    assert (c.src, c.dst, c.eid, c.nbytes) == (gr.opencl(), gr.cpu(), 2, 16)
    assert set(c.readers) == {"node 3 's'", "node 4 't'"}
    assert m.memory_report().copies == {gr.cpu(): 16}
    x = _inputs("xy", seed=3)
    m.run(**x)
    a = x["x"] + x["y"]
    np.testing.assert_allclose(m.get_output(0).numpy(), a * -a, rtol=1e-6)


def test_missing_copy_is_an_error_when_strict(opencl_available: None) -> None:
    with pytest.raises(GraphError, match=r"node 3 's' on cpu:0 reads input 0, entry 2:0 "
                                         r"\(eid 2\), which lives on opencl:0"):
        gr.create(_missing_copy_graph(), None, [gr.cpu(), gr.opencl()], strict=True)


def test_storage_shared_across_entries_and_dtypes() -> None:
    # x(0) -> relu a(1) -> negative b(2, reuses a's id 1? no: id 2) -> cast c (int32, id 1) ...
    nodes = [null("x"), tvm_op("a", "relu", [0]), tvm_op("b", "negative", [1]),
             tvm_op("c", "exp", [2]), tvm_op("d", "cast", [3])]
    g = make_graph(nodes, [4], shapes=(2, 3), dtypes=["float32"] * 4 + ["int32"],
                   storage_ids=[0, 1, 2, 1, 2])
    m = gr.create(g, None, gr.cpu())
    report = m.memory_report()
    assert report.pool[gr.cpu()] == 3 * 24 and report.unshared[gr.cpu()] == 5 * 24
    x = np.array([[-1, 0.5, 2], [3, -4, 0]], dtype="float32")
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(),
                                  np.exp(-np.maximum(x, 0)).astype("int32"))


def test_one_storage_id_on_two_devices_is_an_error(opencl_available: None) -> None:
    nodes = [null("x"), tvm_op("a", "relu", [0]), copy_op("c", 1), tvm_op("b", "relu", [2])]
    g = make_graph(nodes, [3], storage_ids=[0, 1, 2, 1], device_index=[CPU, CPU, OPENCL, OPENCL])
    with pytest.raises(GraphError, match=r"storage id 1 is used on cpu:0 by entry 1 "
                                         r"\(node 1 'a' output 0\) and on opencl:0 by entry 3"):
        gr.create(g, None, [gr.cpu(), gr.opencl()])


def test_absurd_shapes_fail_before_allocating() -> None:
    nodes = [null("x"), tvm_op("a", "relu", [0])]
    g = make_graph(nodes, [1], shapes=[[1 << 20, 1 << 20, 1 << 10], [1 << 20, 1 << 20, 1 << 10]])
    with pytest.raises(GraphError, match=r"needs 8\.0 PiB on cpu:0.*storage id \d .*entry \d "
                                         r"\(node \d '\w' output 0, shape"):
        gr.create(g, None, gr.cpu())


def test_memory_cap_is_settable() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0])], [1], shapes=(256,))
    gr.create(g, None, gr.cpu(), memory_cap=2048)
    with pytest.raises(GraphError, match=r"needs 2\.0 KiB on cpu:0 but the cap is 1\.0 KiB"):
        gr.create(g, None, gr.cpu(), memory_cap=1024)
    with pytest.raises(GraphError, match="cap is 100 B"):
        gr.create(g, None, gr.cpu(), memory_cap={"cpu": 100})


def test_missing_function_names_node_and_devices(opencl_available: None) -> None:
    lib = Module("mylib")
    lib.register("myadd", lambda x, y, out: np.add(x, y, out=out), device="cpu")
    nodes = [null("x"), null("y"), tvm_op("a", "myadd", [0, 1])]
    g = make_graph(nodes, [2], device_index=[OPENCL] * 3)
    with pytest.raises(LibraryError, match=r"no function 'myadd' for opencl \(node 2 'a'\); "
                                           r"it exists for: cpu"):
        gr.create(g, lib, [gr.cpu(), gr.opencl()])


def test_python_lib_and_flatten_data() -> None:
    seen: list[tuple[int, ...]] = []
    lib = Module("mylib")

    @lib.register("flat_add", device="cpu")
    def flat_add(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
        seen.append(x.shape)
        np.add(x, y, out=out)

    nodes = [null("x"), null("y"), tvm_op("a", "flat_add", [0, 1], flatten_data=1)]
    m = gr.create(make_graph(nodes, [2], shapes=(2, 3)), lib, gr.cpu())
    x = _inputs("")  # unused; explicit arrays below
    a = np.arange(6, dtype="float32").reshape(2, 3)
    m.run(x=a, y=a)
    assert seen == [(6,)]
    np.testing.assert_array_equal(m.get_output(0).numpy(), 2 * a)
    del x


def test_kernel_error_at_run_names_the_node() -> None:
    lib = Module("bad")

    @lib.register("boom", device="cpu")
    def boom(x: np.ndarray, out: np.ndarray) -> None:
        raise ValueError("kernel exploded")

    m = gr.create(make_graph([null("x"), tvm_op("b", "boom", [0])], [1]), lib, gr.cpu())
    with pytest.raises(LibraryError, match=r"node 1 'b' \(boom on cpu:0\) failed: "
                                           r"ValueError: kernel exploded"):
        m.run(x=np.zeros(4, "float32"))


@pytest.mark.opencl
def test_unknown_device_in_ctxs() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0])], [1])
    with pytest.raises(DeviceError, match="opencl:7|opencl\\(7\\) does not exist"):
        gr.create(g, None, [gr.cpu(), gr.device("opencl:7")])
    with pytest.raises(DeviceError, match="unknown device type 'tpu'"):
        gr.create(g, None, ["tpu"])


def test_profile_and_debug_outputs_capture_each_node(opencl_available: None) -> None:
    graph = duplex(CPU, OPENCL)
    m = gr.create(graph, None, [gr.cpu(), gr.opencl()])
    x = _inputs("ABCD", seed=4)
    m.set_input(**x)
    times = m.profile(repeat=3)
    assert [t.label for t in times] == [
        "node 2 'elemwise_add0'", "node 3 '__copy_add_to_sub'", "node 5 'elemwise_sub'",
        "node 6 '__copy_sub_to_add'", "node 8 'elemwise_add1'"]
    assert [t.is_copy for t in times] == [False, True, False, True, False]
    assert all(t.seconds >= 0 for t in times)
    outs = m.debug_get_outputs()
    np.testing.assert_allclose(outs["elemwise_add0"][0], x["A"] + x["B"], rtol=1e-6)
    np.testing.assert_allclose(outs["elemwise_sub"][0], x["A"] + x["B"] - x["C"], rtol=1e-6)
    only = m.debug_get_outputs(["elemwise_sub"])
    assert list(only) == ["elemwise_sub"]


def test_flatten_data_with_a_broadcasting_standard_op(backend_name: str) -> None:
    # Kernels get 1-D views, but a prepared chain is told the declared shapes, so (2, 3) + (3,)
    # still broadcasts (flattened specs (6,) + (3,) could not).
    g = make_graph([null("x"), null("b"), tvm_op("a", "add", [0, 1], flatten_data=1)], [2],
                   shapes=[[2, 3], [3], [2, 3]])
    m = gr.create(g, None, gr.device(backend_name))
    x = np.arange(6, dtype="float32").reshape(2, 3)
    b = np.array([10, 20, 30], dtype="float32")
    m.run(x=x, b=b)
    np.testing.assert_array_equal(m.get_output(0).numpy(), x + b)


# ---- workspace, copies within a device (issue 13) -------------------------------------------

HETERO_CNN = Path(__file__).parents[2] / "examples" / "graphs" / "hetero_cnn"


def _add_then_sum(n: int):
    from graph_runtime.lib.loader import module_from_json
    lib = module_from_json({"format": "graph_runtime.lib", "version": 1, "functions": {
        "addsum": {"ops": [{"op": "add"}, {"op": "sum"}]}}})
    g = make_graph([null("a"), null("b"), tvm_op("s", "addsum", [0, 1])], [2],
                   shapes=[[n, 1], [1, n], []])
    return g, lib


def test_chain_intermediates_count_in_the_report_and_under_the_cap() -> None:
    # add then sum over [n, 1] + [1, n] holds an n x n temp the pool never sees.
    g, lib = _add_then_sum(600)
    m = gr.create(g, lib, gr.cpu())
    assert m.memory_report().workspace == {gr.cpu(): 600 * 600 * 4}
    assert "workspace" in str(m.memory_report())
    a = np.arange(600, dtype="float32").reshape(600, 1)
    b = np.ones((1, 600), "float32")
    m.run(a=a, b=b)
    np.testing.assert_allclose(m.get_output(0).numpy(), (a + b).sum(), rtol=1e-5)
    # The size: 60000 x 60000 float32 (14.4 GB) is refused before it is allocated.
    g, lib = _add_then_sum(60000)
    with pytest.raises(LibraryError, match=r"node 2 's'.*addsum: the chain's intermediates need "
                                           r"13\.4 GiB on cpu:0 .*memory cap"):
        gr.create(g, lib, gr.cpu(), memory_cap=1 << 30)


def test_kernel_workspace_past_the_cap_names_the_node() -> None:
    class Greedy(PreparedKernel):
        """A prepared kernel keeping 1 MiB of its own."""

        def prepare(self, device, inputs, outputs, attrs):
            return self

        def workspace_bytes(self) -> int:
            return 1 << 20

        def __call__(self, x, out) -> None:
            out[...] = x

    lib = Module("greedy")
    lib.register("greedy", Greedy(), device="cpu")
    g = make_graph([null("x"), tvm_op("k", "greedy", [0])], [1])
    assert gr.create(g, lib, gr.cpu()).memory_report().workspace == {gr.cpu(): 1 << 20}
    with pytest.raises(GraphError, match=r"node 1 'k' \(greedy\) keeps 1\.0 MiB of workspace on "
                                         r"cpu:0, which brings the total there to .* but the "
                                         r"cap is 512\.0 KiB"):
        gr.create(g, lib, gr.cpu(), memory_cap=1 << 19)


def test_same_device_copies_are_dropped() -> None:
    nodes = [null("x"), tvm_op("a", "relu", [0]), copy_op("c", 1), tvm_op("b", "exp", [2])]
    m = gr.create(make_graph(nodes, [3], storage_ids=[0, 1, 2, 3]), None, gr.cpu())
    assert [s.label for s in m.executor.steps] == ["node 1 'a'", "node 3 'b'"]
    x = np.array([-1, 0, 1, 2], "float32")
    m.run(x=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), np.exp(np.maximum(x, 0)), rtol=1e-6)


def test_a_same_device_copy_stays_when_its_source_storage_is_reused() -> None:
    # a (sid 1) is copied to c (sid 2); d reuses sid 1 while c is still to be read by e.
    nodes = [null("x"), tvm_op("a", "relu", [0]), copy_op("c", 1), tvm_op("d", "negative", [2]),
             tvm_op("e", "add", [2, 3])]
    m = gr.create(make_graph(nodes, [4], storage_ids=[0, 1, 2, 1, 3]), None, gr.cpu())
    assert any(s.is_copy for s in m.executor.steps)
    x = np.array([-1, 0, 1, 2], "float32")
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.zeros(4, "float32"))


def test_a_same_device_copy_stays_when_a_nop_aliases_its_output() -> None:
    # r is c's storage (sid 2): dropping the copy left sid 2 unwritten and b read garbage.
    nodes = [null("x"), tvm_op("a", "exp", [0]), copy_op("c", 1), tvm_op("r", "__nop", [2]),
             tvm_op("b", "negative", [3])]
    m = gr.create(make_graph(nodes, [4], storage_ids=[0, 1, 2, 2, 3]), None, gr.cpu())
    assert not m.executor.dropped_copies
    x = np.arange(4, dtype="float32")
    m.run(x=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), -np.exp(x), rtol=1e-6)


def test_hetero_cnn_on_cpu_alone_drops_its_cpu_to_cpu_copy() -> None:
    m = gr.create(HETERO_CNN / "graph.json", HETERO_CNN / "lib.json", gr.cpu())
    assert m.executor.dropped_copies and not any(s.is_copy for s in m.executor.steps)
    inputs = np.load(HETERO_CNN / "inputs.npz")
    m.load_params(HETERO_CNN / "params")
    m.run(**{k: inputs[k] for k in inputs.files})
    expected = np.load(HETERO_CNN / "expected.npz")
    np.testing.assert_allclose(m.get_output(0).numpy(), expected["output_0"], rtol=1e-4,
                               atol=1e-5)


@pytest.mark.opencl
def test_memory_report_counts_graph_copies(opencl_available: None) -> None:
    m = gr.create(HETERO_CNN / "graph.json", HETERO_CNN / "lib.json", [gr.cpu(), gr.opencl()])
    report = m.memory_report()
    assert report.copies[gr.cpu()] == 32 * 1024
    assert report.workspace[gr.opencl()] > 0


class _Scaled(PreparedKernel):
    """out = 2 * x (+ r); NHWC at positions `nhwc`; offers out over r when `over`."""

    def __init__(self, nhwc: tuple[int, ...] = (), over: bool = False) -> None:
        self.nhwc, self.over = nhwc, over

    def __call__(self, *arrays: np.ndarray) -> None:
        *inputs, out = arrays
        total = 2 * inputs[0]
        for r in inputs[1:]:
            total += r
        out[...] = total

    def channels_last_positions(self) -> tuple[int, ...]:
        return self.nhwc

    def in_place_positions(self) -> dict[int, int]:
        return {2: 1} if self.over else {}


class _Flat(PreparedKernel):
    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        out[...] = x.reshape(out.shape)

    def flattens(self) -> bool:
        return True


class _Head(PreparedKernel):
    """out = f @ w; asks for w's storage and for a write counter of w."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.w = np.zeros(shape, np.float32)

    def __call__(self, f: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
        np.matmul(f, w, out=out)

    def storage_requests(self) -> dict[int, np.ndarray]:
        return {1: self.w}

    def cached_inputs(self) -> tuple[int, ...]:
        return (1,)


class _Factory:
    def __init__(self, make: Any) -> None:
        self.make = make

    def prepare(self, device: Any, inputs: Any, outputs: Any, attrs: Any) -> Any:
        return self.make(inputs)


def test_setup_passes_plan_without_changing_the_executor(monkeypatch) -> None:
    """Each setup pass's plan reads the executor and changes nothing, its apply changes it;
    every pass has something to do on this graph, in SETUP_PASSES' order; the result is right."""
    from graph_runtime.runtime import executor as ex

    lib = Module("passes")
    lib.register("twice_cl", _Factory(lambda ins: _Scaled(nhwc=(0, 1))))
    lib.register("twice", _Factory(lambda ins: _Scaled()))
    lib.register("add2", _Factory(lambda ins: _Scaled(over=True)))
    lib.register("flat", _Factory(lambda ins: _Flat()))
    lib.register("head", _Factory(lambda ins: _Head(ins[1].shape)))
    plans: dict[str, Any] = {}

    def state(e: Any) -> Any:
        return ({k: id(v) for k, v in e.arrays.items()}, [[id(a) for a in s.args] for s in e.steps],
                list(e.plan.entry_sid), dict(e.plan.workspace_bytes), list(e.in_place),
                set(e.channels_last), set(e.skipped), dict(e.shortcuts), dict(e.versions),
                [id(v) for v in e.pool.views] if hasattr(e, "pool") else None)

    def checked(setup: Any) -> Any:
        def plan(e: Any) -> Any:
            before = state(e)
            plans[setup.name] = setup.plan(e)
            assert state(e) == before, setup.name
            return plans[setup.name]
        return ex.SetupPass(setup.name, plan, setup.apply)

    monkeypatch.setattr(ex, "SETUP_PASSES", tuple(checked(p) for p in ex.SETUP_PASSES))
    # x -> p -> q (p NHWC) -> a -> b -> c = 2b + a (over a) -> f = flat(c) -> d = f @ w
    nodes = [null("x"), null("w"), tvm_op("p", "twice_cl", [0]), tvm_op("q", "twice_cl", [2]),
             tvm_op("a", "twice", [3]), tvm_op("b", "twice", [4]), tvm_op("c", "add2", [5, 4]),
             tvm_op("f", "flat", [6]), tvm_op("d", "head", [7, 1])]
    shapes = [[2, 3, 4, 5], [60, 4]] + [[2, 3, 4, 5]] * 5 + [[2, 60], [2, 4]]
    m = gr.create(make_graph(nodes, [8], shapes=shapes, storage_ids=list(range(9))), lib,
                  gr.cpu())
    assert list(plans) == ["channels-last", "storage", "requested-storage", "flatten-reads",
                           "input-versions"]
    assert plans["channels-last"].entries == {2} and list(plans["requested-storage"]) == [1]
    assert plans["storage"].pairs == [(4, 6)] and len(plans["flatten-reads"]) == 1
    # d's step and its shortcut (the same kernel, reading the rows as they are) count w
    assert [counted for _, counted in plans["input-versions"]] == [{1: 1}, {1: 1}]
    e = m.executor
    assert e.channels_last == {2} and e.in_place == [(4, 6)] and e.skipped == {5}
    assert list(e.versions) == [1] and e.arrays[(1, gr.cpu())] is e.steps[-1].kernel.w
    x = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    w = np.arange(240, dtype=np.float32).reshape(60, 4) / 7
    m.run(x=x, w=w)
    np.testing.assert_allclose(m.get_output(0).numpy(), (40 * x).reshape(2, 60) @ w, rtol=1e-6)
