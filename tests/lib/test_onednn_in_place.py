"""oneDNN convs adding their residual in place (runtime/in_place.py) on ResNet-style ONNX models:
the result is the float64 one and ONNX Runtime's, bit for bit the one with the copy
(GRAPH_RUNTIME_IN_PLACE=off), and only residuals that die at their conv are written over."""
from __future__ import annotations

import numpy as np
import pytest
from test_conv import ref_conv2d_attrs
from test_onednn import onednn  # noqa: F401  (the fixture: skip or force oneDNN)

import graph_runtime as gr
from graph_runtime.frontend import from_onnx
from graph_runtime.lib.kernels.onednn import binding
from graph_runtime.lib.kernels.onednn import conv as onednn_conv
from graph_runtime.lib.kernels.onednn.conv import OnednnConv
from graph_runtime.settings import IN_PLACE, NUM_THREADS, ONEDNN_THREADS

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(21)


class Net:
    """An ONNX graph built conv by conv, with the float64 values of every tensor beside it."""

    def __init__(self, x: np.ndarray) -> None:
        self.nodes: list = []
        self.inits: list = []
        self.values: dict[str, np.ndarray] = {"x": x.astype(np.float64)}
        self.x = x

    def conv(self, src: str, out_c: int, k: int = 3, stride: int = 1, relu: bool = True,
             residual: str | None = None) -> str:
        name = f"t{len(self.nodes)}"
        c = self.values[src].shape[1]
        w = (RNG.standard_normal((out_c, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        b = (RNG.standard_normal(out_c) * 0.1).astype(np.float32)
        self.inits += [numpy_helper.from_array(w, name + "_w"), numpy_helper.from_array(b, name
                                                                                      + "_b")]
        pad = k // 2
        attrs = {"strides": [stride, stride], "padding": [pad]}
        y = ref_conv2d_attrs(self.values[src], w.astype(np.float64), attrs) + \
            b.astype(np.float64)[:, None, None]
        self.nodes.append(helper.make_node("Conv", [src, name + "_w", name + "_b"], [name + "c"],
                                           pads=[pad] * 4, strides=[stride, stride]))
        last = name + "c"
        if residual is not None:
            y = y + self.values[residual]
            self.nodes.append(helper.make_node("Add", [last, residual], [name + "a"]))
            last = name + "a"
        if relu:
            y = np.maximum(y, 0)
            self.nodes.append(helper.make_node("Relu", [last], [name]))
            last = name
        self.values[last] = y
        return last

    def model(self, out: str) -> tuple:
        self.nodes.append(helper.make_node("GlobalAveragePool", [out], ["y"]))
        want = self.values[out].mean(axis=(2, 3), keepdims=True)
        shape = list(self.x.shape)
        graph = helper.make_graph(
            self.nodes, "resnet_blocks",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m, want


def _resnet(n: int = 2) -> tuple:
    """Stem, an identity block, a downsampling block (1x1 stride-2 projection), an identity
    block, global pool: three convs add a residual that dies there."""
    net = Net(RNG.standard_normal((n, 8, 12, 10)).astype(np.float32))
    h = net.conv("x", 16)
    h = net.conv(net.conv(h, 16), 16, relu=True, residual=h)
    proj = net.conv(h, 24, k=1, stride=2, relu=False)
    h = net.conv(net.conv(h, 24, stride=2), 24, residual=proj)
    h = net.conv(net.conv(h, 24), 24, residual=h)
    return net, *net.model(h)


def _create(model, monkeypatch, in_place: str = "on"):
    monkeypatch.setenv(IN_PLACE.name, in_place)
    graph, lib, params = from_onnx(model)
    m = gr.create(graph, lib, gr.cpu())
    m.load_params(gr.save_param_dict(params))
    return m


def _convs(m) -> list[OnednnConv]:
    return [s.kernel for s in m.executor.steps if isinstance(s.kernel, OnednnConv)]


def _check(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("mode", ["workers", "openmp"])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_resnet_blocks_add_their_residuals_in_place(onednn, monkeypatch, mode,  # noqa: F811
                                                    threads) -> None:
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    monkeypatch.setenv(NUM_THREADS.name, threads)
    monkeypatch.setattr(onednn_conv, "MIN_SPLIT_FLOPS", 0)  # bands of rows in place too
    net, model, want = _resnet()
    m = _create(model, monkeypatch)
    assert len(m.executor.in_place) == 3
    g = m.executor.graph
    moved = [e for e in range(g.num_entries) if m.executor.plan.entry_sid[e] != g.storage_id(e)]
    # the frontend's plan reuses a dead residual's id at once: other entries were traded too
    assert set(moved) - {o for _, o in m.executor.in_place}
    convs = _convs(m)
    assert sum(c.residual is not None for c in convs) == 3
    m.set_input("x", net.x)
    for _ in range(2):  # the second run recomputes each residual before it is written over
        m.run()
        _check(m.get_output(0).numpy(), want)
    assert [c.in_place for c in convs if c.residual is not None] == [True] * 3
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    _check(m.get_output(0).numpy(), session.run(None, {"x": net.x})[0])
    off = _create(model, monkeypatch, "off")
    assert off.executor.in_place == [] and not any(c.in_place for c in _convs(off))
    off.set_input("x", net.x)
    off.run()
    np.testing.assert_array_equal(m.get_output(0).numpy(), off.get_output(0).numpy())
    mine, theirs = m.memory_report(), off.memory_report()  # the kernels' workspace may differ
    assert (mine.pool, mine.unshared, mine.copies) == (theirs.pool, theirs.unshared, theirs.copies)
    # every intermediate value as it was written, the residuals included
    values, others = m.debug_get_outputs(), off.debug_get_outputs()
    assert values.keys() == others.keys()
    for name in values:
        np.testing.assert_array_equal(values[name][0], others[name][0], err_msg=name)


def test_a_residual_read_by_two_convs_is_written_over_by_the_last(onednn,  # noqa: F811
                                                                   monkeypatch) -> None:
    """h feeds u = conv(h) + h and v = conv(u) + h: u must not write over h; v may."""
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    net = Net(RNG.standard_normal((1, 8, 9, 11)).astype(np.float32))
    h = net.conv("x", 16)
    u = net.conv(h, 16, residual=h)
    v = net.conv(u, 16, residual=h)
    model, want = net.model(net.conv(v, 16))
    m = _create(model, monkeypatch)
    g = m.executor.graph
    convs = [c for c in _convs(m) if c.residual is not None]
    assert len(convs) == 2
    assert len(m.executor.in_place) == 1
    (r_eid, o_eid), = m.executor.in_place
    m.set_input("x", net.x)
    m.run()
    _check(m.get_output(0).numpy(), want)
    assert [c.in_place for c in convs] == [False, True]
    # the pair is the second conv writing over h, which no node reads after it
    assert g.liveness.last_read[r_eid] == g.liveness.writer[o_eid]


def test_a_residual_that_is_the_graph_input_is_not_written_over(onednn,  # noqa: F811
                                                                monkeypatch) -> None:
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    net = Net(RNG.standard_normal((2, 16, 7, 8)).astype(np.float32))
    h = net.conv("x", 16, residual="x")
    model, want = net.model(net.conv(h, 16))
    m = _create(model, monkeypatch)
    assert m.executor.in_place == []
    m.set_input("x", net.x)
    m.run()
    _check(m.get_output(0).numpy(), want)
    np.testing.assert_array_equal(m.get_input("x").numpy(), net.x)


def _random_plan(live, rng) -> list[int]:
    """A valid storage plan other than the frontend's: each value takes a random id free at its
    start (one whose last holder's life ended before) or a new one; aliases share their root's."""
    sids = [0] * len(live.group)
    ends: list[int] = []  # per id: the end of its last holder
    for eid in sorted(live.roots, key=lambda e: (live.start[e], e)):
        free = [sid for sid, end in enumerate(ends) if end < live.start[eid]]
        if live.held(eid) or not free or rng.random() < 0.2:
            ends.append(live.end[eid])
            sids[eid] = len(ends) - 1
        else:
            sids[eid] = int(rng.choice(free))
            ends[sids[eid]] = live.end[eid]
    return [sids[root] for root in live.group]


def test_random_storage_plans_give_the_answer_of_the_copy(onednn, monkeypatch) -> None:  # noqa: F811
    """Plans where an id is shared by three or more entries, reused at once or late: the
    trades keep every value, bit for bit the run with the copy, and the check passes."""
    import json

    from graph_runtime.graph.model import Graph
    from graph_runtime.runtime.storage_check import check_liveness
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    net = Net(RNG.standard_normal((1, 8, 12, 10)).astype(np.float32))
    stem = net.conv("x", 16)
    h = net.conv(net.conv(stem, 16), 16, residual=stem)
    h2 = net.conv(h, 16, residual=h, relu=False)
    proj = net.conv(h2, 24, k=1, stride=2, relu=False)
    h = net.conv(net.conv(h2, 24, stride=2), 24, residual=proj)
    h = net.conv(net.conv(h, 24), 24, residual=h)
    model, want = net.model(h)
    graph_json, lib, params = from_onnx(model)
    doc = json.loads(graph_json)
    live = Graph.from_json(graph_json).liveness
    rng = np.random.default_rng(5)
    pairs = moved = 0
    for _ in range(8):
        doc["attrs"]["storage_id"] = ["list_int", _random_plan(live, rng)]
        modules = []
        for setting in ("on", "off"):
            monkeypatch.setenv(IN_PLACE.name, setting)
            m = gr.create(json.dumps(doc), lib, gr.cpu())
            m.load_params(gr.save_param_dict(params))
            m.set_input("x", net.x)
            m.run()
            modules.append(m)
        on, off = modules
        ex = on.executor
        pairs += len(ex.in_place)
        moved += sum(a != b for a, b in zip(ex.plan.entry_sid, doc["attrs"]["storage_id"][1]))
        check_liveness(ex.graph, ex.plan.entry_sid, ex.in_place)
        np.testing.assert_array_equal(on.get_output(0).numpy(), off.get_output(0).numpy())
        _check(on.get_output(0).numpy(), want)
    assert pairs >= 8 and moved > pairs  # in place each time, with trades beside


def _block_nodes(src: str, out: str) -> list:
    """a = relu(conv(src)), c = relu(conv(a)), out = conv(relu(conv(c) + a)): a dies at the
    residual conv."""
    return [helper.make_node("Conv", [src, "w0"], ["a0"], pads=[1] * 4),
            helper.make_node("Relu", ["a0"], ["a"]),
            helper.make_node("Conv", ["a", "w1"], ["c0"], pads=[1] * 4),
            helper.make_node("Relu", ["c0"], ["c"]),
            helper.make_node("Conv", ["c", "w1"], ["b0"], pads=[1] * 4),
            helper.make_node("Add", ["b0", "a"], ["b1"]),
            helper.make_node("Relu", ["b1"], ["b"]),
            helper.make_node("Conv", ["b", "w2"], [out], pads=[1] * 4)]


def test_control_flow_bodies_add_their_residuals_in_place(onednn, monkeypatch) -> None:  # noqa: F811
    """A Loop body and an If branch build their own executors: each writes its residual in
    place, and every run (the branch taken or not) is ONNX Runtime's."""
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    c = 8

    def value(name: str) -> object:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, c, 9, 7])

    body = helper.make_graph(
        _block_nodes("h", "h_out") + [helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []), value("h")],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), value("h_out")])
    then = helper.make_graph(_block_nodes("x", "then_out"), "then", [], [value("then_out")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["else_out"])], "else", [],
                              [value("else_out")])
    inits = [numpy_helper.from_array((RNG.standard_normal((c, c, 3, 3)) / 8).astype(np.float32),
                                     f"w{i}") for i in range(3)]
    inits += [numpy_helper.from_array(np.array(3, np.int64), "n"),
              numpy_helper.from_array(np.zeros((), np.float32), "zero")]
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body),
         helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["positive"]),
         helper.make_node("If", ["positive"], ["z"], then_branch=then, else_branch=other)],
        "control_flow", [value("x")], [value("y"), value("z")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    m = _create(model, monkeypatch)
    inner = [sub.executor for s in m.executor.steps for sub in s.kernel.sub_modules()]
    assert sorted(len(e.in_place) for e in inner) == [0, 1, 1]  # loop body, then; else none
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for sign in (1, -1, 1):
        x = (sign * np.abs(RNG.standard_normal((1, c, 9, 7)))).astype(np.float32)
        m.set_input("x", x)
        m.run()
        for got, want in zip((m.get_output(0).numpy(), m.get_output(1).numpy()),
                             session.run(None, {"x": x})):
            _check(got, want)
