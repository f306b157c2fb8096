"""Storage planning per device: liveness-based storage id reuse, with the lower bound it is held to.

Rules: an id never spans two devices; graph inputs and outputs get ids of their own; an entry's
life runs from the node that writes it to its last reader, inclusive, so an op never writes over
its own inputs; inputs and outputs, owning their storage, count as live for the whole run in the
peak-live lower bound; a `__nop` node's outputs share storage with its inputs (it runs nothing,
so its outputs must alias what it reads).
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from ..device import Device
from ..graph.model import NOP_OP
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


def plan_storage(topo: Topology, entry_bytes: list[int],
                 entry_device: list[Device]) -> StoragePlan:
    """Assign storage ids: greedy by size (largest first, first id whose lives do not overlap)."""
    row_ptr = [0]
    for node in topo.nodes:
        row_ptr.append(row_ptr[-1] + node.num_outputs)
    num_entries = row_ptr[-1]
    last_step = len(topo.nodes)
    start = [0] * num_entries
    end = [0] * num_entries
    for nid, node in enumerate(topo.nodes):
        for eid in range(row_ptr[nid], row_ptr[nid + 1]):
            start[eid] = nid
            end[eid] = nid
    for nid, node in enumerate(topo.nodes):
        for src, index in node.inputs:
            eid = row_ptr[src] + index
            if end[eid] < nid:
                end[eid] = nid
    fixed = [False] * num_entries
    for nid, node in enumerate(topo.nodes):
        if node.is_arg:
            for eid in range(row_ptr[nid], row_ptr[nid + 1]):
                fixed[eid] = True
                start[eid] = 0
                end[eid] = last_step
    for src, index in topo.heads:
        eid = row_ptr[src] + index
        fixed[eid] = True
        # An output owns its storage for the whole run, so the lower bound counts it throughout.
        start[eid] = 0
        end[eid] = last_step

    group = _alias_groups(topo, row_ptr, num_entries)
    size: dict[int, int] = {}
    for eid in range(num_entries):
        g = group[eid]
        if g == eid:
            size[g] = entry_bytes[eid]
            continue
        size[g] = max(size[g], entry_bytes[eid])
        start[g] = min(start[g], start[eid])
        end[g] = max(end[g], end[eid])
        fixed[g] = fixed[g] or fixed[eid]
    roots = list(size)

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

    storage_ids = _renumber([sid_of[group[eid]] for eid in range(num_entries)])
    stats = _stats(roots, size, start, end, entry_device, sid_of, sid_bytes, last_step)
    return StoragePlan(storage_ids, stats)


def _alias_groups(topo: Topology, row_ptr: list[int], num_entries: int) -> list[int]:
    """Each entry's group root: a `__nop` output joins the group of the input it aliases."""
    group = list(range(num_entries))
    for nid, node in enumerate(topo.nodes):
        if node.func_name != NOP_OP:
            continue
        for k, (src, index) in enumerate(node.inputs[:node.num_outputs]):
            # Inputs come before the node, so their root is settled and smaller.
            group[row_ptr[nid] + k] = group[row_ptr[src] + index]
    return group


def _renumber(ids: list[int]) -> list[int]:
    """Number storage ids in order of first use so plans read top to bottom."""
    seen: dict[int, int] = {}
    return [seen.setdefault(sid, len(seen)) for sid in ids]


def _stats(roots: list[int], size: dict[int, int], start: list[int], end: list[int],
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
