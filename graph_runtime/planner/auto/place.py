"""auto_place: measure, solve and emit the placement that minimises a graph's predicted run time.

Existing `__copy` nodes are dropped first (readers read the copy's source): the plan decides its
own copies, and plan_graph inserts them. The graph becomes a CostProblem (cost_model.py), the
kernels and copies are measured (measure_costs.py) and each device calibrated (calibrate.py),
and the chosen devices go back through plan_graph with every node pinned by name, so copies,
storage and the report are the planner's own. The solver's plan replaces the default one only
when it runs clearly faster (confirm.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...device import Device
from ...errors import PlanError
from ...graph.model import COPY_OP, Graph, GraphSource
from ...lib.library import Module
from ..constraints import Placement, glob_escape
from ..plan import plan_graph
from ..result import PlanResult
from ..virtual_device import VirtualDevice
from ..._timing import Budget
from .calibrate import Calibration, calibrate, sequence_key, whole_run_seconds
from .confirm import DefaultCheck, PlanTiming, check_default, default_label, module_timing
from .cost_cache import SMALL_PARAM, CostCache, value_digest
from .cost_model import CostModel
from .cost_problem import CostProblem
from .measure_costs import Measurer
from .report import AutoPlan
from .solve import solve_placement

Progress = Callable[[int, str], None]  # (jobs in all, what was just measured) per step


def auto_place(graph: GraphSource, lib: Module, devices: Sequence[Device],
               constraints: Placement | Mapping[str, Any] | None = None, budget_s: float = 60.0,
               cache: CostCache | str | None = None, progress: Progress | None = None,
               method: str = "auto", params: Mapping[str, Any] | None = None,
               calibrate_devices: bool = True, timing: PlanTiming | None = None) -> AutoPlan:
    """Place graph on devices where its predicted run time is least, from measured costs.

    Args:
        devices: where nodes may go; the first is the default for anything unplaced.
        constraints: the user's Placement (pins are hard constraints; default_device unused).
        budget_s: seconds of measuring; past it, each remaining kernel is timed once.
        cache: a CostCache or the path of its JSON file; None measures afresh.
        progress: called per measurement with the number of jobs and a label (a CLI bar).
        method: "auto", "min-cut", "milp" or "alpha-expansion" (see solve_placement).
        params: the graph's params (name -> array); small ones (exponents, bounds) are measured
            with their values, as a kernel's speed may depend on them. Others get samples.
            The whole-graph run that calibrates each non-CPU device (calibrate.py) loads them
            all; inputs get samples.
        calibrate_devices: run the graph once on each device that can hold it all and scale
            that device's kernel costs by the run (calibrate.py; cached): kernels timed alone
            run hotter than in a graph on the CPU and, on an asynchronous device, cannot overlap
            launches as a run does. False keeps the costs as timed alone.
        timing: how the solver's plan and the default one are timed against each other
            (confirm.py); None creates both and benchmarks them in interleaved rounds.
    """
    started = time.perf_counter()
    laps: dict[str, float] = {}
    devs = devices_of(devices)
    placement = placement_of(constraints)
    g = without_copies(Graph.from_json(graph))
    if g.is_symbolic:
        from ..samples import signature
        raise PlanError(f"{g.source}: the graph has symbolic dims ({signature(g)}); kernels are "
                        "measured at concrete shapes: use auto_place_symbolic with sample "
                        "shapes (graphrun plan --auto --shape NAME=D0,D1,...)")
    measurer, (found,) = measure_problems([g], lib, devs, placement, budget_s, cache, progress,
                                          params, calibrate_devices, laps, started)
    solution = solve_placement(found.problem, method)
    laps["solve"] = time.perf_counter() - started - sum(laps.values())
    n = found.model.n
    chosen = list(solution.choice)
    check = None
    if len(devs) > 1:
        default = default_choice(found.model)
        label = default_label(default, n, devs)
        predicted = {"default": found.problem.objective(default), "auto": solution.objective}
        if default == chosen:
            check = DefaultCheck(label, predicted, "auto")
        else:
            plans = {name: plan_graph(g, pin_all(g, [devs[c] for c in choice[:n]], placement,
                                                 devs[0]), lib, strict=True)
                     for name, choice in (("default", default), ("auto", chosen))}
            budget = Budget(max_rounds=40, max_s=max(1.0, min(10.0, budget_s / 10)))
            check = check_default(plans, predicted, label,
                                  timing or module_timing(lib, devs, params), budget)
            if check.kept == "default":
                chosen = default
        laps["check"] = time.perf_counter() - started - sum(laps.values())
    pinned = pin_all(g, [devs[c] for c in chosen[:n]], placement, devs[0])
    result = plan_graph(g, pinned, lib, strict=True)
    laps["emit"] = time.perf_counter() - started - sum(laps.values())
    return report(found, result, chosen, found.problem.objective(chosen), solution.method,
                  measurer, laps, pinned, check)


@dataclass
class Measured:
    """One (static) graph's measured cost problem, its model and the device calibrations."""

    graph: Graph
    model: CostModel
    problem: CostProblem
    calibrations: list[Calibration]


