"""runtime/in_place.py: which outputs take the storage of an input their kernel overwrites.

The kernels here compute with NumPy (out = 2 * x + r, right when out is r itself) and offer
output 2 over input 1; oneDNN's conv, the real user, is tested in tests/lib/test_onednn_in_place.py.
Every graph's values are powers of two times x, so results are compared exactly.
"""
from __future__ import annotations

from typing import Any, Collection

import numpy as np
import pytest
from support import make_graph, null, tvm_op

import graph_runtime as gr
from graph_runtime.lib import Module
from graph_runtime.lib.prepared import PreparedKernel
from graph_runtime.runtime.storage_check import check_liveness
from graph_runtime.settings import IN_PLACE

SHAPE = [2, 3, 4, 5]


class AddTwice(PreparedKernel):
    """out = 2 * x + r, also when out is r's own array; channels-last at `positions`."""

    def __init__(self, positions: tuple[int, ...]) -> None:
        self.positions = positions
        self.same: list[bool] = []  # per call: was out r's own memory

    def __call__(self, x: Any, r: Any, out: Any) -> None:
        self.same.append(bool(np.shares_memory(r, out)))
        twice = 2 * x  # read x first: the executor never makes x the output's storage
        np.add(twice, r, out=out)

    def in_place_positions(self) -> dict[int, int]:
        return {2: 1}

    def channels_last_positions(self) -> tuple[int, ...]:
        return self.positions

    def use_channels_last(self, positions: Collection[int]) -> None:
        pass


class Twice(AddTwice):
    """out = 2 * x; no in-place offer."""

    def __call__(self, x: Any, out: Any) -> None:  # type: ignore[override]
        np.multiply(x, 2, out=out)

    def in_place_positions(self) -> dict[int, int]:
        return {}


class Maker:
    def __init__(self, kind: type, positions: tuple[int, ...] = ()) -> None:
        self.kind, self.positions = kind, positions
        self.made: list[Any] = []

    def prepare(self, device: Any, inputs: Any, outputs: Any, attrs: Any) -> Any:
        self.made.append(self.kind(self.positions))
        return self.made[-1]


def _lib() -> tuple[Module, dict[str, Maker]]:
    lib = Module("in_place")
    makers = {"twice": Maker(Twice), "add2": Maker(AddTwice),
              "twice_cl": Maker(Twice, (0, 1)), "add2_cl": Maker(AddTwice, (0, 1, 2)),
              "tile2": Maker(Tile2), "halves": Maker(Halves)}
    for name, maker in makers.items():
        lib.register(name, maker)
    return lib, makers


class Tile2(Twice):
    """out = [x; x] along axis 0."""

    def __call__(self, x: Any, out: Any) -> None:  # type: ignore[override]
        n = x.shape[0]
        out[:n] = x
        out[n:] = x


class Halves(Twice):
    """out = x[:n] + x[n:] (the inverse shape of Tile2)."""

    def __call__(self, x: Any, out: Any) -> None:  # type: ignore[override]
        n = out.shape[0]
        np.add(x[:n], x[n:], out=out)


def _module(nodes: list, heads: list, sids: list[int], shapes: Any = None,
            in_place: str = "on", monkeypatch: Any = None) -> tuple[Any, dict[str, Maker]]:
    if monkeypatch is not None:
        monkeypatch.setenv(IN_PLACE.name, in_place)
    lib, makers = _lib()
    graph = make_graph(nodes, heads, shapes=shapes or [SHAPE] * len(nodes), storage_ids=sids)
    return gr.create(graph, lib, gr.cpu()), makers


def _x(shape: Any = None) -> np.ndarray:
    return np.arange(np.prod(shape or SHAPE), dtype=np.float32).reshape(shape or SHAPE) - 7


def _run(m: Any, **inputs: Any) -> np.ndarray:
    m.set_input("x", _x())
    for name, value in inputs.items():
        m.set_input(name, value)
    m.run()
    return m.get_output(0).numpy()


