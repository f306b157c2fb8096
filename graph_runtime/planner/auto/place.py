"""auto_place: measure, solve and emit the placement that minimises a graph's predicted run time.

How the graph becomes a CostProblem (planner/cost_problem.py):

- Existing `__copy` nodes are dropped first (readers read the copy's source): the plan decides
  its own copies, and plan_graph inserts them.
- Every node is a variable: kernels cost their measured seconds on each device; graph inputs
  and params cost nothing on any device, since set_input and load_params put them there outside
  run(). What a run pays for an input or param is the copies it needs, so an unpinned one ends
  up where its readers are (where it is first needed, or on the device that saves most copies);
  a param read on two devices pays one copy per run, as the executor really does.
- A node may only go to a device where the lib has its function, and where its user constraints
  (the Placement: node and func globs, input pins) allow: hard constraints. A pinned output is a
  reader fixed on its device; an unpinned output follows its producer and costs nothing.
- Each entry read on another device costs one copy per destination device: latency + bytes /
  bandwidth, measured per device pair.

The chosen devices go back through plan_graph with every node pinned by name, so copies,
storage and the report are the planner's own.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...device import Device
from ...errors import PlanError
from ...graph.model import COPY_OP, NOP_OP, Graph, GraphSource, entry_bytes
from ...lib.library import Module, TensorSpec
from ..constraints import Placement, glob_escape
from ..match import resolve
from ..plan import plan_graph
from ..result import PlanResult
from ..virtual_device import VirtualDevice, join
from .calibrate import calibrate, sequence_key, whole_run_seconds
from .measure_costs import (SMALL_PARAM, CostCache, KernelCase, Measurer, node_attrs_text,
                            value_digest)
from .report import AutoPlan, NodeCost, PredictedCopy
from .solve import CopyTerm, CostProblem, solve_placement

Progress = Callable[[int, str], None]  # (jobs in all, what was just measured) per step


def auto_place(graph: GraphSource, lib: Module, devices: Sequence[Device],
               constraints: Placement | Mapping[str, Any] | None = None, budget_s: float = 60.0,
               cache: CostCache | str | None = None, progress: Progress | None = None,
               method: str = "auto", params: Mapping[str, Any] | None = None,
               calibrate_devices: bool = True) -> AutoPlan:
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
    """
    started = time.perf_counter()
    laps: dict[str, float] = {}
    devs = list(dict.fromkeys(devices))
    if not devs:
        raise PlanError("auto placement needs at least one device, e.g. -d cpu -d opencl")
    if constraints is None:
        placement = Placement()
    elif isinstance(constraints, Placement):
        placement = constraints
    else:
        placement = Placement.from_dict(constraints)
    g = without_copies(Graph.from_json(graph))
    store = cache if isinstance(cache, CostCache) else CostCache.load(cache)
    measurer = Measurer(lib, store, budget_s)
    name_digest: dict[str, str] = {}
    for name, array in small_params(params or {}).items():
        name_digest[name] = value_digest(array)
        measurer.values[name_digest[name]] = array
    model = _Model(g, lib, devs, placement, name_digest)
    cases = [c for row in model.cases for c in row.values()]
    pairs = [(a, b) for a in devs for b in devs if a != b]
    laps["build"] = time.perf_counter() - started
    todo, pair_todo = measurer.missing(cases, pairs)
    total = len(todo) + len(pair_todo)
    step = None if progress is None else (lambda label: progress(total, label))
    measurer.measure(cases, pairs, step)
    laps["measure"] = time.perf_counter() - started - sum(laps.values())
    problem = model.problem(measurer)
    calibrations = []
    for d, dev in enumerate(devs):
        single = model.single(d)
        if not calibrate_devices or single is None:
            continue
        keys = [measurer.key(row[d]) for row in model.cases if d in row]
        planned = _one_device_graph(g, lib, placement, dev)
        found = calibrate(problem, d, single, model.n,
                          sequence_key(g, keys, measurer.name(dev)), store,
                          whole_run_seconds(planned, lib, devs, params), dev)
        if found is not None:
            calibrations.append(found)
    laps["calibrate"] = time.perf_counter() - started - sum(laps.values())
    solution = solve_placement(problem, method)
    laps["solve"] = time.perf_counter() - started - sum(laps.values())
    choice = [devs[c] for c in solution.choice[:model.n]]
    pinned = _pin_all(g, choice, placement, devs[0])
    result = plan_graph(g, pinned, lib, strict=True)
    laps["emit"] = time.perf_counter() - started - sum(laps.values())
    alternatives: dict[Device, float | None] = {}
    for d, dev in enumerate(devs):
        single = model.single(d)
        alternatives[dev] = None if single is None else problem.objective(single)
    return AutoPlan(result, g, devs, model.report_nodes(problem, choice, measurer),
                    model.report_copies(problem, solution.choice), solution.objective,
                    alternatives, solution.method, measurer.kernels_measured,
                    measurer.copies_measured, laps, pinned, problem,
                    {(a, b): measurer.copy_model(a, b) for a, b in pairs}, calibrations)


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
    return plan_graph(g, _pin_all(g, [device] * g.num_nodes, placement, device), lib,
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


def _pin_all(g: Graph, choice: Sequence[Device], placement: Placement,
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


class _Model:
    """The graph's variables, allowed devices and kernel cases, before costs are known."""

    def __init__(self, g: Graph, lib: Module, devs: list[Device], placement: Placement,
                 name_digest: Mapping[str, str]) -> None:
        from ..topology import topology_of
        self.g = g
        self.devs = devs
        self.n = g.num_nodes
        topo = topology_of(g)
        resolved = resolve(topo, placement)
        k = len(devs)
        self.allowed = np.ones((self.n, k), dtype=bool)
        for nid, pin in resolved.nodes.items():
            self.allowed[nid] = [join(pin.device, VirtualDevice.from_device(d)) is not None
                                 for d in devs]
            if not self.allowed[nid].any():
                raise PlanError(f"{topo.label(nid)}: pinned by "
                                + ", ".join(str(c) for c in pin.sources)
                                + "; none of the given devices ("
                                + ", ".join(d.spec for d in devs) + ") matches")
        self.head_pins: dict[int, int] = {}
        for k_head, pin in resolved.heads.items():
            fits = [i for i, d in enumerate(devs)
                    if join(pin.device, VirtualDevice.from_device(d)) is not None]
            if not fits:
                raise PlanError(f"output {k_head}: pinned by "
                                + ", ".join(str(c) for c in pin.sources)
                                + "; none of the given devices matches")
            self.head_pins[k_head] = fits[0]
        self.cases: list[dict[int, KernelCase]] = []
        for node in g.nodes:
            row: dict[int, KernelCase] = {}
            if not node.is_arg and node.func_name not in (NOP_OP, None):
                func = node.func_name
                has = [lib.has_function(func, d) for d in devs]
                if not any(has):
                    raise PlanError(f"node {node.nid} {node.name!r}: lib {lib.name!r} has no "
                                    f"{func!r} for any given device ("
                                    + ", ".join(d.spec for d in devs) + "); it exists for: "
                                    + (", ".join(lib.devices_for(func)) or "nothing"))
                self.allowed[node.nid] &= has
                if not self.allowed[node.nid].any():
                    raise PlanError(f"node {node.nid} {node.name!r}: its pin allows only devices "
                                    f"where lib {lib.name!r} has no {func!r}")
                ins = tuple(TensorSpec(tuple(g.shape(g.entry_id(r[0], r[1]))),
                                       g.dtype(g.entry_id(r[0], r[1]))) for r in node.inputs)
                outs = tuple(TensorSpec(tuple(g.shape(e)), g.dtype(e))
                             for e in g.node_entries(node.nid))
                attrs = node_attrs_text(node.attrs)
                constants = tuple((pos, name_digest[g.nodes[r[0]].name])
                                  for pos, r in enumerate(node.inputs)
                                  if g.nodes[r[0]].is_arg and g.nodes[r[0]].name in name_digest)
                for d, dev in enumerate(devs):
                    if self.allowed[node.nid, d]:
                        row[d] = KernelCase(func, dev, ins, outs, attrs, node.flatten_data,
                                            constants)
            self.cases.append(row)

    def problem(self, measurer: Measurer) -> CostProblem:
        g = self.g
        k = len(self.devs)
        n_vars = self.n + len(self.head_pins)
        cost = np.zeros((n_vars, k))
        for nid, row in enumerate(self.cases):
            for d in range(k):
                if not self.allowed[nid, d]:
                    cost[nid, d] = np.inf
                elif d in row:
                    cost[nid, d] = measurer.kernel_seconds(row[d])
        readers: dict[tuple[int, int], list[int]] = {}
        for node in g.nodes:
            for ref in node.inputs:
                readers.setdefault((int(ref[0]), int(ref[1])), []).append(node.nid)
        for j, (k_head, d) in enumerate(sorted(self.head_pins.items())):
            var = self.n + j
            cost[var] = np.inf
            cost[var, d] = 0.0
            ref = g.heads[k_head]
            readers.setdefault((int(ref[0]), int(ref[1])), []).append(var)
        models = [[measurer.copy_model(a, b) if a != b else None for b in self.devs]
                  for a in self.devs]
        terms = []
        self.term_entries: list[tuple[int, int]] = []
        for (nid, index), who in readers.items():
            eid = g.entry_id(nid, index)
            nbytes = entry_bytes(g.shape(eid), g.dtype(eid))
            w = np.zeros((k, k))
            for a in range(k):
                for b in range(k):
                    model = models[a][b]
                    if model is not None:
                        w[a, b] = model.seconds(nbytes)
            terms.append(CopyTerm(nid, tuple(dict.fromkeys(who)), w))
            self.term_entries.append((nid, index))
        # A __nop shares its input's storage (storage_plan.py), so it must stay on that device:
        # a copy between the two may not happen at all (an infinite cost).
        tie = np.full((k, k), np.inf)
        np.fill_diagonal(tie, 0.0)
        for node in g.nodes:
            if node.func_name == NOP_OP and node.inputs:
                src = (int(node.inputs[0][0]), int(node.inputs[0][1]))
                terms.append(CopyTerm(src[0], (node.nid,), tie))
                self.term_entries.append(src)
        # A kernel right after a kernel on another device pays that switch (its switch cost);
        # the executor runs nodes in graph order, so each kernel follows the one before it.
        # These terms come after every entry's (report_copies tells them apart by that).
        previous: int | None = None
        for nid, row in enumerate(self.cases):
            if not row:
                continue
            if previous is not None:
                w = np.zeros((k, k))
                for (a, b), seconds in self.switch_costs(nid, measurer).items():
                    if a in self.cases[previous]:
                        w[a, b] = seconds
                if w.any():
                    terms.append(CopyTerm(previous, (nid,), w))
            previous = nid
        labels = [f"node {n.nid} {n.name!r}" for n in g.nodes]
        labels += [f"output {k_head}" for k_head in sorted(self.head_pins)]
        return CostProblem(cost, terms, labels)

    def single(self, d: int) -> list[int] | None:
        """Everything on device d (pinned outputs stay pinned), or None where not allowed."""
        if not self.allowed[:, d].all():
            return None
        return [d] * self.n + [dev for _, dev in sorted(self.head_pins.items())]

    def switch_costs(self, nid: int, measurer: Measurer) -> dict[tuple[int, int], float]:
        """(device index before, device index of nid) -> what nid's kernel loses there."""
        return {(a, b): measurer.switch_seconds(case, before)
                for b, case in self.cases[nid].items()
                for a, before in enumerate(self.devs) if a != b}

    def report_nodes(self, problem: CostProblem, choice: list[Device], measurer: Measurer
                     ) -> list[NodeCost]:
        rows = []
        for node in self.g.nodes:
            if node.is_arg or not self.cases[node.nid]:
                continue
            seconds = {dev: (float(problem.node_cost[node.nid, d])
                             if self.allowed[node.nid, d] else None)
                       for d, dev in enumerate(self.devs)}
            after = {(self.devs[a], self.devs[b]): seconds
                     for (a, b), seconds in self.switch_costs(node.nid, measurer).items()}
            rows.append(NodeCost(node.nid, node.name, node.func_name or "", choice[node.nid],
                                 seconds, after))
        return rows

    def report_copies(self, problem: CostProblem, choice: Sequence[int]) -> list[PredictedCopy]:
        result = []
        for i, src, dst in problem.copies(choice):
            if i >= len(self.term_entries):
                continue  # a device switch between two kernels, not a copy
            nid, index = self.term_entries[i]
            eid = self.g.entry_id(nid, index)
            result.append(PredictedCopy(f"{self.g.nodes[nid].name}:{index}", self.devs[src],
                                        self.devs[dst],
                                        entry_bytes(self.g.shape(eid), self.g.dtype(eid)),
                                        float(problem.terms[i].cost[src, dst])))
        return result
