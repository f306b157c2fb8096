"""Automatic placement: exact solvers against brute force, hard constraints, the cost cache, CLI."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest
from click.testing import CliRunner
from support import copy_op, make_graph, null, tvm_op

from graph_runtime.cli.app import app as graphrun
from graph_runtime.device import Device
from graph_runtime.errors import GraphError, PlanError
from graph_runtime.graph.model import COPY_OP
from graph_runtime.lib import Module, standard_module
from graph_runtime.lib.library import TensorSpec
from graph_runtime.planner import Placement, auto_place
from graph_runtime.planner.auto.place import without_copies
from graph_runtime.planner.auto.calibrate import FACTOR_RANGE, Calibration, calibrate
from graph_runtime.planner.auto.measure_costs import CostCache
from graph_runtime.planner.auto.solve import CopyTerm, CostProblem, brute_force, solve_placement

cpu0, cl0 = Device(1, 0), Device(4, 0)
EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "graphs"


# ---- solvers against brute force ----------------------------------------------------------------

def random_problem(rng: np.random.Generator, n: int, k: int) -> CostProblem:
    """n nodes in topological order, random node costs (some forbidden), random shared copies."""
    cost = rng.integers(0, 20, (n, k)).astype(float)
    cost[rng.random((n, k)) < 0.2] = math.inf
    for v in range(n):
        if not np.isfinite(cost[v]).any():
            cost[v, rng.integers(k)] = float(rng.integers(0, 20))
    terms = []
    for p in range(n - 1):
        count = int(rng.integers(1, 4))
        readers = tuple(sorted({int(r) for r in rng.integers(p + 1, n, count)}))
        w = rng.integers(0, 15, (k, k)).astype(float)
        np.fill_diagonal(w, 0.0)
        terms.append(CopyTerm(p, readers, w))
    return CostProblem(cost, terms)


@pytest.mark.parametrize("seed", range(60))
def test_min_cut_equals_brute_force_on_random_two_device_problems(seed: int) -> None:
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, int(rng.integers(2, 9)), 2)
    cut = solve_placement(problem, "min-cut")
    assert cut.objective == brute_force(problem).objective
    assert math.isfinite(cut.objective)


@pytest.mark.parametrize("seed", range(40))
def test_milp_equals_brute_force_with_three_devices(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    problem = random_problem(rng, int(rng.integers(2, 7)), 3)
    assert solve_placement(problem, "milp").objective == brute_force(problem).objective


@pytest.mark.parametrize("seed", range(20))
def test_alpha_expansion_is_legal_and_no_worse_than_any_one_device_plan(seed: int) -> None:
    rng = np.random.default_rng(2000 + seed)
    problem = random_problem(rng, 7, 3)
    found = solve_placement(problem, "alpha-expansion")
    assert all(math.isfinite(problem.node_cost[v, d]) for v, d in enumerate(found.choice))
    singles = [problem.objective([d] * 7) for d in range(3)]
    assert found.objective <= min(singles)
    assert found.objective >= brute_force(problem).objective


def test_a_milp_stopped_at_its_time_limit_still_answers_and_says_so() -> None:
    problem = random_problem(np.random.default_rng(7), 400, 3)
    found = solve_placement(problem, "milp", time_limit=1e-3)
    assert found.method.startswith("milp (time limit")
    assert math.isfinite(found.objective)
    assert found.objective <= solve_placement(problem, "alpha-expansion").objective


def test_one_copy_serves_every_reader_on_a_device() -> None:
    # p is forced to device 0, its three readers to device 1: one copy, not three.
    inf = math.inf
    cost = np.array([[0.0, inf], [inf, 0.0], [inf, 0.0], [inf, 0.0]])
    w = np.array([[0.0, 5.0], [7.0, 0.0]])
    problem = CostProblem(cost, [CopyTerm(0, (1, 2, 3), w)])
    for method in ("min-cut", "milp", "alpha-expansion"):
        found = solve_placement(problem, method)
        assert found.choice == (0, 1, 1, 1)
        assert found.objective == 5.0
    assert problem.copies([0, 1, 1, 1]) == [(0, 0, 1)]


def test_shared_copy_can_make_moving_a_reader_worthwhile() -> None:
    # Readers 1 and 2 are cheaper on device 1 by 3 each, a copy costs 5: with a per-edge model
    # each move would cost 5 and neither would move; one shared copy makes moving both pay.
    cost = np.array([[0.0, math.inf], [3.0, 0.0], [3.0, 0.0]])
    problem = CostProblem(cost, [CopyTerm(0, (1, 2), np.array([[0.0, 5.0], [5.0, 0.0]]))])
    found = solve_placement(problem, "min-cut")
    assert found.choice == (0, 1, 1)
    assert found.objective == 5.0


@pytest.mark.parametrize("method", ["min-cut", "milp", "alpha-expansion"])
def test_an_infinite_copy_cost_ties_two_nodes_to_one_device(method: str) -> None:
    # Node 1 (a __nop) must share node 0's device though it would be cheaper elsewhere.
    tie = np.array([[0.0, math.inf], [math.inf, 0.0]])
    cost = np.array([[0.0, 20.0], [9.0, 0.0], [9.0, 0.0]])
    problem = CostProblem(cost, [CopyTerm(0, (1,), tie),
                                 CopyTerm(1, (2,), np.array([[0.0, 1.0], [1.0, 0.0]]))])
    found = solve_placement(problem, method)
    assert found.choice[0] == found.choice[1]
    assert found.choice == (0, 0, 1)
    assert found.objective == brute_force(problem).objective == 10.0


def test_min_cut_breaks_ties_toward_the_first_device() -> None:
    problem = CostProblem(np.array([[1.0, 1.0], [0.0, 0.0]]),
                          [CopyTerm(0, (1,), np.array([[0.0, 2.0], [2.0, 0.0]]))])
    assert solve_placement(problem, "min-cut").choice == (0, 0)


def test_a_node_no_device_may_run_is_a_plan_error() -> None:
    problem = CostProblem(np.array([[math.inf, math.inf]]), [], ["node 0 'a'"])
    with pytest.raises(PlanError, match="node 0 'a': no given device may run it"):
        solve_placement(problem)


# ---- auto_place on real devices -----------------------------------------------------------------

def small_graph() -> Any:
    """x -> relu a -> (b = a * y, c = exp a) -> d = b + c -> e = tanh d."""
    return make_graph([null("x"), null("y"), tvm_op("a", "relu", [0]),
                       tvm_op("b", "multiply", [2, 1]), tvm_op("c", "exp", [2]),
                       tvm_op("d", "add", [3, 4]), tvm_op("e", "tanh", [5])], [6],
                      shapes=(64, 64))


class CountingModule(Module):
    """The standard ops, counting prepare calls: a kernel is measured only after preparing."""

    def __init__(self) -> None:
        super().__init__("counting")
        self.import_module(standard_module())
        self.prepared = 0

    def prepare(self, func_name: str, device: Device, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Any = None, node: str | None = None) -> Any:
        self.prepared += 1
        return super().prepare(func_name, device, inputs, outputs, attrs, node)


def node_device(result: Any, name: str) -> Device:
    g = result.plan.graph
    nid = next(n.nid for n in g.nodes if n.name == name)
    return result.plan.node_devices[nid]


@pytest.mark.opencl
def test_a_warm_cache_measures_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "costs.json"
    lib = CountingModule()
    first = auto_place(small_graph(), lib, [cpu0, cl0], budget_s=1.0, cache=str(cache))
    assert lib.prepared > 0 and first.kernels_measured > 0 and first.copies_measured == 2
    doc = json.loads(cache.read_text())
    assert doc["format"] == "graph_runtime.profile_cache" and len(doc["copies"]) == 2
    assert len(doc["sequences"]) == 2  # a whole-graph run per device calibrates it
    assert [(c.device, c.cached) for c in first.calibrations] == [(cpu0, False), (cl0, False)]
    lib.prepared = 0
    second = auto_place(small_graph(), lib, [cpu0, cl0], budget_s=1.0, cache=str(cache))
    assert lib.prepared == 0  # neither kernels timed nor the graph run again
    assert (second.kernels_measured, second.copies_measured) == (0, 0)
    assert [(c.device, c.cached, c.factor) for c in second.calibrations] == [
        (c.device, True, c.factor) for c in first.calibrations]
    assert second.plan.node_devices == first.plan.node_devices


def test_calibration_scales_the_device_by_its_whole_run() -> None:
    """factor = (measured run - its copies) / sum of its kernels, applied to that device only,
    cached by key; a run that fails leaves the costs as measured; wild factors are clamped."""
    def problem() -> CostProblem:
        cost = np.array([[1.0, 4.0], [2.0, 6.0], [math.inf, 0.0]])  # row 2: a pinned output
        return CostProblem(cost, [CopyTerm(1, (2,), np.array([[0.0, 0.5], [0.5, 0.0]]))])

    cache = CostCache()
    runs: list[int] = []

    def run() -> float:
        runs.append(1)
        return 5.5  # kernels 10.0 on device 1, its copies 0.0: factor 0.55

    p = problem()
    found = calibrate(p, 1, [1, 1, 1], 2, "k", cache, run, cl0)
    assert found == Calibration(cl0, 0.55, False) and runs == [1]
    np.testing.assert_allclose(p.node_cost[:2], [[1.0, 2.2], [2.0, 3.3]])
    again = problem()
    assert calibrate(again, 1, [1, 1, 1], 2, "k", cache, run, cl0) == Calibration(cl0, 0.55,
                                                                               True)
    assert runs == [1]

    def fails() -> float:
        raise GraphError("index 7 out of range")
    untouched = problem()
    assert calibrate(untouched, 1, [1, 1, 1], 2, "other", cache, fails, cl0) == Calibration(
        cl0, 1.0, False, "index 7 out of range")
    assert "other" not in cache.sequences  # tried again next time
    np.testing.assert_array_equal(untouched.node_cost, problem().node_cost)
    wild = problem()
    found = calibrate(wild, 1, [1, 1, 1], 2, "wild", cache, lambda: 1000.0, cl0)
    assert found is not None and found.factor == FACTOR_RANGE[1]


def power_graph() -> Any:
    """y = x ** e, e a scalar param stored as the () entry it is in the graph."""
    return make_graph([null("x"), null("e"), tvm_op("y", "power", [0, 1])], [2],
                      shapes=[[32, 32], [], [32, 32]])


def test_small_params_are_measured_with_their_values(tmp_path: Path) -> None:
    # np.power's speed depends on the exponent (negative bases at 3.0 take a slow path), so
    # each exponent is its own case; a (1,) array for the () entry is accepted as load_params does.
    cache = tmp_path / "costs.json"
    lib = CountingModule()
    first = auto_place(power_graph(), lib, [cpu0], budget_s=1.0, cache=str(cache),
                       params={"e": np.array([3.0], np.float32)})
    assert first.kernels_measured == 1
    again = auto_place(power_graph(), lib, [cpu0], budget_s=1.0, cache=str(cache),
                       params={"e": np.array(3.0, np.float32)})
    assert again.kernels_measured == 0
    other = auto_place(power_graph(), lib, [cpu0], budget_s=1.0, cache=str(cache),
                       params={"e": np.array(0.5, np.float32)})
    assert other.kernels_measured == 1
    unknown = auto_place(power_graph(), lib, [cpu0], budget_s=1.0, cache=str(cache))
    assert unknown.kernels_measured == 1
    keys = list(json.loads(cache.read_text())["kernels"])
    assert len(keys) == 3 and sum("|values=1:" in k for k in keys) == 2


def test_large_params_are_not_part_of_the_key(tmp_path: Path) -> None:
    cache = tmp_path / "costs.json"
    g = make_graph([null("x"), null("w"), tvm_op("y", "multiply", [0, 1])], [2],
                   shapes=(32, 32))
    auto_place(g, standard_module(), [cpu0], budget_s=1.0, cache=str(cache),
               params={"w": np.ones((32, 32), np.float32)})
    keys = list(json.loads(cache.read_text())["kernels"])
    assert len(keys) == 1 and "values=" not in keys[0]


@pytest.mark.opencl
def test_distinct_functions_and_shapes_are_measured_once(tmp_path: Path) -> None:
    # Four relus of one shape: one case per device; a fifth of another shape adds one more.
    nodes = [null("x"), tvm_op("r0", "relu", [0]), tvm_op("r1", "relu", [1]),
             tvm_op("r2", "relu", [2]), tvm_op("r3", "relu", [3])]
    g = make_graph(nodes, [4], shapes=(32, 32))
    result = auto_place(g, standard_module(), [cpu0, cl0], budget_s=1.0)
    assert result.kernels_measured == 2
    assert {n.name for n in result.nodes} == {"r0", "r1", "r2", "r3"}


@pytest.mark.opencl
@pytest.mark.parametrize("seed", range(6))
def test_user_constraints_are_never_violated(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    kinds = {"cpu": cpu0, "opencl": cl0}
    names = ["a", "b", "c", "d", "e"]
    pins = {name: str(rng.choice(list(kinds))) for name in names if rng.random() < 0.5}
    doc: dict[str, Any] = {"node_devices": pins}
    if rng.random() < 0.5:
        doc["input_devices"] = {"y": str(rng.choice(list(kinds)))}
    if rng.random() < 0.5:
        doc["output_devices"] = {"0": str(rng.choice(list(kinds)))}
    if rng.random() < 0.5:
        doc["func_devices"] = {"ex*": "opencl"}  # c (exp)
    if "c" in pins and "func_devices" in doc and pins["c"] != "opencl":
        del doc["func_devices"]  # the two would conflict: a PlanError of its own
    cache = tmp_path / "costs.json"
    result = auto_place(small_graph(), standard_module(), [cpu0, cl0],
                        Placement.from_dict(doc), budget_s=1.0, cache=str(cache))
    for name, kind in pins.items():
        assert node_device(result, name) == kinds[kind], (name, doc)
    if "input_devices" in doc:
        assert node_device(result, "y") == kinds[doc["input_devices"]["y"]]
    if "func_devices" in doc:
        assert node_device(result, "c") == cl0
    if "output_devices" in doc:
        g = result.plan.graph
        head = g.heads[0][0]
        assert result.plan.node_devices[head] == kinds[doc["output_devices"]["0"]]
    assert all(result.predicted <= alt + 1e-12
               for alt in result.alternatives.values() if alt is not None)


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


def test_switch_seconds_is_the_difference_of_medians_never_negative() -> None:
    from graph_runtime.planner.auto.measure_costs import _Touches

    class Recorded(_Touches):
        last: Device | None = None

        def touch(self, dev: Device) -> None:
            self.last = dev

    touches = Recorded()

    def slower_after_opencl() -> None:
        time.sleep(0.004 if touches.last == cl0 else 0.001)

    assert touches.switch_seconds(slower_after_opencl, cpu0, cl0, 3) == pytest.approx(
        0.003, abs=0.0015)

    def faster_after_opencl() -> None:
        time.sleep(0.001 if touches.last == cl0 else 0.004)

    assert touches.switch_seconds(faster_after_opencl, cpu0, cl0, 3) == 0.0


def test_pin_to_a_device_not_given_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="node 2 'a'.*none of the given devices"):
        auto_place(small_graph(), standard_module(), [cpu0], {"node_devices": {"a": "cuda"}},
                   budget_s=0.5)


def test_a_function_the_lib_lacks_everywhere_is_a_plan_error() -> None:
    g = make_graph([null("x"), tvm_op("f", "no_such_func", [0])], [1])
    with pytest.raises(PlanError, match="node 1 'f'.*no 'no_such_func' for any given device"):
        auto_place(g, standard_module(), [cpu0], budget_s=0.5)


def test_one_device_plans_everything_there() -> None:
    result = auto_place(small_graph(), standard_module(), [cpu0], budget_s=0.5)
    assert set(result.plan.node_devices) == {cpu0}
    assert result.alternatives == {cpu0: result.predicted}
    assert result.copies == []


@pytest.mark.opencl
def test_a_nop_stays_on_the_device_of_its_input() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0]), tvm_op("v", "__nop", [1]),
                    tvm_op("b", "exp", [2])], [3], shapes=(16, 16))
    doc = {"node_devices": {"a": "cpu", "b": "opencl"}}
    result = auto_place(g, standard_module(), [cpu0, cl0], doc, budget_s=1.0)
    assert node_device(result, "v") == cpu0
    assert [(c.src.spec, c.dst.spec) for c in result.plan.copies] == [("cpu:0", "opencl:0")]


def test_existing_copies_are_dropped_before_placing() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0]), copy_op("cp", 1),
                    tvm_op("b", "exp", [2])], [3])
    stripped = without_copies(g)
    assert [n.name for n in stripped.nodes] == ["x", "a", "b"]
    assert [list(r[:2]) for r in stripped.nodes[2].inputs] == [[1, 0]]
    hetero = without_copies(load_example_graph("hetero_cnn"))
    assert not any(n.func_name == COPY_OP for n in hetero.nodes)


def load_example_graph(name: str) -> Any:
    from graph_runtime.graph.model import Graph
    return Graph.from_json(EXAMPLES / name / "graph.json")


def test_cache_file_of_another_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_text('{"format": "something else"}')
    with pytest.raises(PlanError, match=r"at \$.format: expected 'graph_runtime.profile_cache'"):
        CostCache.load(path)


# ---- CLI ---------------------------------------------------------------------------------------

@pytest.mark.opencl
def test_cli_plan_auto_json_and_verify(tmp_path: Path) -> None:
    cache = tmp_path / "costs.json"
    out = tmp_path / "planned.json"
    args = ["plan", str(EXAMPLES / "duplex"), "--auto", "-d", "cpu", "-d", "opencl",
            "--profile-cache", str(cache), "--budget", "1", "-o", str(out), "--json", "--verify"]
    result = CliRunner().invoke(graphrun, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["method"] == "min-cut" and doc["written"] == str(out)
    assert [v["plan"] for v in doc["verify"]] == ["auto", "all on cpu:0", "all on opencl:0"]
    assert all(v["max_abs_diff"] < 1e-5 for v in doc["verify"])
    again = CliRunner().invoke(graphrun, args[:-2] + ["--json"])
    assert json.loads(again.output)["kernels_measured"] == 0
    text = CliRunner().invoke(graphrun, args[:-2])
    assert "predicted run time" in text.output and "all on opencl:0" in text.output
    assert "opencl:0 kernel times x" in text.output and "(cached)" in text.output
    assert set(doc["calibration"]) == {"cpu:0", "opencl:0"}  # on by default
    alone = CliRunner().invoke(graphrun, args[:-2] + ["--no-calibrate", "--json"])
    assert alone.exit_code == 0, alone.output
    assert json.loads(alone.output)["calibration"] == {}


@pytest.mark.opencl
def test_cli_plan_auto_takes_a_placement_file(tmp_path: Path) -> None:
    placement = tmp_path / "c.json"
    placement.write_text(json.dumps({"node_devices": {"*": "opencl"}}))
    result = CliRunner().invoke(graphrun, ["plan", str(EXAMPLES / "simplex"), "--auto", "-d",
                                           "cpu", "-d", "opencl", "--placement", str(placement),
                                           "--budget", "1", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert {n["device"] for n in doc["nodes"]} == {"opencl:0"}
    assert doc["alternatives"]["cpu:0"] is None


def test_cli_device_without_auto_is_a_usage_error() -> None:
    result = CliRunner().invoke(graphrun, ["plan", str(EXAMPLES / "duplex"), "-d", "cpu"])
    assert result.exit_code == 2
    assert "-d needs --auto" in result.output
    result = CliRunner().invoke(graphrun, ["plan", str(EXAMPLES / "duplex"), "--no-calibrate"])
    assert result.exit_code == 2
    assert "--calibrate/--no-calibrate needs --auto" in result.output