def _shares(m: Any, a: int, b: int) -> bool:
    arrays = m.executor.arrays
    return bool(np.shares_memory(arrays[(a, gr.cpu())], arrays[(b, gr.cpu())]))


# x -> a=2x -> b=2a -> c=2b+a (a dies here) -> d=2c (the output)
BLOCK = [null("x"), tvm_op("a", "twice", [0]), tvm_op("b", "twice", [1]),
         tvm_op("c", "add2", [2, 1]), tvm_op("d", "twice", [3])]


def test_an_output_takes_the_storage_of_the_input_dying_there(monkeypatch) -> None:
    m, makers = _module(BLOCK, [4], [0, 1, 2, 3, 4], monkeypatch=monkeypatch)
    assert m.executor.in_place == [(1, 3)]
    assert _shares(m, 1, 3) and m.executor.plan.entry_sid[3] == 1
    for _ in range(2):
        np.testing.assert_array_equal(_run(m), 20 * _x())
    assert makers["add2"].made[0].same == [True, True]
    # the pool is the graph's: same ids allocated, same bytes; the graph is unchanged
    off, _ = _module(BLOCK, [4], [0, 1, 2, 3, 4], in_place="off", monkeypatch=monkeypatch)
    assert off.executor.in_place == []
    assert m.memory_report() == off.memory_report()
    assert m.graph.storage_id(3) == 3
    assert m.graph.to_json() == off.graph.to_json()


def test_debug_outputs_and_profile_see_every_value(monkeypatch) -> None:
    """a's value is overwritten by c; debug outputs copy it right after a's node ran."""
    m, _ = _module(BLOCK, [4], [0, 1, 2, 3, 4], monkeypatch=monkeypatch)
    m.set_input("x", _x())
    outputs = m.debug_get_outputs()
    for name, factor in (("a", 2), ("b", 4), ("c", 10), ("d", 20)):
        np.testing.assert_array_equal(outputs[name][0], factor * _x())
    assert [t.label for t in m.profile()] == [s.label for s in m.executor.steps]
    np.testing.assert_array_equal(m.get_output(0).numpy(), 20 * _x())


def test_zero_copy_inputs_and_outputs_are_unaffected(monkeypatch) -> None:
    m, _ = _module(BLOCK, [4], [0, 1, 2, 3, 4], monkeypatch=monkeypatch)
    x, out = _x(), np.zeros(SHAPE, np.float32)
    m.set_input_zero_copy("x", x)
    m.set_output_zero_copy(0, out)
    m.run()
    assert m.executor.in_place == [(1, 3)]
    np.testing.assert_array_equal(out, 20 * _x())
    np.testing.assert_array_equal(x, _x())


# a ResNet-like chain whose plan gives a's id to d while c still lives (two ids alternate):
# x, a=2x, b=2a, c=2b+a, d=2c, e=2d+c, f=2e (output)
PING_PONG = [null("x"), tvm_op("a", "twice", [0]), tvm_op("b", "twice", [1]),
             tvm_op("c", "add2", [2, 1]), tvm_op("d", "twice", [3]),
             tvm_op("e", "add2", [4, 3]), tvm_op("f", "twice", [5])]


def test_ids_are_traded_where_the_plan_reuses_the_inputs_id(monkeypatch) -> None:
    sids = [0, 1, 2, 3, 1, 2, 4]
    m, makers = _module(PING_PONG, [6], sids, monkeypatch=monkeypatch)
    assert m.executor.in_place == [(1, 3), (3, 5)]
    # c into a's id 1, so d (which had id 1) takes c's former id 3; e then into c's id 1
    assert m.executor.plan.entry_sid == [0, 1, 2, 1, 3, 1, 4]
    check_liveness(m.graph, m.executor.plan.entry_sid, m.executor.in_place)
    np.testing.assert_array_equal(_run(m), 100 * _x())
    assert [k.same for k in makers["add2"].made] == [[True], [True]]
    off, _ = _module(PING_PONG, [6], sids, in_place="off", monkeypatch=monkeypatch)
    assert m.memory_report() == off.memory_report()
    outputs = m.debug_get_outputs()
    for name, factor in (("a", 2), ("b", 4), ("c", 10), ("d", 20), ("e", 50), ("f", 100)):
        np.testing.assert_array_equal(outputs[name][0], factor * _x())


