"""Device planner: VirtualDevice join/default, placement parsing, and each planning rule."""
from __future__ import annotations

import json

import pytest
from support import copy_op, make_graph, null, tvm_op

from graph_runtime.device import Device
from graph_runtime.errors import PlanError
from graph_runtime.graph.model import Graph
from graph_runtime.lib import Module
from graph_runtime.planner import (Placement, PlanResult, VirtualDevice, default, join,
                                   parse_device_constraint, plan_graph)

CPU, CUDA, OPENCL = 1, 2, 4
cpu0, cl0 = Device(CPU, 0), Device(OPENCL, 0)


def devices(result: PlanResult) -> dict[str, str]:
    """Node name -> "kind:id" of the planned graph."""
    return {node.name: dev.spec for node, dev in zip(result.graph.nodes, result.node_devices)}


def copies(result: PlanResult) -> list[tuple[str, str, str]]:
    """(copy name, source entry, destination) of every __copy node in the planned graph."""
    g = result.graph
    return [(n.name, f"{g.nodes[n.inputs[0][0]].name}:{n.inputs[0][1]}",
             result.node_devices[n.nid].spec) for n in g.nodes if n.func_name == "__copy"]


def reads(result: PlanResult, name: str) -> list[str]:
    """Names of the nodes that node `name` reads in the planned graph."""
    g = result.graph
    node = next(n for n in g.nodes if n.name == name)
    return [g.nodes[ref[0]].name for ref in node.inputs]


def chain(length: int = 3) -> Graph:
    """x -> a -> b -> c ... (relu each)."""
    nodes = [null("x")]
    for i in range(length):
        nodes.append(tvm_op("abcdefgh"[i], "relu", [i]))
    return make_graph(nodes, [length])


def diamond() -> Graph:
    """x -> a; a -> b, a -> c; d = b + c."""
    return make_graph([null("x"), tvm_op("a", "relu", [0]), tvm_op("b", "relu", [1]),
                       tvm_op("c", "negative", [1]), tvm_op("d", "add", [2, 3])], [4])


# ---- VirtualDevice ----------------------------------------------------------------------------

def test_join_seed_example_fills_fields_from_both_sides() -> None:
    a = VirtualDevice(CPU, None, "llvm", None)
    b = VirtualDevice(None, 3, None, "global")
    assert join(a, b) == VirtualDevice(CPU, 3, "llvm", "global")


def test_join_fails_when_a_field_is_set_differently() -> None:
    # Seed 004's second example prints lhs scope "" and expects no join, but "" means
    # unconstrained there, and TVM's Join (and the field rule) then take rhs's "local": the
    # example only fails when both sides set the scope, as tested here.
    a = VirtualDevice(CPU, None, "llvm", "global")
    assert join(a, VirtualDevice(None, 3, None, "local")) is None
    assert join(VirtualDevice(CPU, None, "llvm"), VirtualDevice(None, 3, None, "local")) == \
        VirtualDevice(CPU, 3, "llvm", "local")
    assert join(VirtualDevice(CPU), VirtualDevice(CUDA)) is None
    assert join(VirtualDevice(CUDA, 0), VirtualDevice(CUDA, 1)) is None


def test_default_seed_example_takes_rhs_only_where_lhs_is_unset() -> None:
    a = VirtualDevice(CPU, None, "llvm", "local")
    b = VirtualDevice(CPU, 3, None, "global")
    assert default(a, b) == VirtualDevice(CPU, 3, "llvm", "local")


def test_default_takes_rhs_target_only_for_the_same_device_type() -> None:
    assert default(VirtualDevice(CUDA), VirtualDevice(CPU, 0, "llvm")) == VirtualDevice(CUDA, 0)
    assert default(VirtualDevice(CPU), VirtualDevice(CPU, 0, "llvm")).target == "llvm"
    assert default(VirtualDevice(), VirtualDevice(CPU, 0, "llvm")) == VirtualDevice(CPU, 0, "llvm")


