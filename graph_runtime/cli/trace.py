"""Profile output files: Chrome trace JSON (Perfetto, chrome://tracing) and a matplotlib chart."""
from __future__ import annotations

import json
import os
from typing import Any, Sequence

from ..errors import GraphRuntimeError
from ..runtime.executor import NodeTime

# One colour per device kind, shared by the chart and `graphrun viz`.
KIND_COLORS = {"cpu": "#4e79a7", "opencl": "#f28e2b", "cuda": "#59a14f"}
OTHER_COLOR = "#bab0ac"


def chrome_trace(times: Sequence[NodeTime], name: str = "graphrun profile") -> dict[str, Any]:
    """Trace events for one run: steps back to back in execution order, one track per device.

    Each step lasts its median time (the times come from several runs, so the run is a
    reconstruction: step i starts when step i-1 ends). Copies sit on the destination's track.
    """
    devices = sorted({t.device for t in times})
    tid = {dev: i + 1 for i, dev in enumerate(devices)}
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": name}}]
    for dev in devices:
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[dev],
                       "args": {"name": dev.spec}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid[dev],
                       "args": {"sort_index": tid[dev]}})
    start_us = 0.0
    for t in times:
        dur_us = t.seconds * 1e6
        events.append({"name": t.label, "cat": "copy" if t.is_copy else "kernel", "ph": "X",
                       "ts": round(start_us, 3), "dur": round(dur_us, 3), "pid": 1,
                       "tid": tid[t.device],
                       "args": {"nid": t.nid, "func_name": t.func_name, "device": t.device.spec}})
        start_us += dur_us
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(times: Sequence[NodeTime], path: str | os.PathLike[str]) -> None:
    """Write chrome_trace(times) as JSON."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(chrome_trace(times), f, indent=1)
    except OSError as e:
        raise GraphRuntimeError(f"--trace {os.fspath(path)}: cannot write: "
                                f"{e.strerror or e}") from e


def plot_profile(times: Sequence[NodeTime], path: str | os.PathLike[str],
                 title: str = "time per node") -> None:
    """A horizontal bar per step (execution order, top to bottom) coloured by device kind."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:
        raise GraphRuntimeError(f"--plot needs matplotlib ({e}); pip install "
                                "'graph_runtime[plot]'") from e
    labels = [_short(t) for t in times]
    values = [t.seconds * 1e3 for t in times]
    colors = [KIND_COLORS.get(t.device.kind, OTHER_COLOR) for t in times]
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.3 * len(times) + 1.2)))
    try:
        positions = list(range(len(times)))
        ax.barh(positions, values, color=colors)
        for pos, t in zip(positions, times):
            if t.is_copy:
                ax.patches[pos].set_hatch("//")
        ax.set_yticks(positions)
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("median time (ms)")
        ax.set_title(title)
        kinds = sorted({t.device.spec for t in times})
        handles = [Patch(color=KIND_COLORS.get(spec.split(":")[0], OTHER_COLOR), label=spec)
                   for spec in kinds]
        if any(t.is_copy for t in times):
            handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                                 label="copy"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        fig.tight_layout()
        fig.savefig(path, format=plot_format(path), dpi=100)
    except OSError as e:
        raise GraphRuntimeError(f"--plot {os.fspath(path)}: cannot write: "
                                f"{e.strerror or e}") from e
    finally:
        plt.close(fig)


# What --plot can write, by file suffix.
PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def plot_format(path: str | os.PathLike[str]) -> str:
    """The image format a --plot path asks for; GraphRuntimeError for a suffix we cannot write."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    fmt = PLOT_FORMATS.get(suffix)
    if fmt is None:
        raise GraphRuntimeError(f"--plot {os.fspath(path)}: cannot write {suffix or 'no suffix'!r}"
                                f" images; give a {', '.join(PLOT_FORMATS)} file")
    return fmt


def _short(t: NodeTime, width: int = 44) -> str:
    """The step's label cut from the left of its name, so fused names keep their distinct tail:
    "node 3 '...dense_add_1'", never "node 3 'tvmgen_default_fused_nn_dense..."."""
    text = t.label
    if len(text) <= width:
        return text
    head, sep, name = text.partition(" '")
    if not sep:
        return "..." + text[-(width - 3):]
    keep = max(width - len(head) - 6, 8)
    return f"{head} '...{name[-keep:]}"