def test_the_pool_is_made_once_over_the_in_place_ids(monkeypatch) -> None:
    """In-place reuse is part of the storage plan: the pool is allocated over the traded ids,
    and every step reads the pool's own views (none made for the graph's ids, then moved)."""
    from graph_runtime.runtime import executor

    made: list[list[int]] = []

    class Recording(executor.StoragePool):
        def __init__(self, graph: Any, plan: Any, *scratch: Any) -> None:
            made.append(list(plan.entry_sid))
            super().__init__(graph, plan, *scratch)

    monkeypatch.setattr(executor, "StoragePool", Recording)
    m, _ = _module(PING_PONG, [6], [0, 1, 2, 3, 1, 2, 4], monkeypatch=monkeypatch)
    assert made == [[0, 1, 2, 1, 3, 1, 4]]
    views = m.executor.pool.views
    assert all(m.executor.arrays[(eid, gr.cpu())] is views[eid] for eid in range(7))
    np.testing.assert_array_equal(_run(m), 100 * _x())


def test_no_trade_moves_a_graph_output(monkeypatch) -> None:
    """f, the output, holds a's id after d: trading at c would move it, so c stays put; e still
    goes in place (nothing takes c's id after it)."""
    m, _ = _module(PING_PONG, [6], [0, 1, 2, 3, 1, 2, 1], monkeypatch=monkeypatch)
    assert m.executor.in_place == [(3, 5)]
    np.testing.assert_array_equal(_run(m), 100 * _x())


def test_no_trade_into_an_id_too_small(monkeypatch) -> None:
    """d (twice c's bytes) takes a's id while c lives; c's own id holds c's bytes only."""
    nodes = [null("x"), tvm_op("a", "twice", [0]), tvm_op("b", "twice", [1]),
             tvm_op("c", "add2", [2, 1]), tvm_op("d", "tile2", [3]), tvm_op("e", "halves", [4])]
    big = [2 * SHAPE[0]] + SHAPE[1:]
    m, _ = _module(nodes, [5], [0, 1, 2, 3, 1, 4], [SHAPE] * 4 + [big, SHAPE],
                   monkeypatch=monkeypatch)
    assert m.executor.in_place == []
    np.testing.assert_array_equal(_run(m), 20 * _x())


def test_an_input_read_again_later_is_not_overwritten(monkeypatch) -> None:
    """a is read by c and by d: c must not write over it; d, its last reader, may."""
    nodes = [null("x"), tvm_op("a", "twice", [0]), tvm_op("b", "twice", [1]),
             tvm_op("c", "add2", [2, 1]), tvm_op("d", "add2", [3, 1]), tvm_op("e", "twice", [4])]
    m, makers = _module(nodes, [5], [0, 1, 2, 3, 4, 5], monkeypatch=monkeypatch)
    assert m.executor.in_place == [(1, 4)]
    # a=2x b=4x c=10x d=22x e=44x
    np.testing.assert_array_equal(_run(m), 44 * _x())
    assert [k.same for k in makers["add2"].made] == [[False], [True]]