def test_target_implies_device_type_and_must_agree_with_it() -> None:
    assert VirtualDevice(target="cuda -arch=sm_80").device_type == CUDA
    with pytest.raises(PlanError, match="target 'llvm' runs on cpu, not on device type cuda"):
        VirtualDevice(CUDA, target="llvm")
    assert join(VirtualDevice(target="llvm"), VirtualDevice(CUDA)) is None


def test_constrained_predicates_and_to_device() -> None:
    assert VirtualDevice().is_fully_unconstrained
    assert not VirtualDevice(CPU).is_fully_unconstrained
    assert VirtualDevice(CPU, 0, "llvm", "global").is_fully_constrained
    assert not VirtualDevice(CPU, 0).is_fully_constrained
    assert VirtualDevice(CUDA, 1).to_device() == Device(CUDA, 1)
    with pytest.raises(PlanError, match="needs both a device type and a device id"):
        VirtualDevice(CUDA).to_device()


# ---- placement parsing -------------------------------------------------------------------------

def test_parse_device_constraint_forms() -> None:
    assert parse_device_constraint("cuda") == VirtualDevice(CUDA)
    assert parse_device_constraint("cuda:1") == VirtualDevice(CUDA, 1)
    assert parse_device_constraint({"device_type": "cuda", "device_id": 1}) == \
        VirtualDevice(CUDA, 1)
    assert parse_device_constraint({"device_type": "cuda"}) == VirtualDevice(CUDA)
    assert parse_device_constraint(Device(OPENCL, 0)) == VirtualDevice(OPENCL, 0)
    assert parse_device_constraint({"memory_scope": "global"}) == \
        VirtualDevice(memory_scope="global")


