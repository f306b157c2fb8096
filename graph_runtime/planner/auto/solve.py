"""Cost-minimising device choice: exact min cut (2 devices), exact MILP, alpha-expansion beyond.

The problem is cost_problem.CostProblem; the cuts are in graph_cut.py. The MILP models the shared
copy exactly too: x[v, d] binary; u[e, d] >= x[r, d] for every reader (a copy or the producer is on
d); z[e, s, d] >= x[p, s] + u[e, d] - 1 pays W[s, d]. u and z may stay continuous: with x integral
the minimum puts them at the max and the product. A switch term is the one-reader case: u[e, d]
is then the later kernel's x.
"""
from __future__ import annotations

import math

import numpy as np

from ...errors import PlanError
from .cost_problem import Assignment, CostProblem
from .graph_cut import alpha_expansion, min_cut_choice

MILP_NODE_LIMIT = 3000  # beyond this many variables, more than two devices use alpha-expansion


def solve_placement(problem: CostProblem, method: str = "auto",
                    milp_limit: int = MILP_NODE_LIMIT, time_limit: float = 20.0) -> Assignment:
    """The cheapest assignment: min cut for 2 devices, MILP up to milp_limit nodes, else expansion.

    Args:
        method: "auto", "min-cut", "milp" or "alpha-expansion".
        time_limit: seconds the MILP may take. A MILP stopped there is not proven optimal: the
            better of its incumbent and alpha-expansion's answer is returned, and the method
            says so ("milp (time limit) ...").
    """
    problem.check_feasible()
    k = problem.num_devices
    if method == "auto":
        if k == 1:
            method = "single"
        elif k == 2:
            method = "min-cut"
        elif len(problem.node_cost) <= milp_limit:
            method = "milp"
        else:
            method = "alpha-expansion"
    if method == "single":
        choice = [0] * len(problem.node_cost)
    elif method == "min-cut":
        if k != 2:
            raise PlanError(f"min-cut solves two devices, got {k}")
        choice = min_cut_choice(problem)
    elif method == "milp":
        found, optimal = _milp(problem, time_limit)
        if optimal and found is not None:
            choice = found
        else:
            choice = alpha_expansion(problem)
            if found is not None and problem.objective(found) <= problem.objective(choice):
                choice = found
                method = "milp (time limit, not proven optimal)"
            else:
                method = "milp (time limit), alpha-expansion's answer"
    elif method == "alpha-expansion":
        choice = alpha_expansion(problem)
    else:
        raise PlanError(f"unknown method {method!r}; methods: auto, min-cut, milp, "
                        "alpha-expansion")
    return Assignment(tuple(int(c) for c in choice), problem.objective(choice), method)


def _milp(problem: CostProblem, time_limit: float) -> tuple[list[int] | None, bool]:
    """The MILP's assignment (None if it found none in time) and whether it is proven optimal."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix
    cost = problem.node_cost
    n, k = cost.shape
    # (producer, readers, cost) per term, copies first: a switch is a copy with one reader.
    terms = [(t.producer, t.readers, t.cost) for t in problem.terms if t.readers]
    terms += [(s.before, (s.after,), s.cost) for s in problem.switches]
    pairs = [(s, d) for s in range(k) for d in range(k) if s != d]
    n_x = n * k
    n_u = len(terms) * k
    n_z = len(terms) * len(pairs)
    total = n_x + n_u + n_z
    c = np.zeros(total)
    allowed = np.isfinite(cost)
    c[:n_x] = np.where(allowed, cost, 0.0).ravel()
    upper = np.ones(total)
    upper[:n_x] = allowed.ravel().astype(float)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lower_b: list[float] = []
    upper_b: list[float] = []

    def add(entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        row = len(lower_b)
        for col, val in entries:
            rows.append(row)
            cols.append(col)
            vals.append(val)
        lower_b.append(lo)
        upper_b.append(hi)

    for v in range(n):
        add([(v * k + d, 1.0) for d in range(k)], 1.0, 1.0)
    for e, (producer, readers, w_term) in enumerate(terms):
        u0 = n_x + e * k
        z0 = n_x + n_u + e * len(pairs)
        for r in readers:
            for d in range(k):
                add([(u0 + d, 1.0), (r * k + d, -1.0)], 0.0, np.inf)
        for j, (s, d) in enumerate(pairs):
            w = float(w_term[s, d])
            if math.isinf(w):
                upper[z0 + j] = 0.0  # this copy may not happen: the bound forbids it
            else:
                c[z0 + j] = w
            add([(z0 + j, 1.0), (producer * k + s, -1.0), (u0 + d, -1.0)], -1.0, np.inf)
    a = coo_matrix((vals, (rows, cols)), shape=(len(lower_b), total)).tocsr()
    integrality = np.zeros(total)
    integrality[:n_x] = 1
    result = milp(c, integrality=integrality, bounds=Bounds(np.zeros(total), upper),
                  constraints=LinearConstraint(a, lower_b, upper_b),
                  options={"time_limit": time_limit})
    if result.x is None:
        if result.status == 1:  # time or iteration limit, no incumbent yet
            return None, False
        raise PlanError(f"the placement MILP found no solution: {result.message}")
    x = result.x[:n_x].reshape(n, k)
    return [int(np.argmax(row)) for row in x], result.status == 0
