"""Automatic placement of a graph with symbolic dims: measured at sample shapes, one plan for all.

Kernel times depend on shapes, so a graph whose shapes are named (`batch`, `seq`) is measured
at the sample shapes the user gives: each sample is specialised as create() would (shape rules,
runtime/specialize.py) into a static graph with the same nodes, and measured and calibrated as
any graph (place.py). One placement serves every shape the graph will run at, so the solver
minimises the sum of the samples' predicted run times; the symbolic graph is then planned with
every node pinned where that sum put it (copies and storage ids by plan_graph; create() plans
storage again per specialisation). The report gives each sample's prediction for that plan.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..._text import table
from ...device import Device
from ...graph.model import Graph, GraphSource
from ...lib.library import Module
from ..constraints import Placement
from ..plan import plan_graph
from ..result import PlanResult
from ..samples import Sample, specialise_samples
from .cost_cache import CostCache
from .cost_problem import CostProblem
from .place import (Progress, devices_of, measure_problems, pin_all, placement_of, report,
                    without_copies)
from .report import AutoPlan
from .solve import solve_placement

@dataclass
class SampledAutoPlan:
    """The symbolic graph's plan and, per sample shape, that plan's AutoPlan report there."""

    plan: PlanResult  # the symbolic graph, every node pinned
    graph: Graph  # the symbolic graph that was placed (its __copy nodes dropped)
    devices: list[Device]
    samples: list[tuple[str, AutoPlan]]  # (label such as "x=(2, 3, 6, 6)", report there)
    predicted: float  # the sum over the samples of their predicted seconds per run
    method: str
    placement: Placement = field(default_factory=Placement)  # every node pinned: the plan

    def text(self) -> str:
        """Each sample's report, then the prediction per sample and the symbolic plan."""
        lines = []
        for label, auto in self.samples:
            lines.append(f"== at {label}")
            lines.append(auto.text())
        rows = []
        for label, auto in self.samples:
            rows.append([label, f"{auto.predicted * 1e3:.3f}"]
                        + [_alt(auto.alternatives.get(d)) for d in self.devices])
        lines.append(f"one plan for {len(self.samples)} sample shapes (least summed predicted "
                     "run time)")
        lines.append(table(["sample", "auto ms", *[f"all on {d.spec} ms" for d in self.devices]],
                           rows))
        lines.append(self.plan.summary().splitlines()[0] + " (symbolic: storage is planned "
                     "again for each shape it runs at)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The report as plain data for --json."""
        nodes = [{"nid": n.nid, "name": n.name, "device": n.device.spec}
                 for n in self.samples[0][1].nodes]
        return {"devices": [d.spec for d in self.devices], "method": self.method,
                "predicted_seconds": self.predicted, "symbolic": True, "nodes": nodes,
                "samples": [{"shapes": label, **auto.to_json()} for label, auto in self.samples]}


def _alt(value: float | None) -> str:
    return "not possible" if value is None else f"{value * 1e3:.3f}"


def auto_place_symbolic(graph: GraphSource, lib: Module, devices: Sequence[Device],
                        samples: Sequence[Sample], constraints: Placement | Mapping[str, Any]
                        | None = None, budget_s: float = 60.0,
                        cache: CostCache | str | None = None, progress: Progress | None = None,
                        method: str = "auto", params: Mapping[str, Any] | None = None,
                        calibrate_devices: bool = True) -> SampledAutoPlan:
    """auto_place for a graph with symbolic dims, measured at each sample's input shapes.

    samples: one mapping per sample, input name -> shape; every input with symbolic dims
    needs its shape in each sample (static inputs and params may be left out). Refusals as
    planner/samples.specialise_samples; the rest as auto_place.
    """
    started = time.perf_counter()
    laps: dict[str, float] = {}
    devs = devices_of(devices)
    placement = placement_of(constraints)
    g = without_copies(Graph.from_json(graph))
    specialised = specialise_samples(g, lib, devs, samples)
    statics = [s.graph for s in specialised]
    measurer, found = measure_problems(statics, lib, devs, placement, budget_s, cache, progress,
                                       params, calibrate_devices, laps, started)
    solution = solve_placement(summed(f.problem for f in found), method)
    laps["solve"] = time.perf_counter() - started - sum(laps.values())
    n = found[0].model.n
    pinned = pin_all(g, [devs[c] for c in solution.choice[:n]], placement, devs[0])
    result = plan_graph(g, pinned, lib, strict=True)
    reports = []
    for sample, one in zip(specialised, found):
        planned = plan_graph(sample.graph, pinned, lib, strict=True)
        predicted = one.problem.objective(solution.choice)
        reports.append((sample.label, report(one, planned, solution.choice, predicted,
                                             solution.method, measurer, laps, pinned)))
    laps["emit"] = time.perf_counter() - started - sum(laps.values())
    return SampledAutoPlan(result, g, devs, reports, solution.objective, solution.method,
                           pinned)


def summed(problems: Any) -> CostProblem:
    """One CostProblem whose objective is the sum of the given ones' (same variables)."""
    problems = list(problems)
    first = problems[0]
    cost = np.sum([p.node_cost for p in problems], axis=0)
    return CostProblem(cost, [t for p in problems for t in p.terms], first.labels,
                       [s for p in problems for s in p.switches])
