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


def placement_report(graph: Graph, devices: Sequence[Device],
                     entry_device: Sequence[Device] | None = None) -> PlacementReport:
    """The executor's placement rules (device_index, ctxs[0] fallback, copies), nothing allocated.

    entry_device: each entry's device when already resolved (a GraphModule's executor has it).
    """
    if entry_device is None:
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


def graph_info(files: Any, devices: Sequence[Device]) -> dict[str, Any]:
    """Everything `graphrun info` shows, as JSON-ready data (files: a job.GraphFiles)."""
    from .params import load_params_file
    graph = Graph.from_json(files.graph)
    params = list(load_params_file(files.params)) if files.params else []
    given = list(load_params_file(files.inputs)) if files.inputs else None
    data, param_args = split_args(graph, params, given)
    report = placement_report(graph, devices)
    shapes = [(list(graph.shape(e)), graph.dtype(e)) for e in graph.output_entries]
    from .job import output_names
    return {
        "graph": str(files.graph), "devices": [d.spec for d in devices],
        "nodes": graph.num_nodes, "entries": graph.num_entries,
        "inputs": arg_rows(graph, data), "params": arg_rows(graph, param_args),
        "outputs": [{"index": i, "name": name, "shape": shape, "dtype": dtype}
                    for i, (name, (shape, dtype)) in enumerate(zip(output_names(graph), shapes))],
        "functions": func_counts(graph),
        "kernels_per_device": {d.spec: n for d, n in report.kernels_per_device(graph).items()},
        "placement": [{"nid": n.nid, "name": n.name,
                       "func_name": "input" if n.is_arg else n.func_name,
                       "device": report.node_device[n.nid].spec} for n in graph.nodes],
        "copies": _copy_rows(report),
        "pool": [{"device": d.spec, "bytes": report.pool.get(d, 0),
                  "unshared_bytes": report.unshared.get(d, 0)}
                 for d in sorted(set(report.pool) | set(report.unshared))],
    }


def _copy_rows(report: PlacementReport) -> list[dict[str, Any]]:
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
    lines = [f"graph     {doc['graph']}: {doc['nodes']} nodes, {doc['entries']} entries",
             f"devices   {', '.join(doc['devices'])} (first = primary, the fallback)", ""]
    for title in ("inputs", "params"):
        rows = doc[title]
        total = sum(r["bytes"] for r in rows)
        lines.append(f"{title} ({len(rows)}, {fmt_bytes(total)})")
        lines.append(table(["name", "shape", "dtype", "bytes"],
                           [[r["name"], shape_text(r["shape"]), r["dtype"], fmt_bytes(r["bytes"])]
                            for r in rows]) if rows else "  none")
    lines.append(f"outputs ({len(doc['outputs'])})")
    lines.append(table(["#", "name", "shape", "dtype"],
                       [[o["index"], o["name"], shape_text(o["shape"]), o["dtype"]]
                        for o in doc["outputs"]]))
    lines.append("functions")
    lines.append(table(["nodes", "func_name"], [[n, f] for f, n in doc["functions"].items()]))
    per_device = ", ".join(f"{d}: {n}" for d, n in doc["kernels_per_device"].items())
    lines.append(f"placement (kernels per device: {per_device or 'none'})")
    lines.append(table(["nid", "node", "func_name", "device"],
                       [[p["nid"], p["name"], p["func_name"], p["device"]]
                        for p in doc["placement"]]))
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


