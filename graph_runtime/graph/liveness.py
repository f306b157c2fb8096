"""Liveness: each entry's life over the node order and the alias group it belongs to.

One model for everything that reuses storage: the check of a graph's storage plan at
create() (runtime/storage_check.py), the planner's storage plan (graph/storage_plan.py) and
the executor's choice to read a same-device `__copy`'s output from its source
(runtime/executor.py) and its flattens skipped (runtime/flatten_reads.py).

Steps are node ids. An entry is written by its node and read up to its last reader, inclusive,
so an op's output never shares storage with its own inputs. Graph inputs and params are written
before the run (step -1); they and the graph outputs live up to step num_nodes, after the last
node. A `__nop` node runs nothing: its output k is an alias of its input k, the same value, so
it joins that input's group, and a group's life covers all of its entries' lives.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Protocol, Sequence

from .model import NOP_OP


class LiveNode(Protocol):
    """What liveness reads of a node: graph.model.Node and planner's PlanNode both have it."""

    @property
    def is_arg(self) -> bool: ...

    @property
    def func_name(self) -> str | None: ...

    @property
    def inputs(self) -> Sequence[Sequence[int]]: ...

    @property
    def num_outputs(self) -> int: ...


@dataclass(frozen=True)
class Liveness:
    """Per entry: its writer, last reader and alias group, and its group's life in steps."""

    num_nodes: int
    writer: tuple[int, ...]      # the node that writes the entry (an input's own null node)
    last_read: tuple[int, ...]   # the last node that reads the entry itself; -1 when none does
    group: tuple[int, ...]       # the group's root: its first entry, the one not aliasing another
    start: tuple[int, ...]       # the group's first step: its root's writer, -1 for an input
    end: tuple[int, ...]         # the group's last step: num_nodes when it holds an input/output
    # The graph's storage ids when it has them (None while planning them).
    storage_ids: tuple[int, ...] | None = field(default=None, repr=False)

    @property
    def roots(self) -> list[int]:
        """The root entry of each group, in entry order: one per value that needs storage."""
        return [eid for eid, root in enumerate(self.group) if root == eid]

    def held(self, eid: int) -> bool:
        """Whether eid's group holds a graph input, param or output, which own their storage
        for the whole run."""
        return self.end[eid] == self.num_nodes

    def aliased(self, eid: int) -> bool:
        """Whether another entry holds eid's value (a `__nop` reads it or it reads one)."""
        return self.group[eid] != eid or eid in self._roots_with_aliases

    def written_between(self, eid: int, after: int, until: int) -> bool:
        """Whether a node other than eid's writer writes eid's storage id at a step in
        (after, until]; `__nop` nodes count, as they write the ids of their outputs."""
        if self.storage_ids is None:
            raise ValueError("written_between needs storage ids: use a graph's liveness")
        own = self.writer[eid]
        writers = self._writers_by_storage[self.storage_ids[eid]]
        return any(after < w <= until for w in writers if w != own)

    def with_storage_ids(self, storage_ids: Sequence[int]) -> Liveness:
        """The same lives and groups over other storage ids (the executor's, after
        runtime/in_place.py moved entries that alias nothing), for written_between."""
        return replace(self, storage_ids=tuple(storage_ids))

    @cached_property
    def _roots_with_aliases(self) -> set[int]:
        return {root for eid, root in enumerate(self.group) if root != eid}

    @cached_property
    def _writers_by_storage(self) -> dict[int, list[int]]:
        assert self.storage_ids is not None
        writers: dict[int, list[int]] = {}
        for eid, sid in enumerate(self.storage_ids):
            writers.setdefault(sid, []).append(self.writer[eid])
        return writers


def liveness(nodes: Sequence[LiveNode], heads: Sequence[Sequence[int]],
             storage_ids: Sequence[int] | None = None) -> Liveness:
    """The lives and alias groups of a graph's entries; linear in nodes and edges.

    Args:
        nodes: in topological order; inputs are (node id, output index[, version]).
        heads: the graph outputs as (node id, output index[, version]).
        storage_ids: a planned graph's; then a `__nop` output aliases its input only where the
            two share a storage id (otherwise it is a value of its own). None while planning:
            every `__nop` output aliases its input.
    """
    row_ptr = [0]
    for node in nodes:
        row_ptr.append(row_ptr[-1] + node.num_outputs)
    num = row_ptr[-1]
    last = len(nodes)
    writer = [0] * num
    last_read = [-1] * num
    start = [0] * num
    end = [0] * num
    for nid, node in enumerate(nodes):
        for eid in range(row_ptr[nid], row_ptr[nid + 1]):
            writer[eid] = nid
            start[eid] = -1 if node.is_arg else nid
            end[eid] = last if node.is_arg else nid
        for ref in node.inputs:
            eid = row_ptr[ref[0]] + ref[1]
            last_read[eid] = nid
            if end[eid] < nid:
                end[eid] = nid
    for ref in heads:
        end[row_ptr[ref[0]] + ref[1]] = last
    group = list(range(num))
    for nid, node in enumerate(nodes):
        if node.func_name != NOP_OP:
            continue
        for k, ref in enumerate(node.inputs[:node.num_outputs]):
            # Inputs come before the node, so their root is settled and smaller.
            root = group[row_ptr[ref[0]] + ref[1]]
            out = row_ptr[nid] + k
            if storage_ids is None or storage_ids[root] == storage_ids[out]:
                group[out] = root
    # One life per value: an alias extends its root's life; every member then reads it.
    for eid in range(num):
        root = group[eid]
        if root != eid:
            start[root] = min(start[root], start[eid])
            end[root] = max(end[root], end[eid])
    return Liveness(last, tuple(writer), tuple(last_read), tuple(group),
                    tuple(start[root] for root in group), tuple(end[root] for root in group),
                    None if storage_ids is None else tuple(storage_ids))