@pytest.mark.parametrize("spec,message", [
    ({"device": "cuda"}, r"where: unknown key 'device'; allowed keys: device_type, device_id"),
    ({"device_type": "cuda", "device_id": -1}, r"where.device_id: expected a non-negative"),
    ("tpu:0", r"where: unknown device type 'tpu'"),
    ("cuda:x", r"where: bad device 'cuda:x'"),
    (3.5, r"where: expected a device such as"),
])
def test_parse_device_constraint_errors_name_the_place(spec: object, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_device_constraint(spec, "where")


ISSUE_PLACEMENT = {"default_device": "cpu:0", "node_devices": {"conv*": "opencl:0",
                                                                "b": {"device_type": "cuda"}},
                   "input_devices": {"x": "cuda:0"}, "output_devices": {"0": "cpu"}}


def test_placement_from_dict_reads_the_issue_form(tmp_path) -> None:
    p = Placement.from_dict(ISSUE_PLACEMENT)
    assert p.default_device == VirtualDevice(CPU, 0)
    assert p.node_devices == {"conv*": VirtualDevice(OPENCL, 0), "b": VirtualDevice(CUDA)}
    assert p.input_devices == {"x": VirtualDevice(CUDA, 0)}
    assert p.output_devices == {"0": VirtualDevice(CPU)}
    path = tmp_path / "placement.json"
    path.write_text(json.dumps(ISSUE_PLACEMENT))
    assert Placement.from_file(path) == p
    assert Placement.from_dict(p.to_dict()) == p


def test_placement_errors_name_file_and_json_path(tmp_path) -> None:
    with pytest.raises(PlanError, match=r"<placement> at \$.nodes: unknown key; allowed keys: "
                                        r"default_device, node_devices"):
        Placement.from_dict({"nodes": {}})
    with pytest.raises(PlanError, match=r'at \$.node_devices\["conv\*"\]: unknown device type'):
        Placement.from_dict({"node_devices": {"conv*": "gpu9"}})
    with pytest.raises(PlanError, match=r"<placement> at \$.default_device: \?:1 has no device "
                                        r"type; give one such as"):
        Placement.from_dict({"default_device": {"device_id": 1}})
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(PlanError, match="bad.json: not JSON"):
        Placement.from_file(bad)
    with pytest.raises(PlanError, match="cannot read placement file"):
        Placement.from_file(tmp_path / "missing.json")
    bad.write_bytes(b'{"default_device": "\xff"}')
    with pytest.raises(PlanError, match=r"bad.json: not UTF-8 text \(byte 20"):
        Placement.from_file(bad)
    bad.write_text("[" * 100_000)
    with pytest.raises(PlanError, match="bad.json: not JSON"):
        Placement.from_file(bad)


def test_placement_from_options_like_the_cli() -> None:
    p = Placement.from_options(default="opencl", place=["conv*=cuda:1"], inputs=["x=cpu"],
                               outputs=["0=cpu:0"])
    assert p.default_device == VirtualDevice(OPENCL)
    assert p.node_devices == {"conv*": VirtualDevice(CUDA, 1)}
    assert p.input_devices == {"x": VirtualDevice(CPU)}
    assert p.output_devices == {"0": VirtualDevice(CPU, 0)}
    with pytest.raises(PlanError, match="--place 'conv': expected NAME=DEVICE"):
        Placement.from_options(place=["conv"])


# ---- rule 1: constraints naming one node are joined ---------------------------------------------

def test_rule1_two_globs_on_one_node_conflict_naming_node_and_both() -> None:
    g = make_graph([null("x"), tvm_op("conv1", "relu", [0])], [1])
    placement = {"node_devices": {"conv*": "opencl", "*1": "cpu"}}
    with pytest.raises(PlanError) as info:
        plan_graph(g, placement)
    assert str(info.value) == ("node 1 'conv1': node_devices[\"conv*\"] = opencl conflicts with "
                               "node_devices[\"*1\"] = cpu (device_type: opencl vs cpu)")


def test_rule1_compatible_constraints_join() -> None:
    g = make_graph([null("x"), tvm_op("conv1", "relu", [0])], [1])
    result = plan_graph(g, {"node_devices": {"conv*": {"device_type": "opencl"}},
                            "func_devices": {"relu": {"device_id": 1}}})
    assert devices(result)["conv1"] == "opencl:1"


def test_rule1_node_and_func_constraints_conflict() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0])], [1])
    with pytest.raises(PlanError, match=r"node 1 'a': node_devices\[\"a\"\] = cuda:0 conflicts "
                                        r"with func_devices\[\"rel\*\"\] = cuda:1 "
                                        r"\(virtual_device_id: 0 vs 1\)"):
        plan_graph(g, {"node_devices": {"a": "cuda:0"}, "func_devices": {"rel*": "cuda:1"}})


@pytest.mark.parametrize("placement,message", [
    ({"node_devices": {"conv*": "cpu"}}, r'node_devices\["conv\*"\] matches no node; node names '
                                         r"are: x, a"),
    ({"func_devices": {"dense": "cpu"}}, r'func_devices\["dense"\] matches no func_name; '
                                         r"func_names are: relu"),
    ({"input_devices": {"y": "cpu"}}, r"graph has no input 'y'; inputs are: x"),
    ({"output_devices": {"3": "cpu"}}, r"graph has no output '3'; outputs are: 0 \(a:0\)"),
])
def test_patterns_that_match_nothing_are_errors(placement: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_graph(make_graph([null("x"), tvm_op("a", "relu", [0])], [1]), placement)


def test_conflicting_output_constraints() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0])], [1])
    with pytest.raises(PlanError, match=r"output 0: output_devices\[\"0\"\] = cpu conflicts with "
                                        r"output_devices\[\"a\"\] = opencl"):
        plan_graph(g, {"output_devices": {"0": "cpu", "a": "opencl"}})


# ---- rule 2: a constrained node pulls its free producers, its result is free --------------------

