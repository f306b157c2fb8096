"""Summaries graphrun prints after running: outputs, comparisons, profiles, suites, plans."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._text import count_of, fmt_bytes, ms, shape_text, table
from ..runtime.executor import NodeTime
from .info import copy_rows, executor_report

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

def run_summary(job: Any, outputs: Sequence[np.ndarray], timing: dict[str, Any],
                comparisons: Sequence[Any] | None, rtol: float, atol: float) -> dict[str, Any]:
    """Everything `graphrun run` shows, as JSON-ready data (job: a job.Job)."""
    from .job import describe_devices, output_names
    files = job.files
    report = executor_report(job.module.executor)
    doc: dict[str, Any] = {
        "graph": str(files.graph), "lib": str(files.lib) if files.lib else None,
        "params": str(files.params) if files.params else None,
        "devices": [{"device": d.spec, "name": name}
                    for d, name in describe_devices(job.devices).items()],
        "kernels_per_device": {d.spec: n for d, n in report.kernels_per_device(job.graph).items()},
        "copies": copy_rows(report),
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
                f"max abs err {c['max_abs']:.3g}, max rel err {_rel(c['max_rel'])}")
                for c in bad) + f" (rtol {exp['rtol']:g}, atol {exp['atol']:g})")
    if doc.get("saved"):
        lines.append(f"saved      {doc['saved']}")
    return "\n".join(lines)


def _rel(value: float | None) -> str:
    """A max relative error; n/a where there is none (every expected value 0, or not compared;
    NaN, or null in JSON)."""
    if value is None or value != value:
        return "n/a"
    return f"{value:.3g}"


def comparison_text(comparisons: Sequence[Any], expected: str, rtol: float, atol: float) -> str:
    """The compare table and a verdict line."""
    rows = [[c.index, c.name, f"{c.max_abs:.3g}", _rel(c.max_rel),
             "ok" if c.ok else f"MISMATCH {c.problem}".strip()] for c in comparisons]
    bad = sum(not c.ok for c in comparisons)
    n = len(comparisons)
    verdict = (f"OK: {count_of(n, 'output')} match{'es' if n == 1 else ''} {expected}"
               if not bad else f"MISMATCH: {bad} of {count_of(n, 'output')} differ from {expected}")
    return "\n".join([table(["#", "output", "max abs err", "max rel err", "result"], rows),
                      f"{verdict} (rtol {rtol:g}, atol {atol:g})"])


def profile_text(doc: dict[str, Any], top: int) -> str:
    steps = doc["steps"]
    notes = any(s.get("kernel") for s in steps[:top])
    lines = [f"profile of {doc['graph']} on {', '.join(doc['devices'])}: median of "
             f"{doc['repeat']} runs, each step synchronised",
             table(["node", "func_name", "device", "time", "%"] + (["kernel"] if notes else []),
                   [[s["label"], "" if f"'{s['func_name']}'" in s["label"] else s["func_name"],
                     s["device"], ms(s["seconds"]),
                     f"{s['percent']:.1f}"] + ([s.get("kernel", "")] if notes else [])
                    for s in steps[:top]])]
    if len(steps) > top:
        lines.append(f"  ... {len(steps) - top} more steps (--top {len(steps)} shows all)")
    lines.append("  (func_name is blank where it is the node's name)")
    total = doc["total_s"] or 1e-30
    lines.append("totals")
    rows = [[dev, ms(sec), f"{100 * sec / total:.1f}"] for dev, sec in doc["per_device_s"].items()]
    rows.append(["copies", ms(doc["copies_s"]), f"{100 * doc['copies_s'] / total:.1f}"])
    rows.append(["all", ms(doc["total_s"]), "100.0"])
    lines.append(table(["device", "time", "%"], rows))
    if doc.get("shape"):
        lines.append(doc["shape"]["text"])
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
