"""auto_place on real devices: hard constraints, one device, __nop and __copy nodes, the CLI."""
from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from auto_support import EXAMPLES, cl0, cpu0, node_device, small_graph
from click.testing import CliRunner
from support import copy_op, make_graph, null, tvm_op

from graph_runtime.cli.app import app as graphrun
from graph_runtime.errors import PlanError
from graph_runtime.graph.model import COPY_OP
from graph_runtime.lib import standard_module
from graph_runtime.lib.loader import load_module
from graph_runtime.planner import Placement, auto_place
from graph_runtime.planner.auto import CostCache
from graph_runtime.planner.auto.confirm import PlanTiming
from graph_runtime.planner.auto.cost_cache import CopyModel, copy_key, switch_key
from graph_runtime.planner.auto.cost_model import CostModel
from graph_runtime.planner.auto.measure_costs import Measurer
from graph_runtime.planner.auto.place import without_copies


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
    # the solver's answer beats every one-device plan (the default, kept unless the solver's
    # plan measured clearly faster, may not)
    solved = result.check.predicted["auto"] if result.check is not None else result.predicted
    assert all(solved <= alt + 1e-12 for alt in result.alternatives.values() if alt is not None)


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
    assert doc["check"]["kept"] in ("auto", "default") and doc["check"]["default"] == "all on cpu:0"
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


# ---- the solver's plan against the default one (confirm.py) -----------------------------------

def _mlp_costs(cpu: float = 1e-4, opencl: float = 1e-5) -> tuple[Any, Any, CostCache]:
    """The MLP example with given kernel costs per device; by default as a busy machine once
    measured them: every kernel 10x faster on OpenCL, so the solver puts it all there (issue
    30: it ran 4.3x slower)."""
    g = load_example_graph("mlp")
    lib = load_module(EXAMPLES / "mlp" / "lib.json")
    cache = CostCache()
    measurer = Measurer(lib, cache)
    names = {dev: measurer.name(dev) for dev in (cpu0, cl0)}
    for row in CostModel(g, lib, [cpu0, cl0], Placement(), {}).cases:
        for d, case in row.items():
            cache.kernels[measurer.key(case)] = cpu if d == 0 else opencl
            before = cl0 if d == 0 else cpu0
            cache.switches[switch_key(measurer.key(case), before, names)] = 0.0
    for a, b in ((cpu0, cl0), (cl0, cpu0)):
        cache.copies[copy_key(a, b, names)] = CopyModel(1e-6, 0.0)
    return g, lib, cache


def _scripted(**seconds: tuple[float, ...]) -> Callable[[str, Any], Callable[[], float]]:
    """Each plan's timing source (by name) giving these seconds per run in turn, no run made."""
    def source(name: str, plan: Any) -> Callable[[], float]:
        times = itertools.cycle(seconds[name])
        return lambda: next(times)
    return source


def _quiet() -> Callable[[], str]:
    return lambda: ""


@pytest.mark.opencl
def test_plan_auto_keeps_the_default_when_the_difference_is_within_noise() -> None:
    """Measured end to end, the all-OpenCL plan is 0.95x or 1.45x the default's speed round by
    round: within noise, so the MLP stays all on the CPU, and the report says why."""
    g, lib, cache = _mlp_costs()
    timing = PlanTiming(_scripted(default=(1e-3,), auto=(1e-3 / 0.95, 1e-3 / 1.45)), _quiet)
    result = auto_place(g, lib, [cpu0, cl0], cache=cache, calibrate_devices=False,
                        timing=timing)
    assert set(result.plan.node_devices) == {cpu0}
    assert result.check is not None and result.check.kept == "default"
    assert result.check.predicted["auto"] < result.check.predicted["default"] == result.predicted
    text = result.text()
    assert ("measured run time (medians of interleaved rounds): default (all on cpu:0) 1.000 ms, "
            "auto 0.871 ms") in text
    assert "within noise after 40 rounds: auto 1.15x as fast as default: kept the default: " \
           "within noise" in text
    assert "auto (min-cut), not kept" in text
    check = result.to_json()["check"]
    assert (check["outcome"], check["kept"], check["rounds"]) == ("within noise", "default", 40)


@pytest.mark.opencl
def test_plan_auto_takes_the_solvers_plan_only_when_clearly_faster_on_a_quiet_machine() -> None:
    g, lib, cache = _mlp_costs()
    clear = _scripted(default=(1e-3,), auto=(4e-4, 4.1e-4))
    result = auto_place(g, lib, [cpu0, cl0], cache=cache, calibrate_devices=False,
                        timing=PlanTiming(clear, _quiet))
    assert set(result.plan.node_devices) == {cl0} and result.check is not None
    assert (result.check.kept, result.check.outcome) == ("auto", "clear")
    assert "clear after 6 rounds: auto 2.4" in result.text() and ": kept auto" in result.text()
    busy = PlanTiming(clear, lambda: lambda: "other processes used 1.6 of 2 CPUs")
    result = auto_place(g, lib, [cpu0, cl0], cache=cache, calibrate_devices=False, timing=busy)
    assert set(result.plan.node_devices) == {cpu0} and result.check is not None
    assert (result.check.kept, result.check.outcome) == ("default", "busy")
    assert "kept the default: auto won while the machine was busy" in result.text()


@pytest.mark.opencl
def test_the_default_plan_is_not_measured_against_itself() -> None:
    def never(name: str, plan: Any) -> Callable[[], float]:
        raise AssertionError("timed a plan although the solver chose the default")
    g, lib, cache = _mlp_costs(cpu=1e-5, opencl=1e-4)
    result = auto_place(g, lib, [cpu0, cl0], cache=cache, calibrate_devices=False,
                        timing=PlanTiming(never, _quiet))
    assert set(result.plan.node_devices) == {cpu0} and result.check is not None
    assert (result.check.outcome, result.check.kept) == ("same plan", "auto")
    assert "the solver's plan is the default (all on cpu:0): nothing to compare" in result.text()
