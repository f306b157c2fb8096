"""CostModel: a graph as a placement CostProblem, before and after its costs are measured.

- Every node is a variable: kernels cost their measured seconds on each device; graph inputs
  and params cost nothing on any device, since set_input and load_params put them there outside
  run(). What a run pays for an input or param is the copies it needs, so an unpinned one ends
  up where its readers are (where it is first needed, or on the device that saves most copies);
  a param read on two devices pays one copy per run, as the executor really does.
- A node may only go to a device where the lib has its function, and where its user constraints
  (the Placement: node and func globs, input pins) allow: hard constraints. A pinned output is a
  reader fixed on its device; an unpinned output follows its producer and costs nothing.
- Each entry read on another device costs one copy per destination device: latency + bytes /
  bandwidth, measured per device pair (a CopyTerm).
- A kernel right after a kernel on another device pays that switch (a SwitchTerm).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ...device import Device
from ...errors import PlanError
from ...graph.model import NOP_OP, Graph, entry_bytes
from ...lib.library import Module, TensorSpec
from ..constraints import Placement
from ..match import resolve
from ...graph.topology import topology_of
from ..virtual_device import VirtualDevice, join
from .cost_cache import KernelCase, node_attrs_text
from .cost_problem import CopyTerm, CostProblem, SwitchTerm
from .measure_costs import Measurer
from .report import NodeCost, PredictedCopy


class CostModel:
    """The graph's variables, allowed devices and kernel cases; its CostProblem once measured."""

    def __init__(self, g: Graph, lib: Module, devs: list[Device], placement: Placement,
                 name_digest: Mapping[str, str]) -> None:
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
        """Node costs, a CopyTerm per read entry (and per __nop) and the SwitchTerms, measured."""
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
        switches = []
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
                    switches.append(SwitchTerm(previous, nid, w))
            previous = nid
        labels = [f"node {n.nid} {n.name!r}" for n in g.nodes]
        labels += [f"output {k_head}" for k_head in sorted(self.head_pins)]
        return CostProblem(cost, terms, labels, switches)

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
        """Each kernel's seconds on every device and after every switch, for the report."""
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
        """The copies an assignment needs, by entry (problem.terms align with term_entries)."""
        result = []
        for i, src, dst in problem.copies(choice):
            nid, index = self.term_entries[i]
            eid = self.g.entry_id(nid, index)
            result.append(PredictedCopy(f"{self.g.nodes[nid].name}:{index}", self.devs[src],
                                        self.devs[dst],
                                        entry_bytes(self.g.shape(eid), self.g.dtype(eid)),
                                        float(problem.terms[i].cost[src, dst])))
        return result
