"""Segments: a graph cut at the nodes whose output sizes depend on the data (NonZero, Unique...).

A node is a cut when its function is one op of lib/ops/data_dependent.py. Every other node
belongs to segment k, k being the number of cuts on its longest path from the inputs; the cuts
of level k run on the host after segment k and their outputs' sizes bind the symbolic dims
(`NonZero_y`) that segment k+1 is specialised for. Each segment is a graph of its own: the
entries it reads from outside become its inputs (graph inputs and params keep their names),
the entries read later or returned become its outputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..device import Device, cpu
from ..errors import GraphError, LibraryError
from ..graph.model import Graph, entry_bytes
from ..graph.symbolic import UNKNOWN, NAME, format_shape, names_in
from ..lib.library import Module
from ..lib.registry import OPS

# Zero-element inputs that carry a dim a segment needs but none of its inputs has as a plain
# name (`n` when its inputs are (n*4,)): shape (n, 0), so binding n costs no bytes.
CARRIER_PREFIX = "__dim."


@dataclass(frozen=True)
class Cut:
    """A node computed on the host between two segments; its outputs' dims bind symbols."""

    nid: int
    label: str
    op: str
    attrs: Mapping[str, Any]
    in_eids: tuple[int, ...]
    out_eids: tuple[int, ...]
    level: int

    def binds(self, graph: Graph) -> list[str]:
        dims: list[Any] = [d for e in self.out_eids for d in graph.shape(e)]
        return list(dict.fromkeys(d for d in dims if isinstance(d, str) and NAME.match(d)))


@dataclass(frozen=True)
class Segment:
    """One piece of the graph: its own graph, where its inputs come from, what it returns."""

    index: int
    graph: Graph
    inputs: tuple[tuple[str, int], ...]  # (input name in the segment, eid in the whole graph)
    outputs: tuple[int, ...]  # whole-graph eids, in the segment's head order
    carriers: tuple[str, ...]  # dim names fed by zero-size carrier inputs
    nids: tuple[int, ...]  # whole-graph node ids, by the segment's node id (-1: a carrier)
    eids: tuple[int, ...]  # whole-graph entry ids, by the segment's entry id (-1: a carrier)


def data_dependent_op(lib: Module, func_name: str | None) -> tuple[str, Mapping[str, Any]] | None:
    """(op, attrs) when func_name is one data-dependent op; None otherwise."""
    if not func_name:
        return None
    try:
        fn = lib.get_function(func_name, cpu(0))
    except LibraryError:
        return None
    steps = getattr(fn, "steps", None)
    if not steps or len(steps) != 1:
        return None
    op = OPS.get(getattr(steps[0], "op", ""))
    if op is None or op.host is None:
        return None
    return op.name, dict(steps[0].attrs)


def find_cuts(graph: Graph, lib: Module) -> list[Cut]:
    """The graph's data-dependent nodes with their levels, in node order."""
    level = [0] * graph.num_entries
    cuts = []
    for node in graph.nodes:
        if node.is_arg:
            continue
        in_eids = tuple(graph.entry_id(r[0], r[1]) for r in node.inputs)
        out_eids = tuple(graph.node_entries(node.nid))
        lvl = max((level[e] for e in in_eids), default=0)
        found = data_dependent_op(lib, node.func_name)
        if found is not None:
            cuts.append(Cut(node.nid, node.label, found[0], found[1], in_eids, out_eids, lvl))
            lvl += 1
        for e in out_eids:
            level[e] = lvl
    return cuts


def split(graph: Graph, lib: Module, cuts: Sequence[Cut]) -> list[Segment | None]:
    """Segments 0..max level + 1 (None where a segment has no node)."""
    cut_nids = {c.nid for c in cuts}
    level = [0] * graph.num_entries
    where: dict[int, int] = {}  # nid -> segment of a non-cut kernel node
    for node in graph.nodes:
        if node.is_arg:
            continue
        lvl = max((level[graph.entry_id(r[0], r[1])] for r in node.inputs), default=0)
        if node.nid in cut_nids:
            lvl += 1
        else:
            where[node.nid] = lvl
        for e in graph.node_entries(node.nid):
            level[e] = lvl
    count = max((c.level for c in cuts), default=-1) + 2
    readers: dict[int, set[int]] = {}
    for node in graph.nodes:
        for r in node.inputs:
            readers.setdefault(graph.entry_id(r[0], r[1]), set()).add(node.nid)
    heads = {graph.entry_id(h[0], h[1]) for h in graph.heads}
    return [_segment(graph, k, [n for n, s in where.items() if s == k], where, readers, heads)
            for k in range(count)]


