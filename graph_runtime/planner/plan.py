"""plan_graph: solve a placement over a graph, write the planned graph (rules 1-9) and a report."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

from ..device import Device
from ..errors import PlanError
from ..graph.model import COPY_OP, NOP_OP, Graph, GraphSource, entry_bytes
from ..graph.symbolic import shape_is_symbolic
from ..lib.library import Module
from .constraints import Placement
from .copies import Rewritten, insert_copies
from .match import resolve
from .result import CopyReport, Fallback, PlanResult, PoolReport
from .solve import settle
from .solve import solve as solve_devices
from ..graph.storage_plan import PoolStats, plan_storage
from ..graph.topology import Topology, topology_of
from .virtual_device import VirtualDevice

_OWN_COLUMNS = ("dltype", "shape", "storage_id", "device_index", "device_id")


def plan_graph(graph: GraphSource, placement: Placement | Mapping[str, Any] | None = None,
               lib: Module | None = None, strict: bool = False) -> PlanResult:
    """Place every node of graph, insert copies and re-plan storage ids per device.

    Args:
        graph: a Graph, or anything Graph.from_json reads (path, JSON text, dict).
        placement: a Placement, its JSON form as a dict, or None (everything on cpu:0).
        lib: when given, a node whose function lib lacks on its planned device falls back to
            the default device (rule 8), or raises PlanError with strict=True.
    Raises:
        PlanError: constraints that name one node or output conflict, a pattern matches
            nothing, or lib lacks a function where the plan needs it.
    """
    clock = _Clock()
    g = Graph.from_json(graph)
    if placement is None:
        placement = Placement()
    elif not isinstance(placement, Placement):
        placement = Placement.from_dict(placement)
    topo = topology_of(g)
    solution = solve_devices(topo, resolve(topo, placement), placement.default_device)
    node_device = list(solution.node_device)
    fallbacks: list[Fallback] = []
    if lib is not None:
        fallback_device = settle(VirtualDevice(), placement.default_device)
        fallbacks = _fall_back(topo, node_device, lib, fallback_device, strict)
    clock.lap("solve")
    rw = insert_copies(topo, node_device, solution.head_device)
    clock.lap("copies")
    old_eids = _entry_origins(g, rw)
    shapes_col = g.attrs["shape"][1]
    dtypes_col = g.attrs["dltype"][1]
    # NOTE: a symbolic entry (docs/symbolic_shapes.md) counts 0 bytes: create() plans storage
    # again for each specialisation, so the ids planned here only have to be valid.
    old_sizes = [0 if shape_is_symbolic(shape) else entry_bytes(shape, dtype)
                 for shape, dtype in zip(shapes_col, dtypes_col)]
    sizes = [old_sizes[e] for e in old_eids]
    devices = [rw.node_device[nid] for nid, node in enumerate(rw.topo.nodes)
               for _ in range(node.num_outputs)]
    storage = plan_storage(rw.topo, sizes, devices)
    clock.lap("storage")
    planned = _build(g, rw, old_eids, devices, storage.storage_ids)
    clock.lap("build")

    new_nid = rw.new_nid
    fallbacks = [dataclasses.replace(f, nid=new_nid[f.nid]) for f in fallbacks]
    copies = [CopyReport(c.nid, c.name, f"{new_nid[c.src[0]]}:{c.src[1]}", c.src_device,
                         c.dst_device, sizes[planned.node_row_ptr[c.nid]]) for c in rw.copies]
    before = _pool_before(g, old_sizes, placement.default_device)
    pools = {}
    for dev in sorted(set(before) | set(storage.stats)):
        stats = storage.stats.get(dev, PoolStats(0, 0, 0))
        pools[dev] = PoolReport(dev, before.get(dev, 0), stats.no_sharing, stats.planned,
                                stats.lower_bound)
    return PlanResult(planned, list(rw.node_device), fallbacks, copies, pools, clock.total(),
                      clock.laps)


class _Clock:
    """Seconds per planning stage, for the report and the benchmark."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self.last
        self.last = now

    def total(self) -> float:
        return time.perf_counter() - self.started


