"""Copy insertion: one `__copy` per (producer entry, destination device), shared by its readers."""
from __future__ import annotations

from dataclasses import dataclass

from ..device import Device
from ..graph.model import COPY_OP
from ..graph.topology import PlanNode, Topology


@dataclass(frozen=True)
class CopyNode:
    """One inserted copy: the entry it reads (old numbering), where it delivers, its new node id."""

    src: tuple[int, int]
    src_device: Device
    dst_device: Device
    name: str
    nid: int


@dataclass(frozen=True)
class Rewritten:
    """The topology with copies, each new node's device, and where each new node came from."""

    topo: Topology
    node_device: list[Device]
    new_nid: list[int]               # old nid -> new nid
    # new nid -> (old nid, -1) for a kept node, or the (nid, index) a copy reads
    origin: list[tuple[int, int]]
    copies: list[CopyNode]


def insert_copies(topo: Topology, node_device: list[Device],
                  head_device: list[Device]) -> Rewritten:
    """Add a copy wherever a reader's device differs from the device of the entry it reads.

    The planner writes real `__copy` nodes into a new graph (users see and keep them). The
    executor's runtime.placement.missing_copies is the other mechanism, on purpose: TVM's
    runtime accepts a graph whose writer left a cross-device read without a copy, so create()
    must add a buffer and a copy step without rewriting the user's graph.

    A copy sits right before its first reader in node order (right after its producer when only
    outputs read it), so the order stays topological and the copied buffer lives briefly.
    Readers that are `__copy` nodes read across devices by design and get no copy.
    """
    # Devices as small ints: comparing and hashing those is what this loop does most.
    number: dict[Device, int] = {}
    dev_no = [number.setdefault(dev, len(number)) for dev in node_device]
    head_no = [number.setdefault(dev, len(number)) for dev in head_device]
    by_no = list(number)
    first_reader: dict[tuple[int, int, int], int] = {}
    for nid, node in enumerate(topo.nodes):
        if node.is_copy:
            continue
        here = dev_no[nid]
        for src, index in node.inputs:
            if dev_no[src] != here:
                first_reader.setdefault((src, index, here), nid)
    for k, (src, index) in enumerate(topo.heads):
        if dev_no[src] != head_no[k]:
            first_reader.setdefault((src, index, head_no[k]), -1 - src)
    before: dict[int, list[tuple[int, int, int]]] = {}
    after: dict[int, list[tuple[int, int, int]]] = {}
    for key, reader in first_reader.items():
        if reader >= 0:
            before.setdefault(reader, []).append(key)
        else:
            after.setdefault(-1 - reader, []).append(key)

    names = {node.name for node in topo.nodes}
    new_nodes: list[PlanNode] = []
    devices: list[Device] = []
    origin: list[tuple[int, int]] = []
    new_nid = [0] * len(topo.nodes)
    copy_nid: dict[tuple[int, int, int], int] = {}
    copies: list[CopyNode] = []

    def emit_copy(key: tuple[int, int, int]) -> None:
        src, index, dst_no = key
        dst = by_no[dst_no]
        name = _unique(_copy_name(topo.nodes[src], index, dst), names)
        copy_nid[key] = len(new_nodes)
        copies.append(CopyNode((src, index), node_device[src], dst, name, len(new_nodes)))
        new_nodes.append(PlanNode(name, "tvm_op", COPY_OP, ((new_nid[src], index),), 1))
        devices.append(dst)
        origin.append((src, index))

    def read(src: int, index: int, dst_no: int) -> tuple[int, int]:
        found = copy_nid.get((src, index, dst_no)) if dev_no[src] != dst_no else None
        if found is not None:
            return (found, 0)
        return (new_nid[src], index)

    for nid, node in enumerate(topo.nodes):
        for key in before.get(nid, ()):
            emit_copy(key)
        new_nid[nid] = len(new_nodes)
        if node.is_copy:
            inputs = tuple((new_nid[s], i) for s, i in node.inputs)
        else:
            inputs = tuple(read(s, i, dev_no[nid]) for s, i in node.inputs)
        new_nodes.append(PlanNode(node.name, node.op, node.func_name, inputs, node.num_outputs))
        devices.append(node_device[nid])
        origin.append((nid, -1))
        for key in after.get(nid, ()):
            emit_copy(key)
    heads = tuple(read(src, index, head_no[k]) for k, (src, index) in enumerate(topo.heads))
    return Rewritten(Topology(tuple(new_nodes), heads), devices, new_nid, origin, copies)


def _copy_name(producer: PlanNode, index: int, dst: Device) -> str:
    suffix = f"_{index}" if index else ""
    return f"copy_{producer.name}{suffix}_to_{dst.kind}{dst.device_id}"


def _unique(name: str, taken: set[str]) -> str:
    candidate = name
    k = 2
    while candidate in taken:
        candidate = f"{name}_{k}"
        k += 1
    taken.add(candidate)
    return candidate
