"""Tests for graph_runtime.graph.liveness: writers, last readers, alias groups and lives."""
from __future__ import annotations

import pytest
from support import copy_op, make_graph, null, tvm_op

from graph_runtime.graph.liveness import liveness
from graph_runtime.graph.topology import topology_of


def _nop_split_graph(heads: list, storage_ids: tuple[int, ...] = (0, 1, 1, 2, 3, 4, 5)):
    """x -> a=exp -> r=__nop(a) -> s=split(r) -> b=add(s:0, s:1) -> d=negative; eids 0..6.

    By default r shares a's storage id, as a `__nop` output does.
    """
    nodes = [null("x"), tvm_op("a", "exp", [0]), tvm_op("r", "__nop", [1]),
             tvm_op("s", "split", [2], num_outputs=2, indices_or_sections="2"),
             tvm_op("b", "add", [(3, 0), (3, 1)]), tvm_op("d", "negative", [4])]
    shapes = [[4], [4], [4], [2], [2], [2], [2]]
    return make_graph(nodes, heads, shapes=shapes, storage_ids=list(storage_ids))


def test_lives_of_a_chain_with_a_nop_and_a_two_output_node() -> None:
    live = _nop_split_graph([5]).liveness
    assert live.num_nodes == 6
    assert live.writer == (0, 1, 2, 3, 3, 4, 5)
    assert live.last_read == (1, 2, 3, 4, 4, 5, -1)
    # The nop's output r (eid 2) is a's value (eid 1): one group, one life up to r's reader.
    assert live.group == (0, 1, 1, 3, 4, 5, 6)
    assert live.roots == [0, 1, 3, 4, 5, 6]
    # The input starts before the first node; it and the output live to num_nodes.
    assert live.start == (-1, 1, 1, 3, 3, 4, 5)
    assert live.end == (6, 3, 3, 4, 4, 5, 6)
    assert [live.held(eid) for eid in range(7)] == [True] + [False] * 5 + [True]


def test_a_nop_output_that_is_a_graph_output_holds_its_source_throughout() -> None:
    live = _nop_split_graph([2, 5]).liveness
    assert live.group[2] == 1
    assert live.start[1] == live.start[2] == 1
    assert live.end[1] == live.end[2] == 6
    assert live.held(1) and live.held(2)


def test_aliased_names_both_ends_of_a_nop() -> None:
    live = _nop_split_graph([5]).liveness
    assert [live.aliased(eid) for eid in range(7)] == [False, True, True] + [False] * 4


def test_a_nop_of_an_input_joins_the_input() -> None:
    nodes = [null("x"), tvm_op("r", "__nop", [0]), tvm_op("a", "exp", [1])]
    live = make_graph(nodes, [2], storage_ids=[0, 0, 1]).liveness
    assert live.group == (0, 0, 2)
    assert live.start == (-1, -1, 2)
    assert live.end == (3, 3, 3)
    assert live.held(1)


def test_a_nop_output_with_its_own_storage_id_is_a_value_of_its_own() -> None:
    # Storage ids as given: r (eid 2) does not share a's id, so it is not a's alias.
    live = _nop_split_graph([5], storage_ids=(0, 1, 2, 3, 4, 5, 6)).liveness
    assert live.group == (0, 1, 2, 3, 4, 5, 6)
    assert (live.start[1], live.end[1]) == (1, 2)
    assert (live.start[2], live.end[2]) == (2, 3)
    # While planning (no storage ids) it always is.
    g = _nop_split_graph([5], storage_ids=(0, 1, 2, 3, 4, 5, 6))
    assert liveness(g.nodes, g.heads).group[2] == 1


def test_a_topology_and_its_graph_give_the_same_lives() -> None:
    g = _nop_split_graph([2, 5])
    topo = topology_of(g)
    assert liveness(topo.nodes, topo.heads) == liveness(g.nodes, g.heads)


def test_an_entry_nothing_reads_lives_at_its_writer_only() -> None:
    nodes = [null("x"), tvm_op("s", "split", [0], num_outputs=2, indices_or_sections="2"),
             tvm_op("a", "exp", [(1, 1)])]
    live = make_graph(nodes, [2], shapes=[[4], [2], [2], [2]]).liveness
    assert live.last_read == (1, -1, 2, -1)
    assert (live.start[1], live.end[1]) == (1, 1)
    assert (live.start[2], live.end[2]) == (1, 2)


def test_written_between_sees_another_writer_of_the_storage_id() -> None:
    # a (sid 1) is copied to c; b reuses sid 1 once a is dead, while still reading c.
    nodes = [null("x"), tvm_op("a", "exp", [0]), copy_op("c", 1), tvm_op("b", "negative", [2]),
             tvm_op("out", "exp", [3])]
    live = make_graph(nodes, [4], storage_ids=[0, 1, 2, 1, 3]).liveness
    assert live.last_read[2] == 3
    assert live.written_between(1, 2, live.last_read[2])
    assert not live.written_between(1, 3, 4)
    # a's own writer (node 1) never counts; b's counts for a and a's for b.
    assert not live.written_between(1, 0, 2)
    assert live.written_between(3, 0, 1)
    assert not live.written_between(3, 1, 4)


def test_written_between_over_other_storage_ids() -> None:
    """The executor's ids after in-place moves (runtime/flatten_reads.py asks over them)."""
    nodes = [null("x"), tvm_op("a", "exp", [0]), copy_op("c", 1), tvm_op("b", "negative", [2]),
             tvm_op("out", "exp", [3])]
    live = make_graph(nodes, [4], storage_ids=[0, 1, 2, 1, 3]).liveness
    moved = live.with_storage_ids([0, 1, 2, 4, 3])  # b moved out of a's id
    assert not moved.written_between(1, 2, 3) and live.written_between(1, 2, 3)
    assert moved.group == live.group and moved.last_read == live.last_read
    assert live.storage_ids == (0, 1, 2, 1, 3)


def test_written_between_needs_storage_ids() -> None:
    g = _nop_split_graph([5])
    with pytest.raises(ValueError, match="storage ids"):
        liveness(g.nodes, g.heads).written_between(1, 0, 6)


def test_a_graph_computes_its_liveness_once() -> None:
    g = _nop_split_graph([5])
    assert g.liveness is g.liveness
