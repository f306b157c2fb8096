"""The placement cost problem: node costs per device, copy and switch terms, and its objective.

Variables are graph nodes, each taking one of k devices. A node costs `node_cost[v, d]` on device
d (infinite where it may not go: a user pin, or no kernel). Each produced entry read elsewhere is
copied once per destination device, shared by every reader there, exactly as planner/copies.py
inserts copies: a `CopyTerm` (producer p, readers R, cost matrix W) costs the sum over devices
d != x[p] with some reader on d of W[x[p], d]. A `SwitchTerm` (kernel `before`, the kernel right
after it, W) costs W[x[before], x[after]] when the two differ: the later kernel's loss after
another device's work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ...errors import PlanError


@dataclass(frozen=True)
class CopyTerm:
    """One entry: its producer, the variables reading it, cost[s, d] of a copy from s to d."""

    producer: int
    readers: tuple[int, ...]
    cost: np.ndarray  # k x k seconds, zero diagonal


@dataclass(frozen=True)
class SwitchTerm:
    """Two kernels run one after the other: cost[a, b] when `before` is on a and `after` on b."""

    before: int
    after: int
    cost: np.ndarray  # k x k seconds, zero diagonal


@dataclass
class CostProblem:
    """Per-node costs on each device (inf: not allowed), the shared-copy and the switch terms."""

    node_cost: np.ndarray  # n x k
    terms: list[CopyTerm]
    labels: Sequence[str] = ()  # node names, for messages
    switches: list[SwitchTerm] = field(default_factory=list)

    @property
    def num_devices(self) -> int:
        return int(self.node_cost.shape[1])

    def objective(self, choice: Sequence[int]) -> float:
        """Predicted seconds of one assignment: node times, one copy per (entry, device) and
        the switches."""
        x = np.asarray(choice, dtype=np.int64)
        total = float(self.node_cost[np.arange(len(x)), x].sum())
        for term in self.terms:
            src = x[term.producer]
            for dst in {int(x[r]) for r in term.readers}:
                if dst != src:
                    total += float(term.cost[src, dst])
        for switch in self.switches:
            a = x[switch.before]
            b = x[switch.after]
            if a != b:
                total += float(switch.cost[a, b])
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
class Assignment:
    """A device index per variable, its predicted objective and the method that found it."""

    choice: tuple[int, ...]
    objective: float
    method: str
