"""Topology: the plain-data view of a graph that the planner solves over (nodes, edges, heads)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import PlanError
from .model import COPY_OP, Graph


@dataclass(frozen=True)
class PlanNode:
    """One node as the planner sees it: its name, kernel and the entries it reads.

    Why not graph.model.Node: the planner builds new graphs (copies added, nodes renumbered)
    from plain records, before any shape, dtype or column exists; graph.model.Node is a node of
    a checked, complete graph and cannot exist without one.
    """

    name: str
    op: str = "tvm_op"
    func_name: str | None = None
    inputs: tuple[tuple[int, int], ...] = ()
    num_outputs: int = 1

    @property
    def is_arg(self) -> bool:
        return self.op == "null"

    @property
    def is_copy(self) -> bool:
        return self.func_name == COPY_OP


@dataclass(frozen=True)
class Topology:
    """Nodes in topological order and the head entries, as (nid, index)."""

    nodes: tuple[PlanNode, ...]
    heads: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        for nid, node in enumerate(self.nodes):
            for pos, (src, index) in enumerate(node.inputs):
                if not 0 <= src < nid:
                    raise PlanError(f"{self.label(nid)} input {pos} reads node {src}, which does "
                                    "not come before it; nodes must be in topological order")
                if not 0 <= index < self.nodes[src].num_outputs:
                    raise PlanError(f"{self.label(nid)} input {pos} reads output {index} of "
                                    f"{self.label(src)}, which has "
                                    f"{self.nodes[src].num_outputs} outputs")
        for k, (src, index) in enumerate(self.heads):
            if not 0 <= src < len(self.nodes) or index >= self.nodes[src].num_outputs:
                raise PlanError(f"head {k} names entry {src}:{index}, which does not exist")

    def label(self, nid: int) -> str:
        return f"node {nid} {self.nodes[nid].name!r}"


def topology_of(graph: Graph) -> Topology:
    """The Topology of a graph_runtime.graph.Graph."""
    nodes = []
    for node in graph.nodes:
        inputs = tuple((int(ref[0]), int(ref[1])) for ref in node.inputs)
        nodes.append(PlanNode(node.name, node.op, node.func_name, inputs, node.num_outputs))
    heads = tuple((int(ref[0]), int(ref[1])) for ref in graph.heads)
    return Topology(tuple(nodes), heads)