@pytest.mark.parametrize("case", ["graph input", "graph output", "read twice", "layouts"])
def test_what_never_goes_in_place(monkeypatch, case) -> None:
    x = _x()
    if case == "graph input":  # c = 2a + r, r the user's
        nodes = [null("x"), null("r"), tvm_op("a", "twice", [0]), tvm_op("c", "add2", [2, 1]),
                 tvm_op("d", "twice", [3])]
        want = 2 * (4 * x + 3 * x)
        m, _ = _module(nodes, [4], [0, 1, 2, 3, 4], monkeypatch=monkeypatch)
        got = _run(m, r=3 * x)
        np.testing.assert_array_equal(m.get_input("r").numpy(), 3 * x)
    elif case == "graph output":  # a is an output too
        m, _ = _module(BLOCK, [4, 1], [0, 1, 2, 3, 4], monkeypatch=monkeypatch)
        want = 20 * x
        got = _run(m)
        np.testing.assert_array_equal(m.get_output(1).numpy(), 2 * x)
    elif case == "read twice":  # c = 2a + a
        nodes = [null("x"), tvm_op("a", "twice", [0]), tvm_op("c", "add2", [1, 1]),
                 tvm_op("d", "twice", [2])]
        m, _ = _module(nodes, [3], [0, 1, 2, 3], monkeypatch=monkeypatch)
        want, got = 12 * x, _run(m)
    else:  # a kept NHWC between takers, c NCHW (its reader cannot take NHWC)
        nodes = [null("x"), tvm_op("a", "twice_cl", [0]), tvm_op("b", "twice_cl", [1]),
                 tvm_op("c", "add2_cl", [2, 1]), tvm_op("d", "twice", [3])]
        m, _ = _module(nodes, [4], [0, 1, 2, 3, 4], monkeypatch=monkeypatch)
        assert m.executor.channels_last == {1, 2}
        want, got = 20 * x, _run(m)
    assert m.executor.in_place == []
    np.testing.assert_array_equal(got, want)


def test_in_place_between_nhwc_entries(monkeypatch) -> None:
    nodes = [null("x"), tvm_op("a", "twice_cl", [0]), tvm_op("b", "twice_cl", [1]),
             tvm_op("c", "add2_cl", [2, 1]), tvm_op("d", "twice_cl", [3])]
    m, _ = _module(nodes, [4], [0, 1, 2, 3, 4], monkeypatch=monkeypatch)
    assert m.executor.channels_last == {1, 2, 3}
    assert m.executor.in_place == [(1, 3)]
    view = m.executor.arrays[(3, gr.cpu())]
    assert view.strides != np.empty(SHAPE, np.float32).strides  # still the NHWC view
    np.testing.assert_array_equal(_run(m), 20 * _x())


def test_the_setting_is_checked(monkeypatch) -> None:
    from graph_runtime.errors import LibraryError
    monkeypatch.setenv(IN_PLACE.name, "maybe")
    lib, _ = _lib()
    graph = make_graph(BLOCK, [4], shapes=[SHAPE] * 5, storage_ids=[0, 1, 2, 3, 4])
    with pytest.raises(LibraryError, match="GRAPH_RUNTIME_IN_PLACE must be on or off, got 'maybe'"):
        gr.create(graph, lib, gr.cpu())


def test_a_wrong_in_place_plan_is_refused_naming_the_setting(monkeypatch) -> None:
    """A plan in_place.py should never make (b written over a, which c still reads) is refused
    before the pool is allocated, blaming the in-place plan, not the graph, and naming the way
    out."""
    from graph_runtime.errors import GraphError
    from graph_runtime.runtime import executor
    from graph_runtime.runtime.in_place import InPlacePlan

    monkeypatch.setattr(executor, "plan_in_place",
                        lambda *args: InPlacePlan(moves={2: 1}, pairs=[(1, 2)]))
    with pytest.raises(GraphError) as info:
        _module(BLOCK, [4], [0, 1, 2, 3, 4], monkeypatch=monkeypatch)
    message = str(info.value)
    assert "in-place plan" in message and "GRAPH_RUNTIME_IN_PLACE=off" in message
    assert "storage id 1 is shared by" in message  # the entries, as the graph check says
    off, _ = _module(BLOCK, [4], [0, 1, 2, 3, 4], in_place="off", monkeypatch=monkeypatch)
    np.testing.assert_array_equal(_run(off), 20 * _x())


