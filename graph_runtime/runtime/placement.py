"""Placement: which device each entry and node lives on, and the copies create() must add."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .._text import count_of
from ..device import Device
from ..errors import GraphError
from ..graph.model import COPY_OP, NOP_OP, Graph, entry_bytes
from .storage_check import check_liveness
from .storage import PoolLayout, layout_pool

log = logging.getLogger("graph_runtime")


@dataclass(frozen=True)
class InsertedCopy:
    """A copy the executor added because a node read an entry living on another device."""

    eid: int
    producer: str
    src: Device
    dst: Device
    nbytes: int
    readers: tuple[str, ...]


def resolve_entry_devices(graph: Graph, ctxs: Sequence[Device], strict: bool) -> list[Device]:
    """Map each entry's device_index (a DLPack type code) to a context; TVM's ctxs[0] fallback."""
    codes = graph.column("device_index")
    ids = graph.column("device_id")
    if codes is None:
        return [ctxs[0]] * graph.num_entries
    devices: list[Device] = []
    unmatched: dict[tuple[int, int | None], list[int]] = {}
    for eid in range(graph.num_entries):
        code = codes[eid]
        want = ids[eid] if ids is not None else None
        match = next((c for c in ctxs if c.device_type == code
                      and (want is None or c.device_id == want)), None)
        if match is None:
            unmatched.setdefault((code, want), []).append(eid)
            match = next((c for c in ctxs if c.device_type == code), ctxs[0])
        devices.append(match)
    for (code, want), eids in unmatched.items():
        wanted = Device(code, want or 0) if want is not None else Device(code, 0).kind
        given = ", ".join(map(str, ctxs))
        if strict:
            nodes = sorted({owner_label(graph, e) for e in eids})
            shown = ", ".join(nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8
                                            else "")
            raise GraphError(f"{graph.source}: device_index asks for {wanted} for "
                             f"{count_of(len(eids), 'entry', 'entries')} ({shown}) but ctxs are "
                             f"{given}; add that device to ctxs, or pass strict=False to fall "
                             "back to ctxs[0]")
        # NOTE: short and once per process: create() in a loop must not repeat 400 characters.
        message = (f"{graph.source}: device_index asks for {wanted}, not in ctxs ({given}); "
                   f"{count_of(len(eids), 'entry', 'entries')} run on {devices[eids[0]]}")
        if message not in _warned:
            _warned.add(message)
            log.warning("%s", message)
    return devices


_warned: set[str] = set()  # fallback warnings already given in this process


def plan_placement(graph: Graph, entry_device: Sequence[Device], fallback: Device, strict: bool
                   ) -> tuple[list[Device], list[InsertedCopy], PoolLayout]:
    """Each node's device, the copies to insert and the storage plan counting their buffers.

    What create() sets up, computed without allocating (`graphrun info` shows it too).
    fallback: the device of a node without outputs (ctxs[0]).
    """
    node_device = _node_devices(graph, entry_device, fallback)
    plan = layout_pool(graph, entry_device)
    check_liveness(graph)
    copies = missing_copies(graph, entry_device, node_device, strict)
    for c in copies:
        plan.extra_bytes[c.dst] = plan.extra_bytes.get(c.dst, 0) + c.nbytes
    return node_device, copies, plan


def replan_placement(graph: Graph, entry_device: Sequence[Device], node_device: list[Device],
                     copies: Sequence[InsertedCopy], checked: object = None
                     ) -> tuple[list[InsertedCopy], PoolLayout]:
    """plan_placement's copies and storage plan for another specialisation of a symbolic graph
    whose node devices and copies were planned (they follow the entries' devices, which no
    shape changes): only the copies' bytes and the storage plan are its own. The storage ids
    are checked unless they are the list checked (the specialiser keeps the first shape's)."""
    plan = layout_pool(graph, entry_device)
    if graph.attrs["storage_id"][1] is not checked:
        check_liveness(graph)
    mine = [replace(c, nbytes=entry_bytes(graph.shape(c.eid), graph.dtype(c.eid)))
            for c in copies]
    for c in mine:
        plan.extra_bytes[c.dst] = plan.extra_bytes.get(c.dst, 0) + c.nbytes
    return mine, plan


def _node_devices(graph: Graph, entry_device: Sequence[Device], fallback: Device) -> list[Device]:
    result: list[Device] = []
    for node in graph.nodes:
        eids = graph.node_entries(node.nid)
        devs = {entry_device[e] for e in eids}
        if len(devs) > 1:
            where = ", ".join(f"eid {e} on {entry_device[e]}" for e in eids)
            raise GraphError(f"{graph.source}: {node.label} has outputs on several devices "
                             f"({where}); a node runs on one device")
        result.append(devs.pop() if devs else fallback)
    return result


def missing_copies(graph: Graph, entry_device: Sequence[Device], node_device: Sequence[Device],
                    strict: bool) -> list[InsertedCopy]:
    """One copy per (entry, device) a kernel reads across devices without a __copy node.

    The planner (planner/copies.py) writes real __copy nodes into a new graph; this is the
    runtime's counterpart for a graph that arrives without them, as TVM's runtime accepts: a
    buffer and a copy step, with the user's graph left as it is.
    """
    found: dict[tuple[int, Device], list[str]] = {}
    for node in graph.nodes:
        if node.is_arg or node.func_name in (COPY_OP, NOP_OP):
            continue
        dst = node_device[node.nid]
        for pos, ref in enumerate(node.inputs):
            eid = graph.entry_id(ref[0], ref[1])
            src = entry_device[eid]
            if src == dst:
                continue
            if strict:
                raise GraphError(
                    f"{graph.source}: {node.label} on {dst} reads input {pos}, entry "
                    f"{ref[0]}:{ref[1]} (eid {eid}), which lives on {src}, with no __copy "
                    "node between them; add one, or pass strict=False to let the executor "
                    "insert it")
            found.setdefault((eid, dst), []).append(node.label)
    return [InsertedCopy(eid, owner_label(graph, eid), entry_device[eid], dst,
                         entry_bytes(graph.shape(eid), graph.dtype(eid)), tuple(readers))
            for (eid, dst), readers in found.items()]


def owner_label(graph: Graph, eid: int) -> str:
    return graph.nodes[graph.entry_node(eid)[0]].label
