"""Checks a graph's storage plan by liveness: no two entries sharing a storage id are live at once.

TVM trusts the compiler's plan; we check it, because a bad plan gives wrong answers silently.
Rules (the same as planner/storage_plan.py): an entry lives from the node that writes it to its
last reader, inclusive, so an op's output never shares storage with its own inputs; graph inputs,
params and outputs live for the whole run; a `__nop` output sharing its input's storage id is an
alias of that input (it runs nothing), not a second value.
"""
from __future__ import annotations

from typing import Any

from ..errors import GraphError
from ..graph.model import NOP_OP


def check_liveness(graph: Any) -> None:
    """GraphError naming both entries and the storage id if two live entries share storage.

    Linear in nodes and edges plus a sort per storage id.
    """
    num = graph.num_entries
    last = graph.num_nodes
    start = [0] * num
    end = [0] * num
    owner = [0] * num
    for node in graph.nodes:
        for eid in graph.node_entries(node.nid):
            owner[eid] = node.nid
            start[eid] = end[eid] = -1 if node.is_arg else node.nid
            if node.is_arg:
                end[eid] = last
    for node in graph.nodes:
        for ref in node.inputs:
            eid = graph.entry_id(ref[0], ref[1])
            if end[eid] < node.nid:
                end[eid] = node.nid
    for eid in graph.output_entries:
        end[eid] = last
    group = list(range(num))
    for node in graph.nodes:
        if node.func_name != NOP_OP:
            continue
        outs = graph.node_entries(node.nid)
        for k, ref in enumerate(node.inputs[:len(outs)]):
            src = group[graph.entry_id(ref[0], ref[1])]
            out = outs[k]
            if graph.storage_id(src) == graph.storage_id(out):
                group[out] = src
    # One life per value: an aliasing __nop output extends its source's life.
    for eid in range(num):
        root = group[eid]
        if root != eid:
            start[root] = min(start[root], start[eid])
            end[root] = max(end[root], end[eid])
    by_sid: dict[int, list[int]] = {}
    for eid in range(num):
        if group[eid] == eid:
            by_sid.setdefault(graph.storage_id(eid), []).append(eid)
    for sid, eids in by_sid.items():
        if len(eids) < 2:
            continue
        eids.sort(key=lambda e: (start[e], e))
        holder = eids[0]
        for eid in eids[1:]:
            if start[eid] <= end[holder]:
                raise GraphError(_overlap_message(graph, sid, holder, eid, end, owner))
            if end[eid] > end[holder]:
                holder = eid


def _overlap_message(graph: Any, sid: int, a: int, b: int, end: list[int],
                     owner: list[int]) -> str:
    last = graph.num_nodes
    a_node = graph.nodes[owner[a]]
    b_node = graph.nodes[owner[b]]
    if owner[a] == owner[b]:
        why = f"another output of {a_node.label}, written at the same time"
    elif end[a] >= last:
        why = ("an input" if a_node.is_arg else "a graph output") + ", which lives throughout"
    elif end[a] == owner[b]:
        why = f"still read by {b_node.label} itself, so an op would overwrite its own input"
    else:
        why = f"still read up to node {end[a]} '{graph.nodes[end[a]].name}'"
    return (f"{graph.source}: storage id {sid} is shared by {graph.entry_label(a)} and "
            f"{graph.entry_label(b)} while both are live: eid {a} is {why}, when eid {b} is "
            "written; give them different storage ids")
