"""Binary graph cuts for placement: the exact two-device minimum cut and alpha-expansion moves.

The shared copy ("any reader on d" pays one copy) is not a sum of per-edge costs. Per entry and
direction one auxiliary node models it exactly: p -> a with W[0,1], a -> r infinite for every
reader r, so the cut pays W[0,1] once when p is on the source side and any reader on the sink side
(mirrored for W[1,0]); one reader needs no auxiliary node. A device switch between two kernels is
that one-reader gadget, the earlier kernel in the producer's place. An alpha-expansion move
("keep your device or switch to alpha") is a binary cut built from the same gadgets; the one
non-submodular case (moving the producer to alpha makes copies to a third device cheaper) is
dropped from the move's model, and a move is kept only when the exact objective falls.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ...errors import PlanError
from .cost_problem import CostProblem

_INT_SCALE = 1 << 29   # finite capacities scaled into [0, 2**29]; int32 flows stay exact


def min_cut_choice(problem: CostProblem) -> list[int]:
    """The exact optimum of a two-device problem (device index per variable)."""
    return [int(side) for side in _binary_cut(_two_device_cut(problem))]


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
    for switch in problem.switches:
        cut.producer_then_any(switch.before, 0, [switch.after], float(switch.cost[0, 1]))
        cut.producer_then_any(switch.before, 1, [switch.after], float(switch.cost[1, 0]))
    return cut


def alpha_expansion(problem: CostProblem, sweeps: int = 6) -> list[int]:
    """A good assignment for any number of devices: expansion moves until none improves."""
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
        _copy_move(cut, choice, alpha, term.producer,
                   [r for r in term.readers if r != term.producer], term.cost)
    for switch in problem.switches:
        _copy_move(cut, choice, alpha, switch.before, [switch.after], switch.cost)
    side = _binary_cut(cut)
    return [alpha if side[v] else d for v, d in enumerate(choice)]


def _copy_move(cut: _Cut, choice: list[int], alpha: int, p: int, readers: list[int],
               w: np.ndarray) -> None:
    """The move's cost of a copy from p to any of readers on another device (w[s, d])."""
    a = choice[p]
    groups: dict[int, list[int]] = {}
    for r in readers:
        if choice[r] != alpha:
            groups.setdefault(choice[r], []).append(r)
    if a == alpha:
        for d, group in groups.items():
            cut.producer_then_any(p, 1, group, float(w[alpha, d]))
        return
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
