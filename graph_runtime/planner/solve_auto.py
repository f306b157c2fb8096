"""Cost-minimising device choice: exact min cut (2 devices), exact MILP, alpha-expansion beyond.

The problem (`CostProblem`): variables are graph nodes, each taking one of k devices. A node costs
`node_cost[v, d]` on device d (infinite where it may not go: a user pin, or no kernel). Each
produced entry read elsewhere is copied once per destination device, shared by every reader
there, exactly as planner/copies.py inserts copies: a `CopyTerm` (producer p, readers R, cost
matrix W) costs sum over devices d != x[p] with some reader on d of W[x[p], d]. That "any reader
on d" is not a sum of per-edge costs, so each solver models it exactly:

- min cut: per entry and direction one auxiliary node (p -> a with W[0,1], a -> r infinite for every
  reader r: the cut pays W[0,1] once when p is on the source side and any reader on the sink side;
  mirrored for W[1,0]). One reader needs no auxiliary node: the edge itself.
- MILP: x[v, d] binary; u[e, d] >= x[r, d] for every reader (a copy or the producer is on d);
  z[e, s, d] >= x[p, s] + u[e, d] - 1 pays W[s, d]. u and z may stay continuous: with x integral
  the minimum puts them at the max and the product.
- alpha-expansion: each move ("keep your device or switch to alpha") is a binary cut built from
  the same two gadgets; the one non-submodular case (moving the producer to alpha makes copies to
  a third device cheaper) is dropped from the move's model, and a move is kept only when the
  exact objective falls, so the objective never rises.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import PlanError

MILP_NODE_LIMIT = 3000  # beyond this many variables, more than two devices use alpha-expansion
_INT_SCALE = 1 << 29   # finite capacities scaled into [0, 2**29]; int32 flows stay exact


@dataclass(frozen=True)
class CopyTerm:
    """One entry: its producer, the variables reading it, cost[s, d] of a copy from s to d."""

    producer: int
    readers: tuple[int, ...]
    cost: np.ndarray  # k x k seconds, zero diagonal


@dataclass
class CostProblem:
    """Per-node costs on each device (inf: not allowed) and the shared-copy terms."""

    node_cost: np.ndarray  # n x k
    terms: list[CopyTerm]
    labels: Sequence[str] = ()  # node names, for messages

    @property
    def num_devices(self) -> int:
        return int(self.node_cost.shape[1])

    def objective(self, choice: Sequence[int]) -> float:
        """Predicted seconds of one assignment: node times plus one copy per (entry, device)."""
        x = np.asarray(choice, dtype=np.int64)
        total = float(self.node_cost[np.arange(len(x)), x].sum())
        for term in self.terms:
            src = x[term.producer]
            for dst in {int(x[r]) for r in term.readers}:
                if dst != src:
                    total += float(term.cost[src, dst])
        return total

    def copies(self, choice: Sequence[int]) -> list[tuple[int, int, int]]:
        """(term index, source device, destination device) of every copy an assignment needs."""
        result = []
        for i, term in enumerate(self.terms):
            src = int(choice[term.producer])
            for dst in sorted({int(choice[r]) for r in term.readers} - {src}):
                result.append((i, src, dst))
        return result

    def check_feasible(self) -> None:
        """PlanError naming a node that no device may take."""
        allowed = np.isfinite(self.node_cost)
        for v in np.flatnonzero(~allowed.any(axis=1)).tolist():
            name = self.labels[v] if v < len(self.labels) else f"node {v}"
            raise PlanError(f"{name}: no given device may run it (constraints and the lib's "
                            "kernels leave none)")


@dataclass(frozen=True)
class Solution:
    """A device index per variable, its predicted objective and the method that found it."""

    choice: tuple[int, ...]
    objective: float
    method: str


def solve_placement(problem: CostProblem, method: str = "auto",
                    milp_limit: int = MILP_NODE_LIMIT, time_limit: float = 20.0) -> Solution:
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
        choice = list(_binary_cut(_two_device_cut(problem)))
    elif method == "milp":
        found, optimal = _milp(problem, time_limit)
        if optimal and found is not None:
            choice = found
        else:
            choice = _expansion(problem)
            if found is not None and problem.objective(found) <= problem.objective(choice):
                choice = found
                method = "milp (time limit, not proven optimal)"
            else:
                method = "milp (time limit), alpha-expansion's answer"
    elif method == "alpha-expansion":
        choice = _expansion(problem)
    else:
        raise PlanError(f"unknown method {method!r}; methods: auto, min-cut, milp, "
                        "alpha-expansion")
    return Solution(tuple(int(c) for c in choice), problem.objective(choice), method)


# ---- binary cuts -------------------------------------------------------------------------------

class _Cut:
    """A binary energy as an s-t graph: side 0 = source side, side 1 = sink side."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = n + 2
        self.s = n
        self.t = n + 1
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.caps: list[float] = []

    def _edge(self, a: int, b: int, cap: float) -> None:
        if cap > 0:
            self.rows.append(a)
            self.cols.append(b)
            self.caps.append(cap)

    def _aux(self) -> int:
        self.count += 1
        return self.count - 1

    def unary(self, v: int, cost0: float, cost1: float) -> None:
        low = min(cost0, cost1)
        if math.isinf(low):
            raise PlanError(f"variable {v} has no finite choice")
        self._edge(self.s, v, cost1 - low)  # cut when v sits on side 1
        self._edge(v, self.t, cost0 - low)  # cut when v sits on side 0

    def producer_then_any(self, p: int, p_side: int, readers: Sequence[int], w: float) -> None:
        """w when p is on p_side and any reader is on the other side."""
        if w <= 0 or not readers:
            return
        if len(readers) == 1:
            if p_side == 0:
                self._edge(p, readers[0], w)
            else:
                self._edge(readers[0], p, w)
            return
        a = self._aux()
        if p_side == 0:
            self._edge(p, a, w)
            for r in readers:
                self._edge(a, r, math.inf)
        else:
            self._edge(a, p, w)
            for r in readers:
                self._edge(r, a, math.inf)

    def any_on(self, readers: Sequence[int], side: int, w: float) -> None:
        """w when any reader is on side."""
        if w <= 0 or not readers:
            return
        a = self._aux()
        if side == 0:
            for r in readers:
                self._edge(r, a, math.inf)
            self._edge(a, self.t, w)
        else:
            self._edge(self.s, a, w)
            for r in readers:
                self._edge(a, r, math.inf)


