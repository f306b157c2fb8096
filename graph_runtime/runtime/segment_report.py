"""The whole-graph view of a segmented module's executors, for the reports GraphModule gives
(`graphrun run`'s placement and copies, `graphrun profile`'s kernel notes)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..device import Device, cpu
from ..graph.model import Graph
from .segments import Cut, Segment


@dataclass
class PoolTotals:
    """Pool bytes per device summed over the segments' current specialisations."""

    pools: list[Any] = field(default_factory=list)

    def bytes_per_device(self) -> dict[Device, int]:
        return _sum(p.bytes_per_device() for p in self.pools)

    def unshared_bytes_per_device(self) -> dict[Device, int]:
        return _sum(p.unshared_bytes_per_device() for p in self.pools)


@dataclass
class SegmentsView:
    """What reports read of an Executor (graph, entry_device, node_device, copies, plan, steps),
    in whole-graph ids; cuts run on the host."""

    graph: Graph
    entry_device: list[Device]
    node_device: list[Device]
    copies: list[Any]
    plan: PoolTotals
    steps: list[Any]


@dataclass(frozen=True)
class _Step:
    nid: int
    kernel: Any


def segments_view(graph: Graph, entry_device: Sequence[Device], segments: Sequence[Any],
                  modules: Sequence[Any], cuts: Sequence[Cut]) -> SegmentsView:
    """The view for the segments' executors as they are now (after a run)."""
    node_device = [entry_device[graph.node_row_ptr[n.nid]] if graph.node_entries(n.nid)
                   else entry_device[0] for n in graph.nodes]
    for cut in cuts:
        node_device[cut.nid] = cpu(0)
    copies: list[Any] = []
    pools = PoolTotals()
    steps: list[Any] = []
    for seg, module in zip(segments, modules):
        if seg is None:
            continue
        ex = module.executor
        pools.pools.append(ex.plan)
        for nid, dev in enumerate(ex.node_device):
            if not seg.graph.nodes[nid].is_arg:
                node_device[_whole(seg, nid)] = dev
        copies += [dataclasses.replace(c, eid=seg.eids[c.eid]) for c in ex.copies]
        steps += [_Step(_whole(seg, s.nid), s.kernel) for s in ex.steps]
    return SegmentsView(graph, list(entry_device), node_device, copies, pools, steps)


def _whole(seg: Segment, nid: int) -> int:
    return seg.nids[nid] if 0 <= nid < len(seg.nids) else -1


def _sum(parts: Any) -> dict[Device, int]:
    total: dict[Device, int] = {}
    for part in parts:
        for dev, n in part.items():
            total[dev] = total.get(dev, 0) + n
    return total