def _fall_back(topo: Topology, node_device: list[Device], lib: Module, fallback: Device,
               strict: bool) -> list[Fallback]:
    """Rule 8: move nodes whose function lib lacks on their device to the default device."""
    result = []
    for nid, node in enumerate(topo.nodes):
        name = node.func_name
        if node.is_arg or name is None or name in (COPY_OP, NOP_OP):
            continue
        dev = node_device[nid]
        if lib.has_function(name, dev):
            continue
        where = f"{topo.label(nid)}: lib {lib.name!r} has no {name!r} for {dev.kind}"
        has = lib.devices_for(name)
        has_text = "it exists for: " + ", ".join(has) if has else "it is not in the lib at all"
        if not lib.has_function(name, fallback):
            raise PlanError(f"{where} nor for the default device {fallback.spec}; {has_text}")
        if strict:
            raise PlanError(f"{where} ({has_text}); without strict it would fall back to the "
                            f"default device {fallback.spec}")
        node_device[nid] = fallback
        result.append(Fallback(nid, node.name, name, dev, fallback))
    return result


def _entry_origins(g: Graph, rw: Rewritten) -> list[int]:
    """Per planned entry, the given graph's entry whose shape, dtype and columns it takes."""
    row_ptr = g.node_row_ptr
    old_eids: list[int] = []
    for old, index in rw.origin:
        if index < 0:
            old_eids.extend(range(row_ptr[old], row_ptr[old + 1]))
        else:
            old_eids.append(row_ptr[old] + index)
    return old_eids


def _build(g: Graph, rw: Rewritten, old_eids: list[int], devices: list[Device],
           storage_ids: list[int]) -> Graph:
    """The planned Graph, validated by Graph.build; unknown columns follow each entry's origin."""
    nodes: list[dict[str, Any]] = []
    for nid, (old, index) in enumerate(rw.origin):
        node = rw.topo.nodes[nid]
        if index >= 0:
            nodes.append({"op": "tvm_op", "name": node.name, "inputs": [[*node.inputs[0], 0]],
                          "attrs": {"func_name": COPY_OP, "num_inputs": "1",
                                    "num_outputs": "1", "flatten_data": "0"}})
            continue
        source = g.nodes[old]
        # No deep copy: Graph.build copies the documents through JSON anyway.
        doc = source._doc()
        doc["inputs"] = [_with_version(new, orig, rw)
                         for new, orig in zip(node.inputs, source.inputs)]
        nodes.append(doc)
    heads = [_with_version(new, orig, rw) for new, orig in zip(rw.topo.heads, g.heads)]
    kinds = {dev.device_type for dev in devices}
    ids_needed = len(set(devices)) > len(kinds) or any(dev.device_id for dev in devices)
    shapes_col = g.attrs["shape"][1]
    dtypes_col = g.attrs["dltype"][1]
    extra = {name: (tag, [values[e] for e in old_eids])
             for name, (tag, values) in g.attrs.items() if name not in _OWN_COLUMNS}
    planned = Graph.build(
        nodes, heads, shapes=[shapes_col[e] for e in old_eids],
        dtypes=[dtypes_col[e] for e in old_eids], storage_ids=storage_ids,
        device_index=[dev.device_type for dev in devices],
        device_id=[dev.device_id for dev in devices] if ids_needed else None,
        extra_columns=extra)
    return dataclasses.replace(planned, source=g.source, extra=g.extra)


def _with_version(new: tuple[int, int], orig: tuple[int, ...], rw: Rewritten) -> list[int]:
    """A reference in JSON form, keeping the original version unless a copy now feeds it."""
    version = orig[2] if len(orig) > 2 and rw.new_nid[orig[0]] == new[0] else 0
    return [new[0], new[1], version]


def _pool_before(g: Graph, sizes: list[int], default_device: VirtualDevice) -> dict[Device, int]:
    """Pool bytes per device of the graph as given (each storage id on its first entry's device)."""
    fallback = settle(VirtualDevice(), default_device)
    codes = g.column("device_index")
    ids = g.column("device_id")
    sids = g.attrs["storage_id"][1]
    sid_bytes: dict[int, int] = {}
    sid_device: dict[int, Device] = {}
    for eid, nbytes in enumerate(sizes):
        sid = sids[eid]
        if sid not in sid_device:
            dev = fallback
            if codes is not None:
                dev = Device(codes[eid], ids[eid] if ids is not None else 0)
            sid_device[sid] = dev
        sid_bytes[sid] = max(sid_bytes.get(sid, 0), nbytes)
    totals: dict[Device, int] = {}
    for sid, nbytes in sid_bytes.items():
        totals[sid_device[sid]] = totals.get(sid_device[sid], 0) + nbytes
    return totals