def _binary_cut(cut: _Cut) -> np.ndarray:
    """The side (0/1) of each of the cut's first n nodes in a minimum s-t cut."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow
    caps = np.asarray(cut.caps, dtype=np.float64)
    finite = np.isfinite(caps)
    total = float(caps[finite].sum())
    scale = _INT_SCALE / total if total > 0 else 1.0
    # Rounding is up to half a unit per edge, which the exact float objective then judges.
    ints = np.where(finite, np.rint(np.where(finite, caps, 0.0) * scale), _INT_SCALE + 1)
    summed = csr_matrix((ints.astype(np.int64), (cut.rows, cut.cols)),
                        shape=(cut.count, cut.count))
    summed.sum_duplicates()
    summed.data = np.minimum(summed.data, _INT_SCALE + 1)
    capacity = summed.astype(np.int32)
    result = maximum_flow(capacity, cut.s, cut.t)
    residual = (capacity - result.flow).tocsr()
    residual.data = np.where(residual.data > 0, 1, 0).astype(np.int32)
    residual.eliminate_zeros()
    # The smallest sink side: nodes that still reach t in the residual graph. Ties then go to
    # side 0, the first device given (the default device).
    reaching = breadth_first_order(residual.T.tocsr(), cut.t, directed=True,
                                   return_predecessors=False)
    side = np.zeros(cut.count, dtype=np.int64)
    side[reaching] = 1
    return side[:cut.n]


def _two_device_cut(problem: CostProblem) -> _Cut:
    cut = _Cut(len(problem.node_cost))
    for v, (c0, c1) in enumerate(problem.node_cost):
        cut.unary(v, float(c0), float(c1))
    for term in problem.terms:
        readers = [r for r in term.readers if r != term.producer]
        cut.producer_then_any(term.producer, 0, readers, float(term.cost[0, 1]))
        cut.producer_then_any(term.producer, 1, readers, float(term.cost[1, 0]))
    return cut


# ---- MILP --------------------------------------------------------------------------------------

def _milp(problem: CostProblem, time_limit: float) -> tuple[list[int] | None, bool]:
    """The MILP's assignment (None if it found none in time) and whether it is proven optimal."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix
    cost = problem.node_cost
    n, k = cost.shape
    terms = [t for t in problem.terms if t.readers]
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
    for e, term in enumerate(terms):
        u0 = n_x + e * k
        z0 = n_x + n_u + e * len(pairs)
        for r in term.readers:
            for d in range(k):
                add([(u0 + d, 1.0), (r * k + d, -1.0)], 0.0, np.inf)
        for j, (s, d) in enumerate(pairs):
            w = float(term.cost[s, d])
            if math.isinf(w):
                upper[z0 + j] = 0.0  # this copy may not happen: the bound forbids it
            else:
                c[z0 + j] = w
            add([(z0 + j, 1.0), (term.producer * k + s, -1.0), (u0 + d, -1.0)], -1.0, np.inf)
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