def test_rule2_chain_pin_pulls_producers_and_frees_consumers() -> None:
    result = plan_graph(chain(3), {"node_devices": {"b": "opencl:0"}})
    assert devices(result) == {"x": "opencl:0", "a": "opencl:0", "b": "opencl:0",
                               "copy_b_to_cpu0": "cpu:0", "c": "cpu:0"}
    assert copies(result) == [("copy_b_to_cpu0", "b:0", "cpu:0")]
    assert reads(result, "c") == ["copy_b_to_cpu0"]


def test_rule2_partial_constraint_is_completed_by_the_default() -> None:
    result = plan_graph(chain(2), {"default_device": "cuda:1",
                                   "node_devices": {"a": {"device_type": "opencl"}}})
    # Rule 6 works field by field: the id comes from the default device (TVM's Default).
    assert devices(result)["a"] == "opencl:1"
    assert devices(result)["b"] == "cuda:1"


def test_diamond_with_the_join_pinned_runs_in_one_place() -> None:
    result = plan_graph(diamond(), {"node_devices": {"d": "opencl"}})
    assert set(devices(result).values()) == {"opencl:0"}
    assert copies(result) == []


# ---- rule 3: shared producers -----------------------------------------------------------------

def test_rule3_shared_producer_goes_with_its_first_fixed_consumer() -> None:
    result = plan_graph(diamond(), {"node_devices": {"b": "opencl", "c": "cpu"}})
    d = devices(result)
    assert d["a"] == d["x"] == d["b"] == "opencl:0"
    assert d["c"] == d["d"] == "cpu:0"
    assert copies(result) == [("copy_a_to_cpu0", "a:0", "cpu:0"),
                              ("copy_b_to_cpu0", "b:0", "cpu:0")]
    assert reads(result, "c") == ["copy_a_to_cpu0"]


def test_rule3_order_decides_the_producer() -> None:
    result = plan_graph(diamond(), {"node_devices": {"b": "cpu", "c": "opencl"}})
    assert devices(result)["a"] == "cpu:0"
    assert [c[:2] for c in copies(result)] == [("copy_a_to_opencl0", "a:0"),
                                               ("copy_c_to_cpu0", "c:0")]


def test_rule3_conflict_through_a_free_chain_is_cut_with_one_copy() -> None:
    # p feeds c1 (cpu) directly and c2 (opencl) through the free node q.
    g = make_graph([null("x"), tvm_op("p", "relu", [0]), tvm_op("c1", "relu", [1]),
                    tvm_op("q", "relu", [1]), tvm_op("c2", "relu", [3])], [2, 4])
    result = plan_graph(g, {"node_devices": {"c1": "cpu", "c2": "opencl"}})
    d = devices(result)
    assert d["p"] == "cpu:0" and d["q"] == "opencl:0"
    assert copies(result) == [("copy_p_to_opencl0", "p:0", "opencl:0")]


def test_shared_free_input_feeding_two_devices() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0]), tvm_op("b", "relu", [0])], [1, 2])
    result = plan_graph(g, {"node_devices": {"a": "opencl", "b": "cpu"}})
    assert devices(result)["x"] == "opencl:0"
    assert copies(result) == [("copy_x_to_cpu0", "x:0", "cpu:0")]


# ---- rule 4: outputs --------------------------------------------------------------------------

def test_rule4_unpinned_output_follows_its_producer() -> None:
    result = plan_graph(chain(2), {"node_devices": {"b": "opencl"}})
    g = result.graph
    assert g.nodes[g.heads[0][0]].name == "b"
    assert g.device_index(g.output_entries[0]) == OPENCL


def test_rule4_pinned_output_pulls_a_free_producer() -> None:
    result = plan_graph(chain(2), {"output_devices": {"0": "opencl"}})
    assert set(devices(result).values()) == {"opencl:0"}
    assert copies(result) == []


