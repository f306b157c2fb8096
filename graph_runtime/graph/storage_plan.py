"""Storage planning per device: liveness-based storage id reuse, with the lower bound it is held to.

Rules: an id never spans two devices; graph inputs and outputs get ids of their own; lives and
alias groups are graph/liveness.py's (a value lives from its writer to its last reader, inclusive,
so an op never writes over its own inputs; a `__nop` node's outputs alias its inputs, as it runs
nothing); inputs and outputs, owning their storage, count as live for the whole run in the
peak-live lower bound.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from ..device import Device
from .liveness import liveness
from .model import Graph
from .topology import Topology


@dataclass(frozen=True)
class PoolStats:
    """Pool bytes on one device: no sharing, planned, and the peak-live lower bound."""

    no_sharing: int
    planned: int
    lower_bound: int


@dataclass(frozen=True)
class StoragePlan:
    """A storage id per entry and the pool statistics per device."""

    storage_ids: list[int]
    stats: dict[Device, PoolStats]


def plan_storage(topo: Topology | Graph, entry_bytes: list[int],
                 entry_device: list[Device]) -> StoragePlan:
    """Assign storage ids: greedy by size (largest first, first id whose lives do not overlap).

    A Graph's own storage_id column is ignored: this plans it.
    """
    live = liveness(topo.nodes, topo.heads)
    last_step = live.num_nodes
    roots = live.roots
    size = dict.fromkeys(roots, 0)
    for eid, root in enumerate(live.group):
        size[root] = max(size[root], entry_bytes[eid])
    # An input or output owns its storage for the whole run, so the lower bound counts it
    # throughout.
    fixed = {g: live.held(g) for g in roots}
    start = {g: 0 if fixed[g] else live.start[g] for g in roots}
    end = {g: last_step if fixed[g] else live.end[g] for g in roots}

    sid_of: dict[int, int] = {}
    sid_bytes: list[int] = []
    # Per device: the storage ids there, each with its occupied lives sorted by start.
    slots: dict[Device, list[tuple[int, list[int], list[int]]]] = {}
    for g in sorted(roots, key=lambda r: (fixed[r] is False, -size[r], start[r], r)):
        if fixed[g]:
            sid_of[g] = len(sid_bytes)
            sid_bytes.append(size[g])
            continue
        chosen = None
        for sid, starts, ends in slots.setdefault(entry_device[g], []):
            i = bisect_right(starts, end[g])
            if i == 0 or ends[i - 1] < start[g]:
                starts.insert(i, start[g])
                ends.insert(i, end[g])
                chosen = sid
                break
        if chosen is None:
            chosen = len(sid_bytes)
            sid_bytes.append(size[g])
            slots[entry_device[g]].append((chosen, [start[g]], [end[g]]))
        sid_of[g] = chosen

    storage_ids = _renumber([sid_of[root] for root in live.group])
    stats = _stats(roots, size, start, end, entry_device, sid_of, sid_bytes, last_step)
    return StoragePlan(storage_ids, stats)


def _renumber(ids: list[int]) -> list[int]:
    """Number storage ids in order of first use so plans read top to bottom."""
    seen: dict[int, int] = {}
    return [seen.setdefault(sid, len(seen)) for sid in ids]


def _stats(roots: list[int], size: dict[int, int], start: dict[int, int], end: dict[int, int],
           entry_device: list[Device], sid_of: dict[int, int], sid_bytes: list[int],
           last_step: int) -> dict[Device, PoolStats]:
    """Per device: bytes with no sharing, as planned, and the peak of live bytes over steps."""
    no_sharing: dict[Device, int] = {}
    planned: dict[Device, int] = {}
    delta: dict[Device, list[int]] = {}
    for g in roots:
        dev = entry_device[g]
        no_sharing[dev] = no_sharing.get(dev, 0) + size[g]
        steps = delta.get(dev)
        if steps is None:
            steps = delta[dev] = [0] * (last_step + 2)
        steps[start[g]] += size[g]
        steps[end[g] + 1] -= size[g]
    counted: set[int] = set()
    for g in roots:
        sid = sid_of[g]
        if sid not in counted:
            counted.add(sid)
            dev = entry_device[g]
            planned[dev] = planned.get(dev, 0) + sid_bytes[sid]
    stats = {}
    for dev, steps in delta.items():
        live = 0
        peak = 0
        for change in steps:
            live += change
            peak = max(peak, live)
        stats[dev] = PoolStats(no_sharing[dev], planned[dev], peak)
    return dict(sorted(stats.items()))
