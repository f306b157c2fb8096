"""Planner properties on random DAGs with random constraints, and planned runs on CPU + OpenCL."""
from __future__ import annotations

import fnmatch
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import make_graph, null, require_backend, tvm_op

import graph_runtime as gr
from graph_runtime.device import Device
from graph_runtime.errors import PlanError
from graph_runtime.graph.model import Graph
from graph_runtime.planner import (Placement, VirtualDevice, join, parse_device_constraint,
                                   plan_graph)

UNARY = ["relu", "negative", "tanh", "sigmoid", "abs"]
BINARY = ["add", "subtract", "multiply", "maximum"]
SHAPE = (3, 4)
DEVICES = ["cpu", "opencl", "cpu:0", "opencl:0", {"device_type": "opencl"}]
MULTI_DEVICES = DEVICES + ["cuda:1", "opencl:1", {"device_id": 1}]


@st.composite
def random_graphs(draw: Any) -> Graph:
    """A random DAG of elementwise ops over 1-3 inputs, each reading recent nodes more often."""
    num_inputs = draw(st.integers(1, 3))
    nodes = [null(f"x{i}") for i in range(num_inputs)]
    for k in range(draw(st.integers(1, 12))):
        arity = draw(st.sampled_from([1, 2]))
        func = draw(st.sampled_from(UNARY if arity == 1 else BINARY))
        picks = [draw(st.integers(max(0, len(nodes) - 4), len(nodes) - 1)) for _ in range(arity)]
        nodes.append(tvm_op(f"n{k}", func, picks))
    ops = list(range(num_inputs, len(nodes)))
    heads = draw(st.lists(st.sampled_from(ops), min_size=1, max_size=3, unique=True))
    if len(nodes) - 1 not in heads:
        heads.append(len(nodes) - 1)
    return make_graph(nodes, heads, shapes=SHAPE)


@st.composite
def placements(draw: Any, g: Graph, choices: list, globs: bool) -> dict:
    """Random constraints on some nodes, inputs and outputs (globs may overlap and conflict)."""
    device = st.sampled_from(choices)
    names = [n.name for n in g.nodes]
    doc: dict[str, Any] = {"default_device": draw(st.sampled_from(["cpu:0", "opencl:0"]))}
    doc["node_devices"] = {name: draw(device) for name in names if draw(st.booleans())}
    matching = [p for p in ["n1*", "n?", "x*", "*"] if fnmatch.filter(names, p)]
    if globs and draw(st.booleans()):
        doc["node_devices"][draw(st.sampled_from(matching))] = draw(device)
    doc["input_devices"] = {name: draw(device) for name in g.input_names
                            if (globs or name not in doc["node_devices"]) and draw(st.booleans())}
    if globs and draw(st.booleans()):
        funcs = sorted({n.func_name for n in g.nodes if n.func_name})
        doc["func_devices"] = {draw(st.sampled_from(funcs)): draw(device)}
    doc["output_devices"] = {str(k): draw(device) for k in range(len(g.heads))
                             if draw(st.booleans())}
    return doc


def expected_constraints(g: Graph, doc: dict) -> dict[int, VirtualDevice | None]:
    """Per node id the join of every constraint naming it (None: a conflict), found without the
    planner's matching code."""
    found: dict[int, VirtualDevice | None] = {}
    for node in g.nodes:
        specs = [spec for pattern, spec in doc.get("node_devices", {}).items()
                 if fnmatch.fnmatchcase(node.name, pattern)]
        specs += [spec for pattern, spec in doc.get("func_devices", {}).items()
                  if node.func_name and fnmatch.fnmatchcase(node.func_name, pattern)]
        specs += [spec for name, spec in doc.get("input_devices", {}).items() if name == node.name]
        dev: VirtualDevice | None = VirtualDevice()
        for spec in specs:
            dev = join(dev, parse_device_constraint(spec)) if dev is not None else None
        if specs:
            found[node.nid] = dev
    return found


def entry_device(g: Graph, eid: int) -> Device:
    ids = g.device_id(eid)
    return Device(g.device_index(eid), ids if ids is not None else 0)


