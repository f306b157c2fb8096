"""What graphrun prints: placement computed without allocating, output summaries, text tables."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .device import Device
from .errors import GraphError
from .executor import COPY_OP, NOP_OP, NodeTime, resolve_entry_devices
from .graph import Graph
from .storage import entry_bytes, fmt_bytes, plan_storage

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

    def copies_per_pair(self) -> dict[tuple[Device, Device], tuple[int, int]]:
        """(count, bytes) per (source, destination) device pair."""
        pairs: dict[tuple[Device, Device], tuple[int, int]] = {}
        for c in self.copies:
            count, nbytes = pairs.get((c.src, c.dst), (0, 0))
            pairs[(c.src, c.dst)] = (count + 1, nbytes + c.nbytes)
        return dict(sorted(pairs.items()))


def placement_report(graph: Graph, devices: Sequence[Device]) -> PlacementReport:
    """The executor's placement rules (device_index, ctxs[0] fallback, copies), nothing allocated."""
    entry_device = resolve_entry_devices(graph, list(devices), False)
    node_device = []
    for node in graph.nodes:
        devs = sorted({entry_device[e] for e in graph.node_entries(node.nid)})
        if len(devs) > 1:
            raise GraphError(f"{graph.source}: {node.label} has outputs on "
                             f"{', '.join(map(str, devs))}; a node runs on one device")
        node_device.append(devs[0] if devs else devices[0])
    copies = []
    inserted: set[tuple[int, Device]] = set()
    for node in graph.nodes:
        if node.is_arg or node.func_name == NOP_OP:
            continue
        dst = node_device[node.nid]
        for ref in node.inputs:
            eid = graph.entry_id(ref[0], ref[1])
            src = entry_device[eid]
            nbytes = entry_bytes(graph.shape(eid), graph.dtype(eid))
            if node.func_name == COPY_OP:
                copies.append(CopyInfo(node.nid, node.label, eid, src, dst, nbytes))
            elif src != dst and (eid, dst) not in inserted:
                inserted.add((eid, dst))
                copies.append(CopyInfo(-1, f"inserted copy of {graph.entry_label(eid)}", eid,
                                       src, dst, nbytes))
    plan = plan_storage(graph, entry_device)
    for c in copies:
        if c.inserted:  # the executor allocates these outside the pool, on the destination
            plan.extra_bytes[c.dst] = plan.extra_bytes.get(c.dst, 0) + c.nbytes
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
    eids = {graph.nodes[nid].name: graph.entry_id(nid, 0) for nid in graph.arg_nodes}
    return [{"name": n, "shape": list(graph.shape(eids[n])), "dtype": graph.dtype(eids[n]),
             "bytes": entry_bytes(graph.shape(eids[n]), graph.dtype(eids[n]))} for n in names]


def func_counts(graph: Graph) -> dict[str, int]:
    """How many nodes call each function, most first."""
    counts = Counter(n.func_name or "" for n in graph.nodes if not n.is_arg)
    return dict(counts.most_common())


# ---- outputs ------------------------------------------------------------------------------------

def looks_like_probabilities(value: np.ndarray) -> bool:
    """True for a softmax-like output: floats in [0, 1] whose last axis sums to 1."""
    if value.dtype.kind != "f" or value.ndim == 0 or value.shape[-1] < 2 or value.size == 0:
        return False
    if not np.all((value >= 0) & (value <= 1)):
        return False
    return bool(np.allclose(value.sum(axis=-1), 1.0, atol=1e-3))


def summarize(value: np.ndarray, top: int = 5) -> dict[str, Any]:
    """min, max, mean (and top classes of the first row for a probability output)."""
    result: dict[str, Any] = {}
    if value.size and value.dtype.kind in "fiub":
        as_float = value.astype(np.float64)
        result.update(min=float(as_float.min()), max=float(as_float.max()),
                      mean=float(as_float.mean()))
    if looks_like_probabilities(value):
        row = value.reshape(-1, value.shape[-1])[0]
        order = np.argsort(-row, kind="stable")[:top]
        result["top"] = [[int(i), float(row[i])] for i in order]
    return result


def summary_text(summary: dict[str, Any]) -> str:
    """One line for a summarize() result."""
    if "top" in summary:
        return f"top-{len(summary['top'])}: " + ", ".join(f"{i} ({p:.3f})"
                                                          for i, p in summary["top"])
    if "min" in summary:
        return f"min {summary['min']:.4g}, max {summary['max']:.4g}, mean {summary['mean']:.4g}"
    return "empty"


# ---- profile ------------------------------------------------------------------------------------

def profile_summary(times: Sequence[NodeTime]) -> dict[str, Any]:
    """Steps sorted by time with % of total; totals per device and for copies (for --json too)."""
    total = sum(t.seconds for t in times) or 1e-30
    steps = sorted(times, key=lambda t: -t.seconds)
    per_device: dict[str, float] = {}
    for t in times:
        if not t.is_copy:
            per_device[t.device.spec] = per_device.get(t.device.spec, 0.0) + t.seconds
    copies = sum(t.seconds for t in times if t.is_copy)
    return {
        "total_s": sum(t.seconds for t in times),
        "steps": [{"nid": t.nid, "label": t.label, "func_name": t.func_name,
                   "device": t.device.spec, "is_copy": t.is_copy, "seconds": t.seconds,
                   "percent": 100.0 * t.seconds / total} for t in steps],
        "per_device_s": dict(sorted(per_device.items())),
        "copies_s": copies,
    }


# ---- text ---------------------------------------------------------------------------------------

def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> str:
    """A plain text table; numbers are right-aligned, text left-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(headers))]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if numeric[i] else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(indent + "  ".join(parts).rstrip())
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


__all__ = ["CopyInfo", "PlacementReport", "placement_report", "split_args", "arg_rows",
           "func_counts", "summarize", "summary_text", "profile_summary", "table", "shape_text",
           "ms", "fmt_bytes"]
