"""Graph drawings: DOT text with nodes coloured by device; SVG/PNG through Graphviz's `dot`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from .._text import shape_text
from ..device import Device
from ..errors import GraphRuntimeError
from ..graph.model import COPY_OP, Graph
from .info import placement_report
from .trace import KIND_COLORS, OTHER_COLOR

FORMATS = ("dot", "svg", "png")


def _quote(text: str) -> str:
    # A JSON string is a DOT quoted string: quotes escaped, newlines as \n (a centred line break).
    return json.dumps(text, ensure_ascii=False)


def to_dot(graph: Graph, devices: Sequence[Device], params: Sequence[str] = ()) -> str:
    """DOT for graph placed on devices: kernels as boxes filled with their device's colour,
    __copy nodes as arrows (cds), data inputs as ellipses, params as dashed notes, heads
    double-bordered, edges labelled with the entry's shape and dtype; copies the executor would
    insert are red dashed edges."""
    report = placement_report(graph, devices)
    inserted = {(c.eid, c.dst) for c in report.copies if c.inserted}
    heads = {h[0] for h in graph.heads}
    lines = ["digraph graph_runtime {", "  rankdir=TB;",
             '  node [fontname="Helvetica", fontsize=10, style=filled];',
             '  edge [fontname="Helvetica", fontsize=8];']
    for node in graph.nodes:
        dev = report.node_device[node.nid]
        color = KIND_COLORS.get(dev.kind, OTHER_COLOR)
        label = f"{node.name}\n{dev.spec}"
        if node.is_arg:
            shape = "note" if node.name in params else "ellipse"
            style = "filled,dashed" if node.name in params else "filled"
            attrs = f'shape={shape}, style="{style}", fillcolor="white", color="{color}"'
        elif node.func_name == COPY_OP:
            src = report.node_device[node.inputs[0][0]]
            label = f"{node.name}\n{src.spec} -> {dev.spec}"
            attrs = f'shape=cds, fillcolor="#ffd92f", color="{color}", penwidth=2'
        else:
            if node.func_name and node.func_name != node.name:
                label = f"{node.name}\n{node.func_name}\n{dev.spec}"
            attrs = f'shape=box, fillcolor="{color}", fontcolor="white"'
        if node.nid in heads:
            attrs += ", peripheries=2"
        lines.append(f"  n{node.nid} [label={_quote(label)}, {attrs}];")
    for node in graph.nodes:
        dst = report.node_device[node.nid]
        for ref in node.inputs:
            eid = graph.entry_id(ref[0], ref[1])
            text = f"{shape_text(graph.shape(eid))} {graph.dtype(eid)}"
            extra = ""
            if (eid, dst) in inserted:
                text += f"\ninserted copy -> {dst.spec}"
                extra = ', color="red", fontcolor="red", style=dashed'
            lines.append(f"  n{ref[0]} -> n{node.nid} [label={_quote(text)}{extra}];")
    lines.append("  subgraph cluster_legend {")
    lines.append('    label="devices"; fontname="Helvetica"; fontsize=10;')
    for i, dev in enumerate(sorted(set(report.node_device))):
        color = KIND_COLORS.get(dev.kind, OTHER_COLOR)
        lines.append(f'    legend{i} [label={_quote(dev.spec)}, shape=box, fillcolor="{color}", '
                     'fontcolor="white"];')
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_drawing(dot_text: str, path: str | os.PathLike[str]) -> None:
    """Write DOT as is, or render SVG/PNG with Graphviz's `dot` (chosen by the file's suffix)."""
    out = Path(path)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise GraphRuntimeError(f"-o {out}: unknown drawing format {out.suffix or '(none)'!r}; "
                                "expected .dot, .svg or .png")
    if fmt == "dot":
        try:
            out.write_text(dot_text, encoding="utf-8")
        except OSError as e:
            raise GraphRuntimeError(f"-o {out}: cannot write: {e.strerror or e}") from e
        return
    exe = shutil.which("dot")
    if exe is None:
        raise GraphRuntimeError(f"-o {out}: drawing {fmt.upper()} needs Graphviz's `dot` on PATH; "
                                "install graphviz (e.g. apt-get install graphviz) or write .dot")
    done = subprocess.run([exe, f"-T{fmt}", "-o", str(out)], input=dot_text.encode(),
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise GraphRuntimeError(f"-o {out}: `dot -T{fmt}` failed (exit {done.returncode}): "
                                + done.stderr.decode(errors="replace").strip())
