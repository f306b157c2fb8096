"""What `graphrun info` shows: placement and copies computed without allocating; text tables."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from ..graph.symbolic import format_shape, shape_is_symbolic
from .._text import count_of, fmt_bytes, shape_text, table
from ..device import Device
from ..graph.model import COPY_OP, NOP_OP, Graph, entry_bytes
from ..runtime.executor import Executor
from ..runtime.placement import InsertedCopy, plan_placement, resolve_entry_devices
from ..runtime.storage import PoolLayout

# TVM names the params it binds p0, p1, ...; used only when no params or inputs file says.
TVM_PARAM_NAME = re.compile(r"p\d+")


@dataclass(frozen=True)
class CopyInfo:
    """A cross-device copy: a __copy node of the graph, or one the executor would insert."""

    nid: int  # -1 for an inserted copy
    label: str
    eid: int  # the entry copied
    src: Device
    dst: Device
    nbytes: int

    @property
    def inserted(self) -> bool:
        return self.nid < 0


@dataclass(frozen=True)
class PlacementReport:
    """Where each node runs and what crosses devices, as create() would set it up."""

    node_device: list[Device]
    copies: list[CopyInfo]
    pool: dict[Device, int]
    unshared: dict[Device, int]

    def kernels_per_device(self, graph: Graph) -> dict[Device, int]:
        """Kernel nodes (not inputs, copies or no-ops) per device."""
        counts: Counter[Device] = Counter()
        for node in graph.nodes:
            if not node.is_arg and node.func_name not in (COPY_OP, NOP_OP):
                counts[self.node_device[node.nid]] += 1
        return dict(sorted(counts.items()))


def placement_report(graph: Graph, devices: Sequence[Device]) -> PlacementReport:
    """What create() would set up on devices (placement, copies, pool), nothing allocated."""
    entry_device = resolve_entry_devices(graph, list(devices), False)
    node_device, inserted, plan = plan_placement(graph, entry_device, devices[0], False)
    return _report(graph, entry_device, node_device, inserted, plan)


def executor_report(executor: Executor) -> PlacementReport:
    """The same report for a built executor, from what it already computed."""
    return _report(executor.graph, executor.entry_device, executor.node_device, executor.copies,
                   executor.plan)


def _report(graph: Graph, entry_device: Sequence[Device], node_device: list[Device],
            inserted: Sequence[InsertedCopy], plan: PoolLayout) -> PlacementReport:
    copies = []
    for node in graph.nodes:
        if node.func_name != COPY_OP:
            continue
        for ref in node.inputs:
            eid = graph.entry_id(ref[0], ref[1])
            copies.append(CopyInfo(node.nid, node.label, eid, entry_device[eid],
                                   node_device[node.nid],
                                   _bytes(graph.shape(eid), graph.dtype(eid))))
    copies += [CopyInfo(-1, f"inserted copy of {graph.entry_label(c.eid)}", c.eid, c.src, c.dst,
                        c.nbytes) for c in inserted]
    return PlacementReport(node_device, copies, plan.bytes_per_device(),
                           plan.unshared_bytes_per_device())


def split_args(graph: Graph, params: Sequence[str], inputs: Sequence[str] | None
               ) -> tuple[list[str], list[str]]:
    """(data inputs, params) among the arg nodes.

    Params are the names the params file sets; without one, the args an inputs file does not set;
    without either, TVM's p0, p1, ... names.
    """
    names = graph.input_names
    if params:
        is_param = {n: n in params for n in names}
    elif inputs is not None:
        is_param = {n: n not in inputs for n in names}
    else:
        is_param = {n: TVM_PARAM_NAME.fullmatch(n) is not None for n in names}
    return [n for n in names if not is_param[n]], [n for n in names if is_param[n]]


def arg_rows(graph: Graph, names: Sequence[str]) -> list[dict[str, Any]]:
    """name, shape, dtype, bytes of the arg nodes called names."""
    eids = graph.input_entries
    return [{"name": n, "shape": list(graph.shape(eids[n])), "dtype": graph.dtype(eids[n]),
             "bytes": _bytes(graph.shape(eids[n]), graph.dtype(eids[n]))} for n in names]


def _static_view(graph: Graph) -> Graph:
    """graph with every symbolic dim as 0, for reports that count bytes."""
    import dataclasses
    attrs = dict(graph.attrs)
    attrs["shape"] = ("list_shape", [[0 if isinstance(d, str) else d for d in shape]
                                     for shape in graph.attrs["shape"][1]])
    return dataclasses.replace(graph, attrs=attrs)


def _bytes(shape: Any, dtype: str) -> int:
    """An entry's bytes; 0 for a symbolic shape (its size is known only when specialised)."""
    if shape_is_symbolic(shape):
        return 0
    return entry_bytes(shape, dtype)


def func_counts(graph: Graph) -> dict[str, int]:
    """How many nodes call each function, most first."""
    counts = Counter(n.func_name or "" for n in graph.nodes if not n.is_arg)
    return dict(counts.most_common())