def run_summary(job: Any, outputs: Sequence[np.ndarray], timing: dict[str, Any],
                comparisons: Sequence[Any] | None, rtol: float, atol: float) -> dict[str, Any]:
    """Everything `graphrun run` shows, as JSON-ready data (job: a job.Job)."""
    from .job import describe_devices, output_names
    files = job.files
    report = placement_report(job.graph, job.devices, job.module.executor.entry_device)
    doc: dict[str, Any] = {
        "graph": str(files.graph), "lib": str(files.lib) if files.lib else None,
        "params": str(files.params) if files.params else None,
        "devices": [{"device": d.spec, "name": name}
                    for d, name in describe_devices(job.devices).items()],
        "kernels_per_device": {d.spec: n for d, n in report.kernels_per_device(job.graph).items()},
        "copies": _copy_rows(report),
        "random_inputs": list(job.inputs.random),
        "outputs": [{"index": i, "name": name, "shape": list(value.shape),
                     "dtype": str(value.dtype), "summary": summarize(value)}
                    for i, (name, value) in enumerate(zip(output_names(job.graph), outputs))],
        "timing": timing, "expected": None,
    }
    if comparisons is not None:
        doc["expected"] = {"file": str(files.expected), "rtol": rtol, "atol": atol,
                           "ok": all(c.ok for c in comparisons),
                           "outputs": [vars(c) for c in comparisons]}
    return doc


def run_text(doc: dict[str, Any]) -> str:
    with_files = [f"{k} {doc[k]}" for k in ("lib", "params") if doc[k]]
    lines = [f"graph      {doc['graph']}" + (f" ({', '.join(with_files)})" if with_files else "")]
    for i, d in enumerate(doc["devices"]):
        lines.append(f"{'devices' if i == 0 else '':<10} {d['device']:<10} {d['name']}")
    placed = ", ".join(f"{n} on {d}" for d, n in doc["kernels_per_device"].items())
    copies = "; ".join(f"{c['count']} {'inserted ' if c['inserted'] else ''}"
                       f"cop{'y' if c['count'] == 1 else 'ies'} {c['src']} -> {c['dst']} "
                       f"({fmt_bytes(c['bytes'])})" for c in doc["copies"])
    lines.append(f"placement  kernels: {placed or 'none'}; {copies or 'no copies'}")
    lines.append("outputs")
    lines.append(table(["#", "name", "shape", "dtype", "summary"],
                       [[o["index"], o["name"], shape_text(o["shape"]), o["dtype"],
                         summary_text(o["summary"])] for o in doc["outputs"]]))
    t = doc["timing"]
    lines.append(f"time       {ms(t['first_run_s'])} (first run, with one-time setup)")
    if t["runs"] > 1:
        lines.append(f"{'':<10} median {ms(t['median_s'])} over {t['runs']} runs (mean "
                     f"{ms(t['mean_s'])}, min {ms(t['min_s'])}, max {ms(t['max_s'])})")
    exp = doc["expected"]
    if exp is not None:
        worst = max((c["max_abs"] for c in exp["outputs"]), default=0.0)
        if exp["ok"]:
            lines.append(f"expected   OK: every output matches {exp['file']} (max abs err "
                         f"{worst:.3g}; rtol {exp['rtol']:g}, atol {exp['atol']:g})")
        else:
            bad = [c for c in exp["outputs"] if not c["ok"]]
            lines.append(f"expected   MISMATCH with {exp['file']}: " + "; ".join(
                f"output {c['index']} {c['name']!r}: " + (c["problem"] or
                f"max abs err {c['max_abs']:.3g}, max rel err {c['max_rel']:.3g}")
                for c in bad) + f" (rtol {exp['rtol']:g}, atol {exp['atol']:g})")
    if doc.get("saved"):
        lines.append(f"saved      {doc['saved']}")
    return "\n".join(lines)


def comparison_text(comparisons: Sequence[Any], expected: str, rtol: float, atol: float) -> str:
    """The compare table and a verdict line."""
    rows = [[c.index, c.name, f"{c.max_abs:.3g}", f"{c.max_rel:.3g}",
             "ok" if c.ok else f"MISMATCH {c.problem}".strip()] for c in comparisons]
    bad = sum(not c.ok for c in comparisons)
    verdict = (f"OK: {len(comparisons)} outputs match {expected}" if not bad else
               f"MISMATCH: {bad} of {len(comparisons)} outputs differ from {expected}")
    return "\n".join([table(["#", "output", "max abs err", "max rel err", "result"], rows),
                      f"{verdict} (rtol {rtol:g}, atol {atol:g})"])


