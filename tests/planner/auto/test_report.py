"""The AutoPlan report: predicted copies, pricing a plan, switches counted."""
from __future__ import annotations

from pathlib import Path

import pytest
from auto_support import cl0, cpu0, small_graph
from support import make_graph, null, tvm_op

from graph_runtime.errors import PlanError
from graph_runtime.lib import standard_module
from graph_runtime.planner import Placement, auto_place
from graph_runtime.planner.auto.cost_cache import CostCache


@pytest.mark.opencl
def test_report_counts_the_copies_the_planner_inserts(tmp_path: Path) -> None:
    doc = {"node_devices": {"a": "opencl", "b": "cpu", "c": "cpu", "d": "opencl"}}
    result = auto_place(small_graph(), standard_module(), [cpu0, cl0], Placement.from_dict(doc),
                        budget_s=1.0)
    planned = sorted((c.src.spec, c.dst.spec) for c in result.plan.copies)
    predicted = sorted((c.src.spec, c.dst.spec) for c in result.copies)
    assert planned == predicted
    assert ("opencl:0", "cpu:0") in planned  # a, read by b and c on cpu: one copy for both
    assert sum(1 for c in result.plan.copies if c.src_entry.split(":")[0]
               == str(next(n.nid for n in result.plan.graph.nodes if n.name == "a"))) == 1
    text = result.text()
    assert "all on cpu:0" in text and "copies" in text


@pytest.mark.opencl
def test_the_planned_graph_prices_at_the_prediction_and_pins_rule_out_alternatives() -> None:
    doc = {"node_devices": {"b": "opencl"}, "func_devices": {"tanh": "cpu"}}
    result = auto_place(small_graph(), standard_module(), [cpu0, cl0], doc, budget_s=1.0)
    assert result.predict_graph(result.plan.graph) == pytest.approx(result.predicted)
    assert result.alternatives == {cpu0: None, cl0: None}
    assert "not possible" in result.text()
    doc_json = result.to_json()
    assert doc_json["alternatives"] == {"cpu:0": None, "opencl:0": None}
    assert {n["name"]: n["device"] for n in doc_json["nodes"]}["b"] == "opencl:0"


def test_prediction_matches_nodes_by_position_where_names_repeat() -> None:
    # Imported graphs name many nodes alike (one fused function, different shapes): a plan of
    # the graph must be priced node by node, not by whichever node last had that name.
    g = make_graph([null("x"), null("y"), tvm_op("sum", "add", [0, 0]),
                    tvm_op("sum", "add", [1, 1])], [2, 3],
                   shapes=[[8], [512, 512], [8], [512, 512]])
    result = auto_place(g, standard_module(), [cpu0], budget_s=1.0)
    small, large = sorted(n.seconds[cpu0] for n in result.nodes)
    assert large > 3 * small
    assert result.predict_graph(result.plan.graph) == pytest.approx(result.predicted)
    assert result.predicted == pytest.approx(small + large)
    other = make_graph([null("x"), null("y"), tvm_op("sum", "add", [0, 0])], [2])
    with pytest.raises(PlanError, match="fewer nodes than the graph this plan placed"):
        result.predict_graph(other)


@pytest.mark.opencl
def test_switch_costs_are_measured_cached_and_priced() -> None:
    cache = CostCache()
    first = auto_place(small_graph(), standard_module(), [cpu0, cl0], budget_s=1.0, cache=cache)
    kernels = {k for k in cache.kernels}
    # every kernel case has a switch cost after the other device, never negative
    assert {k.rsplit("|after ", 1)[0] for k in cache.switches} == kernels
    assert all(v >= 0.0 for v in cache.switches.values())
    a = next(n for n in first.nodes if n.name == "a")
    assert set(a.after) == {(cpu0, cl0), (cl0, cpu0)}
    # Switching made dear: the plan keeps every kernel on one device, and the report says so.
    forced = {"node_devices": {"a": "opencl", "e": "cpu"}}
    mixed = auto_place(small_graph(), standard_module(), [cpu0, cl0], forced, budget_s=1.0,
                       cache=cache)
    assert mixed.to_json()["switches"] >= 1
    for key in cache.switches:
        cache.switches[key] = 1.0
    dear = auto_place(small_graph(), standard_module(), [cpu0, cl0], forced, budget_s=1.0,
                      cache=cache)
    assert dear.kernels_measured == 0
    assert dear.to_json()["switches"] == 1  # a on opencl and e on cpu force one, no more
    assert dear.predict_graph(dear.plan.graph) == pytest.approx(dear.predicted)
    assert "device switches: 1" in dear.text()