def _segment(graph: Graph, k: int, nids: list[int], where: Mapping[int, int],
             readers: Mapping[int, set[int]], heads: set[int]) -> Segment | None:
    if not nids:
        return None
    inside = set(nids)
    docs: list[dict[str, Any]] = []
    eids: list[int] = []  # whole-graph eid of each segment entry
    local: dict[int, tuple[int, int]] = {}  # whole eid -> (segment nid, index)
    inputs: list[tuple[str, int]] = []
    names = {graph.nodes[nid].name for nid in nids}
    produced = {e for nid in nids for e in graph.node_entries(nid)}
    for nid in nids:
        for ref in graph.nodes[nid].inputs:
            eid = graph.entry_id(ref[0], ref[1])
            if eid in local or eid in produced:
                continue
            name = _boundary_name(graph, eid, names)
            local[eid] = (len(docs), 0)
            docs.append({"op": "null", "name": name, "inputs": []})
            eids.append(eid)
            inputs.append((name, eid))
    for nid in nids:
        node = graph.nodes[nid]
        doc = node.to_dict()
        doc["inputs"] = [[*local[graph.entry_id(r[0], r[1])], 0] for r in node.inputs]
        for index, eid in enumerate(graph.node_entries(nid)):
            local[eid] = (len(docs), index)
            eids.append(eid)
        docs.append(doc)
    outputs = [e for e in eids if graph.entry_node(e)[0] in inside
               and (e in heads or any(r not in inside for r in readers.get(e, ())))]
    carriers = _carriers(graph, eids, [e for _, e in inputs])
    for name in carriers:
        docs.append({"op": "null", "name": CARRIER_PREFIX + name, "inputs": []})
    shapes: list[list[Any]] = [list(graph.shape(e)) for e in eids]
    shapes += [[name, 0] for name in carriers]
    dtypes = [graph.dtype(e) for e in eids] + ["int8"] * len(carriers)
    columns: dict[str, Any] = {}
    for column in ("device_index", "device_id"):
        values = graph.column(column)
        if values is not None:
            pad = [values[eids[0]] if eids else 1] * len(carriers)
            columns[column] = [values[e] for e in eids] + pad
    whole = [graph.entry_node(e)[0] for e in eids[:len(inputs)]] + nids + [-1] * len(carriers)
    sub = Graph.build(docs, [list(local[e]) + [0] for e in outputs], shapes=shapes,
                      dtypes=dtypes, **columns)
    return Segment(k, sub, tuple(inputs), tuple(outputs), tuple(carriers), tuple(whole),
                   tuple(eids) + (-1,) * len(carriers))


def _boundary_name(graph: Graph, eid: int, taken: set[str]) -> str:
    nid, index = graph.entry_node(eid)
    base = graph.nodes[nid].name + (f":{index}" if index and not graph.nodes[nid].is_arg else "")
    name = base
    while name in taken:
        name = f"{base}#{eid}"
    taken.add(name)
    return name


def _carriers(graph: Graph, eids: Sequence[int], input_eids: Sequence[int]) -> list[str]:
    """Names a segment's shapes use that no input dim binds by itself."""
    bound = {d for e in input_eids for d in graph.shape(e) if isinstance(d, str)
             and d != UNKNOWN and NAME.match(d)}
    used = [n for e in eids for d in graph.shape(e) for n in names_in(d)]
    return [n for n in dict.fromkeys(used) if n not in bound]


def describe_cuts(graph: Graph, cuts: Sequence[Cut]) -> list[str]:
    """One line per cut: the node, the segment it follows, the sizes the data decides there."""
    return [f"cut {i}: {c.label} ({c.op}) after segment {c.level}, binds "
            f"{', '.join(c.binds(graph)) or 'no dim'}; outputs "
            + ", ".join(format_shape(graph.shape(e)) for e in c.out_eids)
            for i, c in enumerate(cuts)]


def plan_static(segment: Segment, entry_device: Sequence[Device]) -> Graph:
    """A static segment's graph with storage planned by liveness (symbolic ones plan per shape)."""
    from ..graph.storage_plan import plan_storage
    g = segment.graph
    if g.is_symbolic:
        return g
    sizes = [entry_bytes(g.shape(e), g.dtype(e)) for e in range(g.num_entries)]
    return g.with_columns(storage_id=plan_storage(g, sizes, list(entry_device)).storage_ids)


def bind_outputs(cut: Cut, graph: Graph, results: Sequence[Any], env: dict[str, int]) -> None:
    """Check a cut's host results against the graph's declared dtypes and ranks; bind the names
    its outputs' dims carry into env (GraphError naming the node when they disagree)."""
    if len(results) != len(cut.out_eids):
        raise GraphError(f"{cut.label} ({cut.op}): gave {len(results)} outputs, the graph "
                         f"declares {len(cut.out_eids)}")
    for eid, array in zip(cut.out_eids, results):
        declared = graph.shape(eid)
        if array.ndim != len(declared) or str(array.dtype) != graph.dtype(eid):
            raise GraphError(f"{cut.label} ({cut.op}) output eid {eid}: gave "
                             f"{tuple(array.shape)} {array.dtype}, the graph declares "
                             f"{format_shape(declared)} {graph.dtype(eid)}")
        for axis, (want, got) in enumerate(zip(declared, array.shape)):
            if isinstance(want, str) and NAME.match(want):
                if env.setdefault(want, int(got)) != got:
                    raise GraphError(f"{cut.label} ({cut.op}) output eid {eid} dim {axis}: "
                                     f"{want} = {got} here but {env[want]} elsewhere")
            elif isinstance(want, int) and want != got:
                raise GraphError(f"{cut.label} ({cut.op}) output eid {eid} dim {axis}: "
                                 f"{got}, the graph declares {want}")