def graph_info(files: Any, devices: Sequence[Device]) -> dict[str, Any]:
    """Everything `graphrun info` shows, as JSON-ready data (files: a job.GraphFiles)."""
    from ..params import load_params_file
    from .job import output_names, param_names
    graph = Graph.from_json(files.graph)
    given = list(load_params_file(files.inputs, "inputs")) if files.inputs else None
    data, param_args = split_args(graph, param_names(files), given)
    # NOTE: a symbolic entry's size is known only when specialised: it counts 0 bytes here.
    report = placement_report(_static_view(graph) if graph.is_symbolic else graph, devices)
    shapes = [(list(graph.shape(e)), graph.dtype(e)) for e in graph.output_entries]
    return {
        "graph": str(files.graph), "devices": [d.spec for d in devices],
        "nodes": graph.num_nodes, "entries": graph.num_entries,
        "signature": ("; ".join(f"{r['name']}: {format_shape(r['shape'])} {r['dtype']}"
                                for r in arg_rows(graph, data)) if graph.is_symbolic else None),
        "inputs": arg_rows(graph, data), "params": arg_rows(graph, param_args),
        "outputs": [{"index": i, "name": name, "node": node, "shape": shape, "dtype": dtype}
                    for i, (name, node, (shape, dtype)) in enumerate(
                        zip(output_names(graph), graph.node_output_names, shapes))],
        "functions": func_counts(graph),
        "cuts": cut_lines(graph, files.lib),
        "kernels_per_device": {d.spec: n for d, n in report.kernels_per_device(graph).items()},
        "placement": [{"nid": n.nid, "name": n.name,
                       "func_name": ("param" if n.name in param_args else "input") if n.is_arg
                       else n.func_name,
                       "device": report.node_device[n.nid].spec} for n in graph.nodes],
        "copies": copy_rows(report),
        "pool": [{"device": d.spec, "bytes": report.pool.get(d, 0),
                  "unshared_bytes": report.unshared.get(d, 0)}
                 for d in sorted(set(report.pool) | set(report.unshared))],
    }


def cut_lines(graph: Graph, lib_path: Any) -> list[str]:
    """Where the graph is cut at data-dependent nodes (runtime/segments.py); a lib.json is read
    for it (a lib.py is not run here)."""
    if not graph.is_symbolic or lib_path is None or not str(lib_path).endswith(".json"):
        return []
    from ..lib import load_module
    from ..runtime.segments import describe_cuts, find_cuts
    return describe_cuts(graph, find_cuts(graph, load_module(lib_path)))


def copy_rows(report: PlacementReport) -> list[dict[str, Any]]:
    """Copies per (source, destination, graph node or inserted): count and bytes."""
    rows: dict[tuple[str, str, bool], list[int]] = {}
    for c in report.copies:
        key = (c.src.spec, c.dst.spec, c.inserted)
        count_bytes = rows.setdefault(key, [0, 0])
        count_bytes[0] += 1
        count_bytes[1] += c.nbytes
    return [{"src": src, "dst": dst, "inserted": inserted, "count": n, "bytes": b}
            for (src, dst, inserted), (n, b) in sorted(rows.items())]


def info_text(doc: dict[str, Any]) -> str:
    lines = [f"graph     {doc['graph']}: {count_of(doc['nodes'], 'node')}, "
             f"{count_of(doc['entries'], 'entry', 'entries')}",
             f"devices   {', '.join(doc['devices'])} (first = primary, the fallback)", ""]
    if doc.get("signature"):
        lines[-1:] = [f"symbolic  {doc['signature']} (specialised per input shape at run; "
                      "storage below counts static entries only)", ""]
    for title in ("inputs", "params"):
        rows = doc[title]
        total = sum(r["bytes"] for r in rows)
        lines.append(f"{title} ({len(rows)}, {fmt_bytes(total)})")
        lines.append(table(["name", "shape", "dtype", "bytes"],
                           [[r["name"], shape_text(r["shape"]), r["dtype"], fmt_bytes(r["bytes"])]
                            for r in rows]) if rows else "  none")
    lines.append(f"outputs ({len(doc['outputs'])})")
    lines.append(table(["#", "name", "node", "shape", "dtype"],
                       [[o["index"], o["name"], o["node"], shape_text(o["shape"]), o["dtype"]]
                        for o in doc["outputs"]]))
    if doc.get("cuts"):
        lines.append(f"cuts      {len(doc['cuts'])} (the graph runs in segments cut at "
                     "data-dependent nodes; each segment after a cut is specialised for the "
                     "sizes its data produced)")
        lines.extend(f"  {line}" for line in doc["cuts"])
    lines.append("functions")
    lines.append(table(["nodes", "func_name"], [[n, f] for f, n in doc["functions"].items()]))
    per_device = ", ".join(f"{d}: {n}" for d, n in doc["kernels_per_device"].items())
    lines.append(f"placement (kernels per device: {per_device or 'none'})")
    lines.append(table(["nid", "node", "func_name", "device"],
                       [[p["nid"], p["name"], "" if p["func_name"] == p["name"] else p["func_name"],
                         p["device"]]
                        for p in doc["placement"]]))
    lines.append("  (func_name is blank where it is the node's name)")
    lines.append(f"copies ({sum(c['count'] for c in doc['copies'])})")
    lines.append(table(["from", "to", "kind", "count", "bytes"],
                       [[c["src"], c["dst"], "inserted" if c["inserted"] else "__copy node",
                         c["count"], fmt_bytes(c["bytes"])] for c in doc["copies"]])
                 if doc["copies"] else "  none")
    lines.append("storage pool")
    lines.append(table(["device", "with sharing", "without sharing"],
                       [[p["device"], fmt_bytes(p["bytes"]), fmt_bytes(p["unshared_bytes"])]
                        for p in doc["pool"]]))
    return "\n".join(lines)