def test_rule4_constrained_producer_elsewhere_gets_a_copy() -> None:
    result = plan_graph(chain(2), {"node_devices": {"b": "opencl"}, "output_devices": {"b": "cpu"}})
    g = result.graph
    assert copies(result) == [("copy_b_to_cpu0", "b:0", "cpu:0")]
    assert g.nodes[g.heads[0][0]].name == "copy_b_to_cpu0"
    assert g.device_index(g.output_entries[0]) == CPU


def test_multiple_outputs_and_multi_output_node() -> None:
    nodes = [null("x"), tvm_op("split", "split", [0], num_outputs=2),
             tvm_op("u", "relu", [(1, 0)]), tvm_op("v", "relu", [(1, 1)])]
    g = make_graph(nodes, [2, 3, (1, 1)])
    result = plan_graph(g, {"node_devices": {"split": "opencl", "u": "cpu"},
                            "output_devices": {"split:1": "cpu", "2": "cpu"}})
    d = devices(result)
    assert d["v"] == "cpu:0" and d["u"] == "cpu:0"
    assert copies(result) == [("copy_split_to_cpu0", "split:0", "cpu:0"),
                              ("copy_split_1_to_cpu0", "split:1", "cpu:0")]
    # One copy of split:1 serves both v and the output (rule 7).
    g2 = result.graph
    copy1 = next(n.nid for n in g2.nodes if n.name == "copy_split_1_to_cpu0")
    assert reads(result, "v") == ["copy_split_1_to_cpu0"]
    assert tuple(g2.heads[2][:2]) == (copy1, 0)


# ---- rule 5: pinned inputs ---------------------------------------------------------------------

def test_rule5_pinned_input_is_a_boundary() -> None:
    result = plan_graph(chain(2), {"input_devices": {"x": "opencl"}})
    assert devices(result) == {"x": "opencl:0", "copy_x_to_cpu0": "cpu:0", "a": "cpu:0",
                               "b": "cpu:0"}
    assert copies(result) == [("copy_x_to_cpu0", "x:0", "cpu:0")]


def test_rule5_a_free_input_still_ties_its_consumer() -> None:
    # a reads the pinned x (a boundary) and the free y, which b pins to opencl: the edge y -> a
    # ties a to y's class, so a runs on opencl and reads x there without a copy.
    g = make_graph([null("x"), null("y"), tvm_op("a", "add", [0, 1]), tvm_op("b", "relu", [1])],
                   [2, 3])
    result = plan_graph(g, {"input_devices": {"x": "opencl"}, "node_devices": {"b": "opencl"}})
    assert set(devices(result).values()) == {"opencl:0"}
    assert copies(result) == []


def test_rule5_input_pinned_where_its_consumer_runs_needs_no_copy() -> None:
    result = plan_graph(chain(1), {"input_devices": {"x": "opencl"},
                                   "node_devices": {"a": "opencl"}})
    assert copies(result) == []


# ---- rule 6: defaults --------------------------------------------------------------------------

def test_rule6_free_nodes_take_the_default_device() -> None:
    result = plan_graph(diamond(), {"default_device": "opencl"})
    assert set(devices(result).values()) == {"opencl:0"}
    assert plan_graph(diamond()).graph.column("device_index") == [CPU] * 5


# ---- rule 7: one copy per (entry, device) -----------------------------------------------------

def test_rule7_one_copy_per_entry_and_destination() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0]), tvm_op("b", "relu", [1]),
                    tvm_op("c", "relu", [1]), tvm_op("d", "relu", [1])], [2, 3, 4])
    result = plan_graph(g, {"node_devices": {"a": "opencl", "b": "cpu", "c": "cpu",
                                             "d": "cuda"}})
    assert copies(result) == [("copy_a_to_cpu0", "a:0", "cpu:0"),
                              ("copy_a_to_cuda0", "a:0", "cuda:0")]
    assert reads(result, "b") == reads(result, "c") == ["copy_a_to_cpu0"]
    assert [c.nbytes for c in result.copies] == [16, 16]