# ---- alpha-expansion ---------------------------------------------------------------------------

def _expansion(problem: CostProblem, sweeps: int = 6) -> list[int]:
    cost = problem.node_cost
    k = problem.num_devices
    choice = list(_start(problem))
    best = problem.objective(choice)
    for _ in range(sweeps):
        improved = False
        for alpha in range(k):
            moved = _expansion_move(problem, choice, alpha)
            value = problem.objective(moved)
            if value < best - 1e-12 * max(1.0, abs(best)):
                choice, best, improved = moved, value, True
        if not improved:
            break
    assert all(math.isfinite(cost[v, d]) for v, d in enumerate(choice))
    return choice


def _start(problem: CostProblem) -> list[int]:
    """The best of: every node on its own cheapest device, or each one-device plan that is legal."""
    cost = problem.node_cost
    candidates = [list(np.argmin(cost, axis=1))]
    allowed = np.isfinite(cost)
    for d in range(problem.num_devices):
        candidates.append([d if allowed[v, d] else int(np.argmin(cost[v]))
                           for v in range(len(cost))])
    return min(candidates, key=problem.objective)


def _expansion_move(problem: CostProblem, choice: list[int], alpha: int) -> list[int]:
    """One move: side 1 = switch to alpha, side 0 = keep the current device."""
    cost = problem.node_cost
    cut = _Cut(len(cost))
    for v, d in enumerate(choice):
        if d == alpha:
            cut.unary(v, math.inf, 0.0)
        elif not math.isfinite(cost[v, alpha]):
            cut.unary(v, 0.0, math.inf)
        else:
            cut.unary(v, float(cost[v, d]), float(cost[v, alpha]))
    for term in problem.terms:
        p = term.producer
        a = choice[p]
        w = term.cost
        readers = [r for r in term.readers if r != p]
        groups: dict[int, list[int]] = {}
        for r in readers:
            if choice[r] != alpha:
                groups.setdefault(choice[r], []).append(r)
        if a == alpha:
            for d, group in groups.items():
                cut.producer_then_any(p, 1, group, float(w[alpha, d]))
            continue
        cut.producer_then_any(p, 0, readers, float(w[a, alpha]))
        for d, group in groups.items():
            if d == a:
                cut.producer_then_any(p, 1, group, float(w[alpha, a]))
                continue
            cut.any_on(group, 0, float(w[a, d]))
            # Positive: moving p to alpha makes these copies dearer (submodular). Negative: the
            # one case a cut cannot model; dropped, and the move judged by the exact objective.
            if math.isinf(w[alpha, d]):
                cut.producer_then_any(p, 1, group, math.inf)
            elif math.isfinite(w[a, d]):
                cut.producer_then_any(p, 1, group, float(w[alpha, d] - w[a, d]))
    side = _binary_cut(cut)
    return [alpha if side[v] else d for v, d in enumerate(choice)]


def brute_force(problem: CostProblem) -> Solution:
    """Every assignment tried (tests only: k ** n of them)."""
    n, k = problem.node_cost.shape
    best: tuple[float, tuple[int, ...]] | None = None
    for choice in itertools.product(range(k), repeat=n):
        value = problem.objective(choice)
        if best is None or value < best[0]:
            best = (value, choice)
    assert best is not None
    return Solution(best[1], best[0], "brute-force")