def profile_text(doc: dict[str, Any], top: int) -> str:
    steps = doc["steps"]
    lines = [f"profile of {doc['graph']} on {', '.join(doc['devices'])}: median of "
             f"{doc['repeat']} runs, each step synchronised",
             table(["node", "func_name", "device", "time", "%"],
                   [[s["label"], s["func_name"], s["device"], ms(s["seconds"]),
                     f"{s['percent']:.1f}"] for s in steps[:top]])]
    if len(steps) > top:
        lines.append(f"  ... {len(steps) - top} more steps (--top {len(steps)} shows all)")
    total = doc["total_s"] or 1e-30
    lines.append("totals")
    rows = [[dev, ms(sec), f"{100 * sec / total:.1f}"] for dev, sec in doc["per_device_s"].items()]
    rows.append(["copies", ms(doc["copies_s"]), f"{100 * doc['copies_s'] / total:.1f}"])
    rows.append(["all", ms(doc["total_s"]), "100.0"])
    lines.append(table(["device", "time", "%"], rows))
    for key, what in (("trace", "Chrome trace"), ("plot", "plot")):
        if doc.get(key):
            lines.append(f"wrote {what} {doc[key]}")
    return "\n".join(lines)


def regress_summary(results: Sequence[Any]) -> dict[str, Any]:
    """Counts per status and one row per case (results: regress.CaseResult)."""
    cases = [{"id": r.case_id, "case": r.case.name, "devices": list(r.devices),
              "status": r.status, "seconds": r.seconds, "message": r.message,
              "max_abs_err": max((c.max_abs for c in r.comparisons), default=None)}
             for r in results]
    counts = {key: sum(r.status == status for r in results) for key, status in
              (("passed", "passed"), ("failed", "failed"), ("errors", "error"),
               ("skipped", "skipped"))}
    return {"cases": cases, **counts}


def regress_text(doc: dict[str, Any], width: int = 60) -> str:
    """The case table (notes cut to width), then every failure and error in full."""
    rows = [[c["id"], c["status"].upper() if c["status"] in ("failed", "error") else c["status"],
             ms(c["seconds"]) if c["status"] != "skipped" else "",
             f"{c['max_abs_err']:.2g}" if c["max_abs_err"] is not None else "",
             c["message"] if len(c["message"]) <= width else c["message"][:width - 3] + "..."]
            for c in doc["cases"]]
    lines = [table(["case", "status", "time", "max abs err", "note"], rows)]
    for c in doc["cases"]:
        if c["status"] in ("failed", "error"):
            lines.append(f"{c['status'].upper()} {c['id']}: {c['message']}")
    verdict = ", ".join(f"{doc[k]} {k}" for k in ("passed", "failed", "errors", "skipped"))
    lines.append(f"{doc.get('suite', 'suite')}: {verdict}")
    return "\n".join(lines)


def plan_summary(result: Any, files: Any, written: str | None) -> dict[str, Any]:
    """`graphrun plan --json`: the planner's report as data (result: planner.PlanResult)."""
    return {
        "graph": str(files.graph), "written": written, "seconds": result.seconds,
        "node_devices": [d.spec for d in result.node_devices],
        "fallbacks": [{"nid": f.nid, "name": f.name, "func_name": f.func_name,
                       "planned": f.planned.spec, "device": f.device.spec}
                      for f in result.fallbacks],
        "copies": [{"nid": c.nid, "name": c.name, "src_entry": c.src_entry, "src": c.src.spec,
                    "dst": c.dst.spec, "bytes": c.nbytes} for c in result.copies],
        "pools": [{"device": p.device.spec, "before": p.before, "no_sharing": p.no_sharing,
                   "after": p.after, "lower_bound": p.lower_bound}
                  for p in result.pools.values()],
    }
