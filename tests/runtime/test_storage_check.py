"""Storage plans checked by liveness at create(): two live entries never share a storage id."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import copy_op, make_graph, null, tvm_op

import graph_runtime as gr
from graph_runtime.errors import GraphError
from graph_runtime.graph.model import Graph
from graph_runtime.planner import plan_graph
from graph_runtime.runtime.storage_check import check_liveness


def _exp_neg_add(sids: list[int]):
    nodes = [null("x"), tvm_op("y", "exp", [0]), tvm_op("z", "negative", [0]),
             tvm_op("out", "add", [1, 2])]
    return make_graph(nodes, [3], storage_ids=sids)


def test_two_live_temporaries_sharing_an_id_are_refused_naming_both() -> None:
    # The case: y and z both at sid 1 gave [-0, -2, -4, -6] silently.
    g = _exp_neg_add([0, 1, 1, 2])
    with pytest.raises(GraphError, match=r"storage id 1 is shared by node 1 'y' entry 1:0 \(eid "
                                         r"1\) and node 2 'z' entry 2:0 \(eid 2\) while both are "
                                         r"live: eid 1 is still read up to node 3 'out'"):
        gr.create(g, None, gr.cpu())


def test_a_legal_plan_runs_right() -> None:
    g = _exp_neg_add([0, 1, 2, 3])
    m = gr.create(g, None, gr.cpu())
    x = np.arange(4, dtype="float32")
    m.run(x=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), np.exp(x) - x, rtol=1e-6)


def test_an_op_never_shares_storage_with_its_own_input() -> None:
    nodes = [null("x"), tvm_op("a", "relu", [0]), tvm_op("b", "exp", [1]), tvm_op("c", "exp", [2])]
    with pytest.raises(GraphError, match=r"node 1 'a' entry 1:0 \(eid 1\) and node 2 'b' entry "
                                         r"2:0 \(eid 2\).*still read by node 2 'b' itself"):
        check_liveness(make_graph(nodes, [3], storage_ids=[0, 1, 1, 2]))
    # Reuse after the last reader is fine: a at 1, c at 1 (b read a, c reads b).
    check_liveness(make_graph(nodes, [3], storage_ids=[0, 1, 2, 1]))


def test_inputs_and_outputs_live_throughout() -> None:
    nodes = [null("x"), tvm_op("a", "relu", [0]), tvm_op("b", "exp", [1])]
    with pytest.raises(GraphError, match=r"node 0 'x' entry 0:0 \(eid 0\).*an input, which lives"):
        check_liveness(make_graph(nodes, [2], storage_ids=[0, 1, 0]))
    nodes = [null("x"), tvm_op("a", "relu", [0]), tvm_op("b", "exp", [0]), tvm_op("c", "exp", [2])]
    with pytest.raises(GraphError, match=r"node 1 'a' entry 1:0 \(eid 1\).*a graph output"):
        check_liveness(make_graph(nodes, [1, 3], storage_ids=[0, 1, 2, 1]))


def test_two_outputs_of_one_node_never_share() -> None:
    nodes = [null("x"), tvm_op("s", "split", [0], num_outputs=2, indices_or_sections="2"),
             tvm_op("a", "add", [(1, 0), (1, 1)])]
    g = make_graph(nodes, [2], shapes=[[4], [2], [2], [2]], storage_ids=[0, 1, 1, 2])
    with pytest.raises(GraphError, match=r"storage id 1 is shared by node 1 's' entry 1:0 \(eid "
                                         r"1\) and node 1 's' entry 1:1 \(eid 2\).*another output of "
                                         r"node 1 's'"):
        check_liveness(g)


def test_a_nop_output_aliases_its_input() -> None:
    nodes = [null("x"), tvm_op("a", "relu", [0]), tvm_op("r", "__nop", [1]),
             tvm_op("b", "exp", [2])]
    check_liveness(make_graph(nodes, [3], storage_ids=[0, 1, 1, 2]))
    # The alias keeps the source alive until the nop's readers are done.
    nodes.append(tvm_op("c", "exp", [3]))
    with pytest.raises(GraphError, match="storage id 1"):
        check_liveness(make_graph(nodes, [4], storage_ids=[0, 1, 1, 1, 2]))


def test_an_in_place_pair_may_meet_at_its_node_only() -> None:
    """The executor's in-place writes (runtime/in_place.py): b = add(a, x) written over a,
    which b's node reads last, is allowed when said; a read again later never is."""
    nodes = [null("x"), tvm_op("a", "relu", [0]), tvm_op("b", "add", [1, 0]),
             tvm_op("c", "exp", [2])]
    g = make_graph(nodes, [3], storage_ids=[0, 1, 2, 3])
    check_liveness(g, [0, 1, 1, 3], [(1, 2)])
    with pytest.raises(GraphError, match=r"storage id 1 .*eid 1 is still read by node 2 'b'"):
        check_liveness(g, [0, 1, 1, 3])
    nodes.append(tvm_op("d", "add", [3, 1]))  # a read by d too
    g = make_graph(nodes, [4], storage_ids=[0, 1, 2, 3, 4])
    with pytest.raises(GraphError, match=r"eid 1 is still read up to node 4 'd'"):
        check_liveness(g, [0, 1, 1, 3, 4], [(1, 2)])


def test_a_copy_onto_its_own_storage_is_refused_at_create() -> None:
    nodes = [null("x"), tvm_op("a", "relu", [0]), copy_op("c", 1), tvm_op("b", "exp", [2])]
    g = make_graph(nodes, [3], storage_ids=[0, 1, 1, 2])
    with pytest.raises(GraphError, match=r"node 1 'a' entry 1:0 \(eid 1\) and node 2 'c' entry "
                                         r"2:0 \(eid 2\).*itself"):
        gr.create(g, None, gr.cpu())


def _chain(n: int) -> Any:
    nodes = [null("x")] + [tvm_op(f"n{k}", "relu", [k]) for k in range(n)]
    sids = [0] + [1 + (k % 2) for k in range(n - 1)] + [3]
    return make_graph(nodes, [n], storage_ids=sids)


def _seconds(g: Any) -> float:
    """The fastest of three checks (a neighbour's spinning thread or a collection makes one
    slow, not all three)."""
    found = []
    for _ in range(3):
        start = time.perf_counter()
        check_liveness(g)
        found.append(time.perf_counter() - start)
    return min(found)


def test_a_ten_thousand_node_graph_is_checked_fast() -> None:
    """Linear in the nodes: ten times the nodes take about ten times as long, far from the
    hundred a check comparing every pair would (0.26 s for 10,000 here, alone; an absolute
    bound failed at 1.04 s inside the whole suite on a 2-vCPU VM)."""
    small, large = _seconds(_chain(1_000)), _seconds(_chain(10_000))
    assert large < 40 * small + 0.05, (small, large)


EXAMPLES = sorted(p.parent for p in (Path(__file__).parents[2] / "examples" / "graphs").glob(
    "*/graph.json"))


@pytest.mark.parametrize("folder", EXAMPLES, ids=lambda p: p.name)
def test_examples_and_their_planned_graphs_pass(folder: Path) -> None:
    g = Graph.from_json(folder / "graph.json")
    check_liveness(g)
    for placement in (None, {"default_device": "opencl"}):
        check_liveness(plan_graph(g, placement).graph)
