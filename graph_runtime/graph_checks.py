"""Semantic checks of a schema-valid graph: order, node_row_ptr, arg_nodes, heads, columns."""
from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .schema import json_path

if TYPE_CHECKING:
    from .graph import Graph, Node


def schema_labels(doc: Any) -> Callable[[Sequence[str | int]], str]:
    """where(path) for schema messages: the node or entry a path points into."""
    row_ptr: list[int] | None = None
    row_ptr_read = False

    def node_label(nid: int) -> str:
        nodes = doc.get("nodes")
        node = nodes[nid] if isinstance(nodes, list) and nid < len(nodes) else None
        name = node.get("name") if isinstance(node, dict) else None
        return f"node {nid} {name!r}" if isinstance(name, str) else f"node {nid}"

    def entry_label(eid: int) -> str:
        nonlocal row_ptr, row_ptr_read
        if not row_ptr_read:
            row_ptr_read = True
            ptr = doc.get("node_row_ptr")
            if (isinstance(ptr, list) and ptr and ptr[0] == 0
                    and all(type(p) is int for p in ptr)
                    and all(a <= b for a, b in zip(ptr, ptr[1:]))):
                row_ptr = ptr
        if row_ptr is None or eid >= row_ptr[-1]:
            return f"eid {eid}"
        nid = bisect_right(row_ptr, eid) - 1
        return f"{node_label(nid)} entry {nid}:{eid - row_ptr[nid]} (eid {eid})"

    def where(path: Sequence[str | int]) -> str:
        if not isinstance(doc, dict) or len(path) < 2 or not isinstance(path[1], (int, str)):
            return ""
        if path[0] == "nodes" and isinstance(path[1], int):
            return node_label(path[1])
        if path[0] == "attrs" and len(path) >= 4 and path[2] == 1 and isinstance(path[3], int):
            return entry_label(path[3])
        return ""

    return where


def semantic_problems(g: Graph) -> list[str]:
    """Cross-reference problems of a schema-valid graph, each as ": ..." or " at $.path: ..."."""
    out: list[str] = []
    for node in g.nodes:
        out += _node_problems(node)
    outputs = [node.num_outputs for node in g.nodes]
    for node in g.nodes:
        for position, entry in enumerate(node.inputs):
            problem = _reference_problem(g, outputs, entry, node.nid)
            if problem:
                out.append(f": {node.label} input {position} {problem}")
    for position, head in enumerate(g.heads):
        problem = _reference_problem(g, outputs, head, len(g.nodes))
        if problem:
            out.append(f" at {json_path(['heads', position])}: head {position} {problem}")
    row_ptr = [0, *accumulate(outputs)]
    out += _row_ptr_problems(g, row_ptr)
    out += _arg_node_problems(g)
    for name, (tag, values) in g.attrs.items():
        if len(values) != row_ptr[-1]:
            out.append(f" at {json_path(['attrs', name])}: expected {row_ptr[-1]} values "
                       f"(one per entry: the nodes have {row_ptr[-1]} outputs in all), "
                       f"got {len(values)}")
    return out


def _node_problems(node: Node) -> list[str]:
    out = []
    if "attr" in node.extra:
        out.append(f": {node.label} has both 'attr' and 'attrs'; keep only 'attrs'")
    if node.is_arg:
        if node.inputs:
            out.append(f": {node.label} is a 'null' (input) node but has "
                       f"{count_of(len(node.inputs), 'input')}; expected none")
        if node.num_outputs != 1:
            out.append(f": {node.label} is a 'null' (input) node with attrs.num_outputs "
                       f"{node.num_outputs}; input nodes have exactly 1 output")
        return out
    if node.func_name is None:
        out.append(f": {node.label} is a tvm_op node without attrs.func_name; "
                   f"every tvm_op node names its kernel")
    if node.num_inputs != len(node.inputs):
        out.append(f": {node.label} has attrs.num_inputs {node.num_inputs} but "
                   f"{len(node.inputs)} inputs")
    return out


def _reference_problem(g: Graph, outputs: list[int], entry: tuple[int, ...],
                       before: int) -> str:
    """What is wrong with an [nid, index, version] reference read by node `before`, or ""."""
    nid, index = entry[0], entry[1]
    if nid >= len(g.nodes):
        return f"refers to node {nid}, which does not exist (the graph has {len(g.nodes)} nodes)"
    if nid == before:
        return f"refers to node {nid} itself; nodes must be in topological order"
    if nid > before:
        return f"refers to node {nid}, which comes later; nodes must be in topological order"
    if index >= outputs[nid]:
        return (f"refers to output {index} of {g.nodes[nid].label}, which has "
                f"{count_of(outputs[nid], 'output')}")
    return ""


def _row_ptr_problems(g: Graph, row_ptr: list[int]) -> list[str]:
    """node_row_ptr must be the prefix sums of the nodes' outputs; report the first difference."""
    given = g.node_row_ptr
    where = f" at {json_path(['node_row_ptr'])}"
    if len(given) != len(row_ptr):
        return [f"{where}: expected {len(row_ptr)} items (num_nodes + 1), got {len(given)}"]
    for nid, (got, expected) in enumerate(zip(given, row_ptr)):
        if got != expected:
            if nid == 0:
                return [f"{where}[0]: expected 0, got {got}"]
            node = g.nodes[nid - 1]
            return [f"{where}[{nid}]: expected {expected} ({node.label} starts at entry "
                    f"{row_ptr[nid - 1]} and has {count_of(node.num_outputs, 'output')}), "
                    f"got {got}"]
    return []


def _arg_node_problems(g: Graph) -> list[str]:
    """arg_nodes must list exactly the 'null' nodes, in node order; their names must be unique."""
    out = []
    where = json_path(["arg_nodes"])
    first_at: dict[int, int] = {}
    for position, nid in enumerate(g.arg_nodes):
        at = f" at {where}[{position}]"
        if nid >= len(g.nodes):
            out.append(f"{at}: node {nid} does not exist (the graph has {len(g.nodes)} nodes)")
        elif not g.nodes[nid].is_arg:
            out.append(f"{at}: {g.nodes[nid].label} is a {g.nodes[nid].op!r} node; "
                       f"arg_nodes lists only 'null' nodes")
        elif nid in first_at:
            out.append(f"{at}: {g.nodes[nid].label} is listed twice "
                       f"(first at {where}[{first_at[nid]}])")
        else:
            first_at[nid] = position
    names: dict[str, int] = {}
    for node in g.nodes:
        if not node.is_arg:
            continue
        if node.nid not in first_at:
            out.append(f" at {where}: {node.label} is a 'null' (input) node missing from "
                       f"arg_nodes")
        if node.name in names:
            out.append(f": {node.label} has the same name as node {names[node.name]}; input "
                       f"names must be unique (inputs are addressed by name)")
        else:
            names[node.name] = node.nid
    if not out and list(g.arg_nodes) != sorted(g.arg_nodes):
        out.append(f" at {where}: expected the 'null' nodes in node order "
                   f"{sorted(g.arg_nodes)[:8]}, got {list(g.arg_nodes)[:8]}")
    return out


def count_of(count: int, noun: str) -> str:
    """ "1 output", "2 outputs"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