def devices_of(devices: Sequence[Device]) -> list[Device]:
    """The devices once each, in order; PlanError when there are none."""
    devs = list(dict.fromkeys(devices))
    if not devs:
        raise PlanError("auto placement needs at least one device, e.g. -d cpu -d opencl")
    return devs


def placement_of(constraints: Placement | Mapping[str, Any] | None) -> Placement:
    if constraints is None:
        return Placement()
    if isinstance(constraints, Placement):
        return constraints
    return Placement.from_dict(constraints)


def measure_problems(graphs: Sequence[Graph], lib: Module, devs: list[Device],
                     placement: Placement, budget_s: float, cache: CostCache | str | None,
                     progress: Progress | None, params: Mapping[str, Any] | None,
                     calibrate_devices: bool, laps: dict[str, float], started: float
                     ) -> tuple[Measurer, list[Measured]]:
    """Each static graph's CostProblem, its kernels and copies measured in one pass (one
    progress total) and each device calibrated by a whole-graph run (see auto_place)."""
    store = cache if isinstance(cache, CostCache) else CostCache.load(cache)
    measurer = Measurer(lib, store, budget_s)
    name_digest: dict[str, str] = {}
    for name, array in small_params(params or {}).items():
        name_digest[name] = value_digest(array)
        measurer.values[name_digest[name]] = array
    models = [CostModel(g, lib, devs, placement, name_digest) for g in graphs]
    cases = [c for model in models for row in model.cases for c in row.values()]
    pairs = [(a, b) for a in devs for b in devs if a != b]
    laps["build"] = time.perf_counter() - started
    todo, pair_todo = measurer.missing(cases, pairs)
    total = len(todo) + len(pair_todo)
    step = None if progress is None else (lambda label: progress(total, label))
    measurer.measure(cases, pairs, step)
    laps["measure"] = time.perf_counter() - started - sum(laps.values())
    found = []
    for g, model in zip(graphs, models):
        problem = model.problem(measurer)
        calibrations = []
        for d, dev in enumerate(devs):
            single = model.single(d)
            if not calibrate_devices or single is None:
                continue
            keys = [measurer.key(row[d]) for row in model.cases if d in row]
            planned = _one_device_graph(g, lib, placement, dev)
            got = calibrate(problem, d, single, model.n,
                            sequence_key(g, keys, measurer.name(dev)), store,
                            whole_run_seconds(planned, lib, devs, params), dev)
            if got is not None:
                calibrations.append(got)
        found.append(Measured(g, model, problem, calibrations))
    laps["calibrate"] = time.perf_counter() - started - sum(laps.values())
    return measurer, found


def default_choice(model: CostModel) -> list[int]:
    """The default assignment: every node on the first given device that may hold it (so all on
    the first device unless a pin or a missing kernel says otherwise), pinned outputs pinned."""
    return ([int(np.argmax(row)) for row in model.allowed]
            + [d for _, d in sorted(model.head_pins.items())])


