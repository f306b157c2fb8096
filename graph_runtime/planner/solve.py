"""Solving device constraints over a graph: union-find with join (rules 2-6 of the planner)."""
from __future__ import annotations

from dataclasses import dataclass

from ..device import Device
from .match import Resolved
from ..graph.topology import Topology
from .virtual_device import VirtualDevice, default, join


class DeviceUnion:
    """Union-find whose classes carry the join of their members' devices."""

    def __init__(self, devices: list[VirtualDevice]) -> None:
        self.parent = list(range(len(devices)))
        self.device = list(devices)

    def find(self, x: int) -> int:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: int, b: int) -> bool:
        """Merge the classes of a and b; False (and no change) when their devices do not join."""
        ra = self.find(a)
        rb = self.find(b)
        if ra == rb:
            return True
        joined = join(self.device[ra], self.device[rb])
        if joined is None:
            return False
        # The smaller id stays root so results do not depend on union order details.
        if rb < ra:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.device[ra] = joined
        return True


@dataclass(frozen=True)
class Solution:
    """Each node's device and where each head must be delivered; copies are inserted later."""

    node_device: list[Device]
    head_device: list[Device]


def solve(topo: Topology, resolved: Resolved, default_device: VirtualDevice) -> Solution:
    """Place every node: ties along edges out of free nodes, constraints, then the default.

    Phase 1 ties free producers to constrained consumers (then to pinned outputs) in node order,
    so a producer shared by consumers fixed to different devices goes with the first of them
    (rule 3). Phase 2 ties the remaining edges between free nodes in node order. A tie that
    cannot join is cut: its edge gets a copy instead of an error.
    """
    n = len(topo.nodes)
    pinned = resolved.nodes
    devices = [pinned[nid].device if nid in pinned else VirtualDevice() for nid in range(n)]
    heads = sorted(resolved.heads)
    devices += [resolved.heads[k].device for k in heads]
    head_elem = {k: n + i for i, k in enumerate(heads)}
    uf = DeviceUnion(devices)

    def tie(producer: int, elem: int) -> None:
        # A tie that cannot join leaves the two apart; insert_copies puts a copy on that edge.
        if producer not in pinned:
            uf.union(producer, elem)

    for nid, node in enumerate(topo.nodes):
        if nid in pinned and not node.is_copy:
            for src, _ in node.inputs:
                tie(src, nid)
    for k in heads:
        tie(topo.heads[k][0], head_elem[k])
    for nid, node in enumerate(topo.nodes):
        if nid not in pinned and not node.is_copy:
            for src, _ in node.inputs:
                tie(src, nid)

    final: dict[int, Device] = {}

    def device_of(elem: int) -> Device:
        root = uf.find(elem)
        dev = final.get(root)
        if dev is None:
            dev = settle(uf.device[root], default_device)
            final[root] = dev
        return dev

    node_device = [device_of(nid) for nid in range(n)]
    head_device = [device_of(head_elem[k]) if k in head_elem else node_device[nid]
                   for k, (nid, _) in enumerate(topo.heads)]
    return Solution(node_device, head_device)


def settle(dev: VirtualDevice, default_device: VirtualDevice) -> Device:
    """Rule 6: default(dev, default_device) field by field; an id still unset becomes 0."""
    full = default(dev, default_device)
    assert full.device_type is not None  # Placement requires the default to name a type
    return Device(full.device_type, full.virtual_device_id or 0)