def check_planned(original: Graph, doc: dict, result: Any) -> None:
    """Every invariant the issue names, checked from the planned graph's JSON alone."""
    g = Graph.from_json(result.graph.to_json())
    node_dev = [entry_device(g, g.node_row_ptr[n.nid]) for n in g.nodes]
    assert node_dev == result.node_devices
    seen_copies = set()
    for node in g.nodes:
        for ref in node.inputs:
            src = entry_device(g, g.entry_id(ref[0], ref[1]))
            if node.func_name == "__copy":
                assert src != node_dev[node.nid], f"{node.label} copies within one device"
                key = (g.nodes[ref[0]].name, ref[1], node_dev[node.nid])
                assert key not in seen_copies, f"two copies of {key}"
                seen_copies.add(key)
            else:
                assert src == node_dev[node.nid], f"{node.label} reads {ref} across devices"
    # Constrained nodes sit where their constraints say (names are kept; copies are new).
    by_name = {n.name: n.nid for n in g.nodes}
    for nid, want in expected_constraints(original, doc).items():
        assert want is not None
        got = VirtualDevice.from_device(node_dev[by_name[original.nodes[nid].name]])
        assert join(want, got) == got, f"{original.nodes[nid].label}: {got} breaks {want}"
    for key, spec in doc.get("output_devices", {}).items():
        got = VirtualDevice.from_device(entry_device(g, g.output_entries[int(key)]))
        assert join(parse_device_constraint(spec), got) == got
    check_storage(g)
    again = plan_graph(g, Placement.from_graph(g))
    assert again.graph.to_dict() == result.graph.to_dict()


def check_storage(g: Graph) -> None:
    """Storage ids are device-pure; inputs and outputs own theirs; live entries never share."""
    last = g.num_nodes
    start = {}
    end = {}
    for node in g.nodes:
        for eid in g.node_entries(node.nid):
            start[eid] = 0 if node.is_arg else node.nid
            end[eid] = last if node.is_arg else node.nid
        for ref in node.inputs:
            eid = g.entry_id(ref[0], ref[1])
            end[eid] = max(end[eid], node.nid)
    owned = set(g.output_entries) | {g.node_row_ptr[nid] for nid in g.arg_nodes}
    for eid in owned:
        end[eid] = last
    sids = g.column("storage_id")
    by_sid: dict[int, list[int]] = {}
    for eid, sid in enumerate(sids):
        by_sid.setdefault(sid, []).append(eid)
    for sid, eids in by_sid.items():
        assert len({entry_device(g, e) for e in eids}) == 1, f"storage id {sid} spans devices"
        if any(e in owned for e in eids):
            assert len(eids) == 1, f"storage id {sid} of an input or output is shared: {eids}"
        lives = sorted((start[e], end[e]) for e in eids)
        for (s0, e0), (s1, e1) in zip(lives, lives[1:]):
            assert e0 < s1, f"storage id {sid}: entries live at once ({s0}-{e0}, {s1}-{e1})"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_graphs_plan_validly_or_fail_on_an_explicit_conflict(data: Any) -> None:
    g = data.draw(random_graphs())
    doc = data.draw(placements(g, MULTI_DEVICES, globs=True))
    expected = expected_constraints(g, doc)
    try:
        result = plan_graph(g, doc)
    except PlanError as e:
        assert "conflicts with" in str(e)
        bad_nodes = [nid for nid, dev in expected.items() if dev is None]
        if bad_nodes:
            assert str(e).startswith(g.nodes[bad_nodes[0]].label + ":")
        return
    assert all(dev is not None for dev in expected.values())
    check_planned(g, doc, result)


def _run(graph: Graph, ctxs: list[Device], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    module = gr.create(graph, gr.standard_module(), ctxs)
    module.run(**inputs)
    return [module.get_output(i).numpy() for i in range(module.get_num_outputs())]


@pytest.mark.opencl
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_planned_random_graphs_on_cpu_and_opencl_match_cpu(data: Any) -> None:
    require_backend("opencl")
    g = data.draw(random_graphs())
    doc = data.draw(placements(g, ["cpu", "opencl"], globs=False))
    result = plan_graph(g, doc)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    inputs = {name: rng.uniform(-1, 1, SHAPE).astype("float32") for name in g.input_names}
    want = _run(g, [gr.cpu(0)], inputs)
    got = _run(result.graph, [gr.cpu(0), gr.opencl(0)], inputs)
    for k, (w, o) in enumerate(zip(want, got)):
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6, err_msg=f"output {k}")