def report(found: Measured, result: PlanResult, choice_index: Sequence[int], predicted: float,
           method: str, measurer: Measurer, laps: dict[str, float], pinned: Placement,
           check: DefaultCheck | None = None) -> AutoPlan:
    """The AutoPlan of one assignment (device indices, nodes then pinned outputs) of found."""
    model = found.model
    problem = found.problem
    devs = model.devs
    choice = [devs[c] for c in choice_index[:model.n]]
    alternatives: dict[Device, float | None] = {}
    for d, dev in enumerate(devs):
        single = model.single(d)
        alternatives[dev] = None if single is None else problem.objective(single)
    pairs = [(a, b) for a in devs for b in devs if a != b]
    return AutoPlan(result, found.graph, devs, model.report_nodes(problem, choice, measurer),
                    model.report_copies(problem, choice_index), predicted,
                    alternatives, method, measurer.kernels_measured,
                    measurer.copies_measured, laps, pinned, problem,
                    {(a, b): measurer.copy_model(a, b) for a, b in pairs}, found.calibrations,
                    check)


def _one_device_graph(g: Graph, lib: Module, placement: Placement, dev: Device
                      ) -> Callable[[], Graph]:
    """The graph planned all on dev, made when called (a cached calibration never calls it)."""
    return lambda: one_device_plan(g, lib, placement, dev).graph


def small_params(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The params of at most SMALL_PARAM elements, as NumPy arrays by name."""
    found: dict[str, np.ndarray] = {}
    for name, value in params.items():
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        if array.size <= SMALL_PARAM:
            found[name] = array
    return found


def plan_on(auto: AutoPlan, device: Device, lib: Module) -> PlanResult:
    """The same graph with every node on one device (pinned outputs keep their pins)."""
    return one_device_plan(auto.graph, lib, auto.placement, device)


def one_device_plan(g: Graph, lib: Module, placement: Placement, device: Device) -> PlanResult:
    """g with every node on device; placement's output pins kept."""
    return plan_graph(g, pin_all(g, [device] * g.num_nodes, placement, device), lib,
                      strict=True)


def without_copies(g: Graph) -> Graph:
    """g with its `__copy` nodes removed, their readers reading the copied entry directly."""
    copies = [n.nid for n in g.nodes if n.func_name == COPY_OP]
    if not copies:
        return g
    source: dict[int, tuple[int, int]] = {}
    for nid in copies:
        ref = g.nodes[nid].inputs[0]
        src = (int(ref[0]), int(ref[1]))
        source[nid] = source.get(src[0], src) if src[1] == 0 and src[0] in source else src
    keep = [n.nid for n in g.nodes if n.nid not in source]
    new_nid = {old: new for new, old in enumerate(keep)}

    def ref_of(ref: Sequence[int]) -> list[int]:
        nid, index = int(ref[0]), int(ref[1])
        if nid in source:
            nid, index = source[nid]
        return [new_nid[nid], index, 0]

    nodes = []
    eids: list[int] = []
    for old in keep:
        doc = g.nodes[old]._doc()
        doc["inputs"] = [ref_of(ref) for ref in g.nodes[old].inputs]
        nodes.append(doc)
        eids.extend(g.node_entries(old))
    own = ("dltype", "shape", "storage_id", "device_index", "device_id")
    extra = {name: (tag, [values[e] for e in eids])
             for name, (tag, values) in g.attrs.items() if name not in own}
    return Graph.build(nodes, [ref_of(ref) for ref in g.heads],
                       shapes=[g.shape(e) for e in eids], dtypes=[g.dtype(e) for e in eids],
                       extra_columns=extra)


def pin_all(g: Graph, choice: Sequence[Device], placement: Placement,
             default: Device) -> Placement:
    """A Placement naming every node's chosen device, keeping the user's output pins."""
    nodes: dict[str, VirtualDevice] = {}
    for node, dev in zip(g.nodes, choice):
        key = glob_escape(node.name)
        want = VirtualDevice.from_device(dev)
        if key in nodes and nodes[key] != want:
            raise PlanError(f"node {node.nid} {node.name!r}: another node has the same name and "
                            f"was placed on {nodes[key]}, this one on {dev.spec}; the plan pins "
                            "nodes by name, so names must be unique per device")
        nodes[key] = want
    return Placement(VirtualDevice.from_device(default), nodes, {}, {},
                     dict(placement.output_devices))
