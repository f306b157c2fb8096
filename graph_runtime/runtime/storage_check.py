"""Checks a graph's storage plan by liveness: no two entries sharing a storage id are live at once.

TVM trusts the compiler's plan; we check it, because a bad plan gives wrong answers silently.
The lives and alias groups are graph/liveness.py's: a value lives from the node that writes it to
its last reader, inclusive; graph inputs, params and outputs for the whole run; a `__nop` output
sharing its input's storage id is an alias of that input, not a second value. The executor's
in-place writes (runtime/in_place.py) are checked here too: an output may share its input's
storage at the one node that reads that input last and writes the output over it.
"""
from __future__ import annotations

from typing import Collection, Sequence

from ..errors import GraphError
from ..graph.liveness import Liveness
from ..graph.model import Graph


def check_liveness(graph: Graph, storage_ids: Sequence[int] | None = None,
                   in_place: Collection[tuple[int, int]] = ()) -> None:
    """GraphError naming both entries and the storage id if two live entries share storage.

    Linear in nodes and edges plus a sort per storage id.

    Args:
        storage_ids: per entry, the ids to check instead of the graph's (the executor's).
        in_place: (input eid, output eid) pairs whose node reads the input last and writes the
            output over it: the two may meet at that node, and only there.
    """
    live = graph.liveness
    sids = [graph.storage_id(e) for e in range(graph.num_entries)] if storage_ids is None \
        else storage_ids
    allowed = set(in_place)
    by_sid: dict[int, list[int]] = {}
    for eid in live.roots:
        by_sid.setdefault(sids[eid], []).append(eid)
    for sid, eids in by_sid.items():
        if len(eids) < 2:
            continue
        eids.sort(key=lambda e: (live.start[e], e))
        holder = eids[0]
        for eid in eids[1:]:
            meet = live.start[eid] == live.end[holder] == live.writer[eid]
            if live.start[eid] <= live.end[holder] and not (meet and (holder, eid) in allowed):
                raise GraphError(_overlap_message(graph, live, sid, holder, eid))
            if live.end[eid] > live.end[holder]:
                holder = eid


def _overlap_message(graph: Graph, live: Liveness, sid: int, a: int, b: int) -> str:
    a_nid = live.writer[a]
    b_nid = live.writer[b]
    a_node = graph.nodes[a_nid]
    b_node = graph.nodes[b_nid]
    end = live.end[a]
    if a_nid == b_nid:
        why = f"another output of {a_node.label}, written at the same time"
    elif end >= live.num_nodes:
        why = ("an input" if a_node.is_arg else "a graph output") + ", which lives throughout"
    elif end == b_nid:
        why = f"still read by {b_node.label} itself, so an op would overwrite its own input"
    else:
        why = f"still read up to node {end} '{graph.nodes[end].name}'"
    return (f"{graph.source}: storage id {sid} is shared by {graph.entry_label(a)} and "
            f"{graph.entry_label(b)} while both are live: eid {a} is {why}, when eid {b} is "
            "written; give them different storage ids")
