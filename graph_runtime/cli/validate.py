"""`graphrun validate`'s checks of graph, lib coverage and params, reporting every problem found."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..device import Device
from ..errors import GraphRuntimeError
from ..graph.model import COPY_OP, NOP_OP, Graph, check_graph, read_graph_doc
from ..lib.library import Module, TensorSpec
from .info import placement_report
from .job import GraphFiles


@dataclass
class CheckResult:
    """What was checked and every problem found (one line each)."""

    checked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def text(self, name: str) -> str:
        lines = [f"{name}: checked {', '.join(self.checked) or 'nothing'}"]
        if not self.problems:
            return "\n".join(lines + ["OK: no problems found"])
        lines += [f"  {i}. {p}" for i, p in enumerate(self.problems, 1)]
        lines.append(f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''} found")
        return "\n".join(lines)


def check_files(files: GraphFiles, devices: Sequence[Device]) -> CheckResult:
    """Check the graph; when it is sound, the lib on each node's device and the params too."""
    result = CheckResult(checked=["graph"])
    try:
        doc, source = read_graph_doc(files.graph)
    except GraphRuntimeError as e:
        result.problems.append(str(e))
        return result
    result.problems += [str(p) for p in check_graph(doc, source)]
    if result.problems:
        return result  # lib and params checks need a sound graph
    graph = Graph.from_json(doc, source_name=source)
    try:
        node_device = placement_report(graph, devices).node_device
    except GraphRuntimeError as e:
        result.problems.append(str(e))
        return result
    lib_text = f"lib {files.lib}" + (" (found beside the graph)" if files.lib_beside else "")
    result.checked.append(lib_text if files.lib else "standard ops (no --lib)")
    result.problems += lib_problems(graph, node_device, files)
    if files.params is not None:
        result.checked.append(f"params {files.params}")
        result.problems += params_problems(graph, files.params)
    return result


def lib_problems(graph: Graph, node_device: Sequence[Device], files: GraphFiles) -> list[str]:
    """Nodes whose function the lib lacks on their device, or whose outputs it would not make."""
    from ..lib import load_module, standard_module
    try:
        lib: Module = load_module(files.lib) if files.lib else standard_module()
    except GraphRuntimeError as e:
        return [str(e)]
    problems = []
    for node in graph.nodes:
        if node.is_arg or node.func_name in (COPY_OP, NOP_OP, None):
            continue
        dev = node_device[node.nid]
        if not lib.has_function(node.func_name, dev):
            try:
                lib.get_function(node.func_name, dev, node.label)
            except GraphRuntimeError as e:
                hint = ("" if files.lib
                        else " (the standard ops only: give the graph's lib with --lib)")
                problems.append(f"{graph.source}: {e}{hint}")
            continue
        problem = _output_problem(graph, node, lib.get_function(node.func_name, dev))
        if problem:
            problems.append(f"{graph.source}: {node.label} on {dev.spec}: {problem}")
    return problems


def _output_problem(graph: Graph, node: Any, fn: Any) -> str:
    """Why the lib's function would not produce the node's declared outputs ("" when it would).

    Only functions that can say without a device (standard-op chains, via infer) are checked.
    """
    infer = getattr(fn, "infer", None)
    if infer is None:
        return ""
    in_specs = [TensorSpec(tuple(graph.shape(graph.entry_id(r[0], r[1]))),
                           graph.dtype(graph.entry_id(r[0], r[1]))) for r in node.inputs]
    want = [TensorSpec(tuple(graph.shape(e)), graph.dtype(e)) for e in graph.node_entries(node.nid)]
    if node.flatten_data:
        in_specs = [TensorSpec((int(np.prod(s.shape)),), s.dtype) for s in in_specs]
        want = [TensorSpec((int(np.prod(s.shape)),), s.dtype) for s in want]
    try:
        got = infer(in_specs, dict(node.attrs))
    except GraphRuntimeError as e:
        return str(e)
    if [(tuple(s.shape), str(s.dtype)) for s in got] != [(s.shape, s.dtype) for s in want]:
        return (f"{node.func_name!r} makes {', '.join(map(str, got))} but the graph declares "
                f"{', '.join(map(str, want))}")
    return ""


def params_problems(graph: Graph, path: Path) -> list[str]:
    """Params the graph has no input for, and params whose shape or dtype differ from it."""
    from ..params import load_params_file
    try:
        params = load_params_file(path)
    except GraphRuntimeError as e:
        return [str(e)]
    eids = graph.input_entries
    problems = []
    for name, value in params.items():
        eid = eids.get(name)
        if eid is None:
            problems.append(f"{path}: param {name!r} is not an input of the graph; "
                            f"inputs are: {', '.join(eids)}")
            continue
        want = (tuple(graph.shape(eid)), np.dtype(graph.dtype(eid)))
        if (tuple(value.shape), value.dtype) != want:
            problems.append(f"{path}: param {name!r} is {tuple(value.shape)} "
                            f"{value.dtype} but the graph's input {name!r} (eid {eid}) is "
                            f"{want[0]} {want[1]}")
    return problems