def test_copy_nodes_have_the_tvm_form_and_unique_names() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0]), tvm_op("copy_a_to_cpu0", "relu", [1])],
                   [2])
    result = plan_graph(g, {"node_devices": {"a": "opencl", "copy_a_to_cpu0": "cpu"}})
    node = result.graph.nodes[2]
    assert node.name == "copy_a_to_cpu0_2"
    assert node.to_dict() == {"op": "tvm_op", "name": "copy_a_to_cpu0_2", "inputs": [[1, 0, 0]],
                              "attrs": {"func_name": "__copy", "num_inputs": "1",
                                        "num_outputs": "1", "flatten_data": "0"}}


# ---- rule 8: lib fallback ----------------------------------------------------------------------

def _lib() -> Module:
    lib = Module("test")
    lib.register("relu", lambda x, out: None, device="cpu")
    lib.register("relu", lambda x, out: None, device="opencl")
    lib.register("negative", lambda x, out: None, device="cpu")
    return lib


def test_rule8_missing_kernel_falls_back_to_the_default_device() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0]), tvm_op("n", "negative", [1]),
                    tvm_op("b", "relu", [2])], [3])
    result = plan_graph(g, {"node_devices": {"*": "opencl"}}, lib=_lib())
    d = devices(result)
    assert d["a"] == d["b"] == "opencl:0" and d["n"] == "cpu:0"
    [fallback] = result.fallbacks
    assert (fallback.name, fallback.func_name, fallback.planned, fallback.device) == \
        ("n", "negative", cl0, cpu0)
    assert result.graph.nodes[fallback.nid].name == "n"
    assert [c[:2] for c in copies(result)] == [("copy_a_to_cpu0", "a:0"),
                                               ("copy_n_to_opencl0", "n:0")]
    assert "fallback: node 3 'n' (negative) has no kernel for opencl:0; runs on cpu:0" in \
        result.summary()


def test_rule8_strict_makes_a_fallback_an_error() -> None:
    g = make_graph([null("x"), tvm_op("n", "negative", [0])], [1])
    with pytest.raises(PlanError, match=r"node 1 'n': lib 'test' has no 'negative' for opencl "
                                        r"\(it exists for: cpu\); without strict it would fall "
                                        r"back to the default device cpu:0"):
        plan_graph(g, {"node_devices": {"n": "opencl"}}, lib=_lib(), strict=True)


def test_rule8_kernel_missing_on_the_default_too_is_an_error() -> None:
    g = make_graph([null("x"), tvm_op("s", "sqrt", [0])], [1])
    with pytest.raises(PlanError, match=r"node 1 's': lib 'test' has no 'sqrt' for cpu nor for "
                                        r"the default device cpu:0; it is not in the lib at all"):
        plan_graph(g, lib=_lib())


# ---- rule 9: idempotence ----------------------------------------------------------------------

@pytest.mark.parametrize("placement", [
    {"node_devices": {"b": "opencl", "c": "cpu"}},
    {"node_devices": {"b": "cuda:1", "c": "cuda:0"}, "output_devices": {"0": "opencl"}},
    {"default_device": "opencl", "input_devices": {"x": "cpu"}},
])
def test_rule9_planning_a_planned_graph_pinned_where_it_is_changes_nothing(placement) -> None:
    first = plan_graph(diamond(), placement)
    again = plan_graph(first.graph, Placement.from_graph(first.graph))
    assert again.graph.to_dict() == first.graph.to_dict()
    assert again.copies == [] and again.fallbacks == []


def test_existing_copy_nodes_are_kept_and_read_across_devices() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0]), copy_op("c", 1),
                    tvm_op("b", "relu", [2])], [3])
    result = plan_graph(g, {"node_devices": {"a": "opencl"}})
    assert devices(result) == {"x": "opencl:0", "a": "opencl:0", "c": "cpu:0", "b": "cpu:0"}
    assert copies(result) == [("c", "a:0", "cpu:0")]
    assert result.copies == []


# ---- output graph -----------------------------------------------------------------------------

