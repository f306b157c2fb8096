"""Helpers of the automatic placement tests: brute force, random problems, a small graph."""
from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
from support import make_graph, null, tvm_op

from graph_runtime.device import Device
from graph_runtime.planner.auto.cost_problem import Assignment, CopyTerm, CostProblem

cpu0, cl0 = Device(1, 0), Device(4, 0)
EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "graphs"


def brute_force(problem: CostProblem) -> Assignment:
    """Every assignment tried (k ** n of them): the optimum the solvers are checked against."""
    n, k = problem.node_cost.shape
    best: tuple[float, tuple[int, ...]] | None = None
    for choice in itertools.product(range(k), repeat=n):
        value = problem.objective(choice)
        if best is None or value < best[0]:
            best = (value, choice)
    assert best is not None
    return Assignment(best[1], best[0], "brute-force")


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


def small_graph() -> Any:
    """x -> relu a -> (b = a * y, c = exp a) -> d = b + c -> e = tanh d."""
    return make_graph([null("x"), null("y"), tvm_op("a", "relu", [0]),
                       tvm_op("b", "multiply", [2, 1]), tvm_op("c", "exp", [2]),
                       tvm_op("d", "add", [3, 4]), tvm_op("e", "tanh", [5])], [6],
                      shapes=(64, 64))


def node_device(result: Any, name: str) -> Device:
    g = result.plan.graph
    nid = next(n.nid for n in g.nodes if n.name == name)
    return result.plan.node_devices[nid]