def _reshaped_products(batch: Any = 2) -> Any:
    """x (batch, 3, 4) -> Reshape (-1, 4) -> MatMul W (4, 5) -> Reshape (batch, 3, 5) -> MatMul
    V (5, 2), as GPT-2's Conv1D layers reshape around each product (batch a name: dynamic)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    w = np.arange(20, dtype=np.float32).reshape(4, 5) / 16
    v = np.arange(10, dtype=np.float32).reshape(5, 2) / 8 - 0.5
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["rows"]),
             helper.make_node("MatMul", ["rows", "w"], ["y"]),
             helper.make_node("Reshape", ["y", "back"], ["y3"]),
             helper.make_node("MatMul", ["y3", "v"], ["out"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v"),
             numpy_helper.from_array(np.array([-1, 4], np.int64), "flat"),
             numpy_helper.from_array(np.array([-1, 3, 5], np.int64), "back")]
    graph = helper.make_graph(nodes, "reshaped", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [batch, 3, 4])], [helper.make_tensor_value_info(
            "out", TensorProto.FLOAT, [batch, 3, 2])], inits)
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), (w, v)


def _products(x: np.ndarray, weights: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    w, v = weights
    return (x.astype(np.float64).reshape(-1, 4) @ w).reshape(x.shape[0], 3, 5) @ v


def test_a_static_modules_reshapes_are_views_run_skips(monkeypatch) -> None:
    """A Reshape's output takes its dying input's storage, so run() skips the copy; debug
    outputs and profile still run and see every node; in-place off copies as before."""
    from graph_runtime.frontend import import_onnx
    model, w = _reshaped_products()
    x = _x([2, 3, 4]) / 8
    results = {}
    for setting in ("on", "off"):
        monkeypatch.setenv(IN_PLACE.name, setting)
        result = import_onnx(model)
        m = gr.create(result.graph_json, result.module(), gr.cpu())
        m.load_params(gr.save_param_dict(result.params))
        ex = m.executor
        reshapes = [i for i, s in enumerate(ex.steps) if s.kernel.reshapes()]
        assert len(reshapes) == 2
        # the graph input's reshape stays a copy (an input is the user's, never in place)
        skipped = set(reshapes) & ex.skipped
        assert skipped == ({reshapes[1]} if setting == "on" else set())
        for i in skipped:  # its output's view holds its input's bytes
            step = ex.steps[i]
            assert ex.plan.entry_sid[step.arg_keys[0].eid] == ex.plan.entry_sid[
                step.arg_keys[1].eid]
            assert (step.arg_keys[0].eid, step.arg_keys[1].eid) in ex.in_place
        check_liveness(m.graph, ex.plan.entry_sid, ex.in_place)
        for _ in range(2):
            results[setting] = m.run_with(x=x)[0]
            np.testing.assert_allclose(results[setting], _products(x, w), rtol=1e-5)
        y3 = m.debug_get_outputs()["tvmgen_default_fused_reshape_1"][0]  # the one skipped
        np.testing.assert_allclose(y3, (x.reshape(-1, 4) @ w[0]).reshape(2, 3, 5), rtol=1e-5)
        assert [t.label for t in m.profile()] == [s.label for s in ex.steps]
        np.testing.assert_allclose(m.get_output(0).numpy(), _products(x, w),
                                   rtol=1e-5)
    np.testing.assert_array_equal(results["on"], results["off"])


def test_a_symbolic_modules_reshapes_stay_copies() -> None:
    """A specialisation offers no reshape in place: derive, which makes the next batch size
    from the last, refuses a node a setup pass decided on."""
    from graph_runtime.frontend import import_onnx
    model, w = _reshaped_products("batch")
    result = import_onnx(model)
    m = gr.create(result.graph_json, result.module(), gr.cpu())
    m.load_params(gr.save_param_dict(result.params))
    for batch in (2, 3, 2):
        x = _x([batch, 3, 4]) / 8
        np.testing.assert_allclose(m.run_with(x=x)[0], _products(x, w), rtol=1e-5)
        ex = m.specialised().executor
        assert not any(ex.steps[i].kernel.reshapes() for i in ex.skipped)
        assert ex.in_place == []