def test_output_columns_and_device_id_only_when_two_devices_share_a_type() -> None:
    one = plan_graph(diamond(), {"node_devices": {"b": "opencl"}}).graph
    assert "device_id" not in one.attrs
    assert Graph.from_json(one.to_json()).to_dict() == one.to_dict()
    two = plan_graph(diamond(), {"node_devices": {"b": "cuda:0", "c": "cuda:1"}}).graph
    entries = {n.name: n.nid for n in two.nodes}
    assert two.device_index(entries["b"]) == two.device_index(entries["c"]) == CUDA
    assert two.device_id(entries["b"]) == 0 and two.device_id(entries["c"]) == 1
    assert list(two.node_row_ptr) == list(range(two.num_nodes + 1))
    assert list(two.arg_nodes) == [0]


def test_unknown_columns_and_versions_are_carried_to_copies() -> None:
    nodes = [null("x"), tvm_op("a", "relu", [0]), tvm_op("b", "relu", [1])]
    nodes[2]["inputs"] = [[1, 0, 7]]
    g = make_graph(nodes, [2], extra_columns={"layout": ["NC", "NCH", "NCHW"]})
    result = plan_graph(g, {"node_devices": {"a": "opencl"}, "func_devices": {}})
    assert result.graph.column("layout") == ["NC", "NCH", "NCH", "NCHW"]
    assert plan_graph(g).graph.nodes[2].inputs == ((1, 0, 7),)


def test_glob_characters_in_names_are_matched_literally_by_from_graph() -> None:
    g = make_graph([null("x[0]"), tvm_op("a*", "relu", [0]), tvm_op("a?", "relu", [1])], [2])
    first = plan_graph(g, {"node_devices": {"a[*]": "opencl"}})
    assert devices(first) == {"x[0]": "opencl:0", "a*": "opencl:0", "copy_a*_to_cpu0": "cpu:0",
                              "a?": "cpu:0"}
    again = plan_graph(first.graph, Placement.from_graph(first.graph))
    assert again.graph.to_dict() == first.graph.to_dict()


# ---- storage ----------------------------------------------------------------------------------

def test_storage_reuse_in_a_chain_keeps_inputs_and_outputs_apart() -> None:
    result = plan_graph(chain(6))
    sids = result.graph.column("storage_id")
    # x and the output g own their ids; the five intermediates alternate between two ids.
    assert sids == [0, 1, 2, 1, 2, 1, 3]
    [pool] = result.pools.values()
    assert (pool.before, pool.no_sharing, pool.after, pool.lower_bound) == \
        (7 * 16, 7 * 16, 4 * 16, 4 * 16)


def test_storage_ids_never_span_devices() -> None:
    result = plan_graph(chain(6), {"node_devices": {"c": "opencl", "e": "opencl"}})
    g = result.graph
    owner: dict[int, int] = {}
    for eid, sid in enumerate(g.column("storage_id")):
        assert owner.setdefault(sid, g.device_index(eid)) == g.device_index(eid)
    assert set(result.pools) == {cpu0, cl0}


def test_nop_outputs_alias_their_input() -> None:
    g = make_graph([null("x"), tvm_op("a", "relu", [0]), tvm_op("r", "__nop", [1]),
                    tvm_op("b", "relu", [2]), tvm_op("c", "relu", [3])], [4])
    sids = plan_graph(g).graph.column("storage_id")
    assert sids[2] == sids[1]
    assert sids[3] not in (sids[1], sids[0], sids[4])


def test_summary_lists_copies_and_pools() -> None:
    text = plan_graph(chain(2), {"node_devices": {"a": "opencl"}}).summary()
    assert text.splitlines()[0].startswith("planned 3 nodes on cpu:0, opencl:0; 1 copy (16 B")
    assert "copy: node 2 'copy_a_to_cpu0' reads entry 1:0, opencl:0 -> cpu:0, 16 B" in text
    assert "opencl:0" in text.splitlines()[-1]
