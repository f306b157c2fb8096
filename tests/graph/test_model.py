"""Tests for graph_runtime.graph: round trips, every malformed-graph rule, mutations, build."""
from __future__ import annotations

import copy
import json
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graph_runtime.errors import GraphError
from graph_runtime.graph.checks import matches_schema
from graph_runtime.graph.model import SUPPORTED_DTYPES, Graph, Node, check_graph, load_graph
from graph_runtime.graph.schema import MAX_PROBLEMS, schema_problems


def base_doc() -> dict[str, Any]:
    """x, w -> dense0 -> split (2 outputs) -> add; entries 0..5; TVM's string attrs."""
    return {
        "nodes": [
            {"op": "null", "name": "x", "inputs": []},
            {"op": "null", "name": "w", "inputs": []},
            {"op": "tvm_op", "name": "dense0", "inputs": [[0, 0, 0], [1, 0, 0]],
             "attrs": {"func_name": "dense", "num_inputs": "2", "num_outputs": "1",
                       "flatten_data": "0"}},
            {"op": "tvm_op", "name": "split", "inputs": [[2, 0, 0]],
             "attrs": {"func_name": "split", "num_inputs": "1", "num_outputs": "2",
                       "flatten_data": "0"}},
            {"op": "tvm_op", "name": "add", "inputs": [[3, 0, 0], [3, 1, 0]],
             "attrs": {"func_name": "add", "num_inputs": "2", "num_outputs": "1",
                       "flatten_data": "0"}},
        ],
        "arg_nodes": [0, 1],
        "heads": [[4, 0, 0]],
        "attrs": {
            "dltype": ["list_str", ["float32"] * 6],
            "shape": ["list_shape", [[1, 4], [4, 4], [1, 4], [1, 2], [1, 2], [1, 2]]],
            "storage_id": ["list_int", [0, 1, 2, 3, 4, 5]],
        },
        "node_row_ptr": [0, 1, 2, 3, 5, 6],
    }


def problems_of(doc: Any) -> str:
    """from_json must raise GraphError; return its message."""
    with pytest.raises(GraphError) as info:
        Graph.from_json(doc, source_name="graph.json")
    return str(info.value)


# ---------------------------------------------------------------- round trips

def test_base_graph_loads_and_reads() -> None:
    g = Graph.from_json(base_doc())
    assert g.num_nodes == 5
    assert g.num_entries == 6
    assert g.input_names == ["x", "w"]
    assert g.output_entries == [5]
    assert g.entry_id(3, 1) == 4
    assert g.entry_node(4) == (3, 1)
    assert g.entry_label(4) == "node 3 'split' entry 3:1 (eid 4)"
    assert g.node_entries(3) == range(3, 5)
    assert g.shape(1) == (4, 4)
    assert g.dtype(2) == "float32"
    assert g.storage_id(5) == 5
    assert g.device_index(0) is None
    assert g.device_id(0) is None
    assert g.column("device_index") is None
    split = g.nodes[3]
    assert (split.func_name, split.num_inputs, split.num_outputs) == ("split", 1, 2)
    assert split.flatten_data is False
    assert split.label == "node 3 'split'"
    assert g.nodes[0].is_arg and not split.is_arg
    assert g.nodes[0].func_name is None and g.nodes[0].num_outputs == 1


def test_round_trip_is_lossless_with_every_variant() -> None:
    doc = base_doc()
    doc["nodes"][2]["inputs"] = [[0, 0], [1, 0, 0]]          # version omitted and present
    doc["heads"] = [[4, 0]]
    doc["nodes"][3]["attrs"] = {"func_name": "split", "num_inputs": 1, "num_outputs": 2,
                                "flatten_data": 1, "hash": "abc123"}  # ints and an extra attr
    doc["nodes"][0]["attrs"] = {}                                # a null node with empty attrs
    doc["nodes"][4]["attr"] = doc["nodes"][4].pop("attrs")       # TVM's older key
    doc["nodes"][4]["control_deps"] = [1]
    doc["attrs"]["device_index"] = ["list_int", [1, 1, 2, 2, 2, 4]]
    doc["attrs"]["device_id"] = ["list_int", [0, 0, 0, 0, 1, 0]]
    doc["attrs"]["my_ints"] = ["list_int", [-1, 0, 1, 2, 3, 4]]
    doc["attrs"]["my_strs"] = ["list_str", ["a", "b", "c", "d", "e", "f"]]
    doc["attrs"]["my_shapes"] = ["list_shape", [[], [1], [2, 3], [], [], []]]
    doc["metadata"] = {"anything": [1, {"nested": None}], "version": "0.8"}
    original = copy.deepcopy(doc)
    g = Graph.from_json(json.dumps(doc))
    assert doc == original
    assert json.loads(g.to_json()) == original
    assert json.loads(g.to_json(indent=2)) == original
    assert g.to_dict() == original
    assert Graph.from_json(g.to_json()).to_dict() == original
    assert g.nodes[2].inputs == ((0, 0), (1, 0, 0))
    assert g.nodes[3].flatten_data is True and g.nodes[3].num_outputs == 2
    assert g.nodes[4].func_name == "add" and g.nodes[4].extra == {"control_deps": [1]}
    assert g.device_index(4) == 2 and g.device_id(4) == 1
    assert g.column("my_ints") == [-1, 0, 1, 2, 3, 4]
    assert g.attrs["my_shapes"][0] == "list_shape"


def test_a_graph_without_output_names_stays_tvms_format() -> None:
    """No metadata is added: the document written is the one read, key for key, and its
    outputs are named as TVM's GetOutputIndex names them (the head node's name)."""
    doc = base_doc()
    g = Graph.from_json(json.dumps(doc))
    assert g.to_dict() == doc and list(json.loads(g.to_json())) == list(doc)
    assert g.declared_output_names is None
    assert g.output_names == g.node_output_names == ("add",)
    assert g.output_index("add") == 0 and g.output_index(0) == 0


def test_declared_output_names_name_the_heads_and_write_metadata_last() -> None:
    """metadata.output_names (docs/output_names.md) answer before the head nodes' names; the
    metadata key is written after TVM's five, where TVM's reader stops reading."""
    doc = {"metadata": {"output_names": ["total", "half"], "version": "1"}, **base_doc()}
    doc["heads"] = [[4, 0, 0], [3, 1, 0]]
    g = Graph.from_json(doc)
    assert g.output_names == ("total", "half")
    assert g.node_output_names == ("add", "split:1")
    assert [g.output_index(k) for k in ("total", "half", "add", "split:1", 1)] == [0, 1, 0, 1, 1]
    written = json.loads(g.to_json())
    assert list(written) == ["nodes", "arg_nodes", "heads", "attrs", "node_row_ptr", "metadata"]
    assert written == doc
    with pytest.raises(GraphError, match="graph has no output 'logits'; outputs are: total, half"):
        g.output_index("logits")
    with pytest.raises(GraphError, match="output index 2 is out of range: the graph has 2 "
                                         "outputs"):
        g.output_index(2)
    doc["metadata"]["output_names"] = ["total", "total"]
    assert "at $.metadata.output_names[1]: output name 'total' is given twice" in problems_of(doc)


def test_to_dict_is_a_copy() -> None:
    g = Graph.from_json(base_doc())
    doc = g.to_dict()
    doc["attrs"]["shape"][1][0][0] = 99
    doc["nodes"][2]["attrs"]["func_name"] = "changed"
    g.column("shape")[0][0] = 99  # type: ignore[index]
    assert g.shape(0) == (1, 4)
    assert g.nodes[2].func_name == "dense"


def test_null_nodes_need_no_attrs_and_names_need_not_be_unique_for_ops() -> None:
    doc = base_doc()
    doc["nodes"][3]["name"] = "dense0"
    g = Graph.from_json(doc)
    assert [n.name for n in g.nodes].count("dense0") == 2
    assert "attrs" not in g.to_dict()["nodes"][0]


def test_sources_text_bytes_path_and_pathlike(tmp_path: Any) -> None:
    text = json.dumps(base_doc(), indent=1)
    path = tmp_path / "graph.json"
    path.write_text(text)
    for source in (text, "\n  " + text, text.encode(), b"\xef\xbb\xbf" + text.encode(),
                   str(path), path):
        assert Graph.from_json(source).to_dict() == base_doc()
    assert load_graph(path).source == str(path)
    assert Graph.from_json(text, source_name="mine.json").source == "mine.json"
    g = Graph.from_json(text)
    assert Graph.from_json(g) is g


@pytest.mark.parametrize("source, fragment", [
    ('{"nodes": [', "<graph>: not valid JSON: Expecting value at line 1 column 12"),
    ('{"nodes": [], "nodes": []}', "duplicate key 'nodes'"),
    ('{"nodes": NaN}', "NaN is not a JSON number"),
    ("{" + "[" * 100000 + "]" * 100000 + "}", "not valid JSON"),
    (b"\xff\xfe{", "not valid JSON"),
    ('{"nodes": ' + "9" * 5000 + "}", "<graph>: not valid JSON: an integer of 5000 digits (at most "
     "4300)"),
    ("/no/such/graph.json", "/no/such/graph.json: cannot read the graph file: No such file"),
    (12, "expected a graph as JSON text, bytes, a dict or a path, got int"),
    ({"nodes": {1, 2}}, "not JSON data: a value of type set is not JSON data"),
])
def test_unreadable_sources(source: Any, fragment: str) -> None:
    with pytest.raises(GraphError, match=None) as info:
        Graph.from_json(source)
    assert fragment in str(info.value)


def test_document_must_be_an_object() -> None:
    expected = r"^<graph> at \$: expected object, got array \[1, \[...\]\]$"
    with pytest.raises(GraphError, match=expected):
        Graph.from_json(b"[1, [2]]")


def test_deep_metadata_does_not_crash() -> None:
    text = json.dumps(base_doc())[:-1] + ', "metadata": ' + "[" * 50000 + "]" * 50000 + "}"
    with pytest.raises(GraphError, match="not valid JSON"):
        Graph.from_json(text)


# ---------------------------------------------------------------- malformed graphs

def _set(path: tuple, value: Any) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        target = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return mutate


def _delete(*path: Any) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        target = doc
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]
    return mutate


def _both(*mutations: Callable[[dict], None]) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        for m in mutations:
            m(doc)
    return mutate


DTYPE_LIST = "float16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32"
MALFORMED = [
    # --- schema rules
    ("top-level typo", _set(("nodez",), []),
     ["graph.json at $: unknown key 'nodez'", "allowed keys: nodes,", "did you mean 'nodes'"]),
    ("missing heads", _delete("heads"), ["at $: missing key 'heads'"]),
    ("only a typo", lambda d: d.clear() or d.update({"x": 1}),
     ["at $: missing keys 'nodes', 'arg_nodes', 'heads', 'node_row_ptr', 'attrs'", "(and 1 more"]),
    ("node typo", _set(("nodes", 2, "atrs"), {}),
     ["$.nodes[2], node 2 'dense0': unknown key 'atrs'", "(did you mean 'attrs'?)"]),
    ("node missing name", _delete("nodes", 2, "name"), ["$.nodes[2], node 2: missing key 'name'"]),
    ("node is a string", _set(("nodes", 2), "dense0"),
     ["$.nodes[2], node 2: expected object, got string \"dense0\""]),
    ("bad op", _set(("nodes", 2, "op"), "tvm"),
     ["$.nodes[2].op, node 2 'dense0': expected one of null, tvm_op, got \"tvm\""]),
    ("input too short", _set(("nodes", 2, "inputs", 1), [1]),
     ["$.nodes[2].inputs[1], node 2 'dense0': expected at least 2 items, got 1: [1]"]),
    ("input negative", _set(("nodes", 2, "inputs", 0), [-1, 0]),
     ["$.nodes[2].inputs[0][0], node 2 'dense0': expected a node id (integer) >= 0, got -1"]),
    ("input not int", _set(("nodes", 2, "inputs", 0), [0, "0"]),
     ["$.nodes[2].inputs[0][1]", "expected an output index (integer), got string \"0\""]),
    ("num_outputs word", _set(("nodes", 3, "attrs", "num_outputs"), "two"),
     ["$.nodes[3].attrs.num_outputs, node 3 'split': expected a positive count", "\"two\""]),
    ("num_outputs float", _set(("nodes", 3, "attrs", "num_outputs"), 2.0),
     ["$.nodes[3].attrs.num_outputs", "got number 2.0"]),
    ("flatten_data 2", _set(("nodes", 2, "attrs", "flatten_data"), "2"),
     ["$.nodes[2].attrs.flatten_data, node 2 'dense0': expected one of \"0\", \"1\", 0, 1"]),
    ("complex64", _set(("attrs", "dltype", 1, 2), "complex64"),
     ["$.attrs.dltype[1][2], node 2 'dense0' entry 2:0 (eid 2): expected one of " + DTYPE_LIST,
      "got \"complex64\""]),
    ("float33", _set(("attrs", "dltype", 1, 4), "float33"),
     ["$.attrs.dltype[1][4], node 3 'split' entry 3:1 (eid 4)", "got \"float33\""]),
    ("storage tag", _set(("attrs", "storage_id"), ["list_str", ["0"] * 6]),
     ['graph.json at $.attrs.storage_id: expected ["list_int", [...]], '
      'got ["list_str", [...]]']),
    ("storage -1", _set(("attrs", "storage_id", 1, 3), -1),
     ["$.attrs.storage_id[1][3], node 3 'split' entry 3:0 (eid 3): expected a storage id",
      ">= 0, got -1", "dynamic shapes are not supported"]),
    ("dynamic dim", _set(("attrs", "shape", 1, 0), [-1, 4]),
     ["$.attrs.shape[1][0][0], node 0 'x' entry 0:0 (eid 0)", "write a name (\"batch\") or \"?\" instead"]),
    ("rank 33", _set(("attrs", "shape", 1, 1), [1] * 33),
     ["$.attrs.shape[1][1], node 1 'w' entry 1:0 (eid 1): expected at most 32 items, got 33"]),
    ("missing shape", _delete("attrs", "shape"), ["$.attrs: missing key 'shape'"]),
    ("device_index 0", _set(("attrs", "device_index"), ["list_int", [0, 1, 1, 1, 1, 1]]),
     ["$.attrs.device_index[1][0], node 0 'x' entry 0:0 (eid 0): expected a DLPack device"]),
    ("unknown column tag", _set(("attrs", "extra"), ["list_float", [1.0] * 6]),
     ['$.attrs.extra: expected ["list_int" | "list_str" | "list_shape", [...]], '
      'got ["list_float", [...]]']),
    ("unknown column value", _set(("attrs", "extra"), ["list_int", [1, "2", 3, 4, 5, 6]]),
     ["$.attrs.extra[1][1], node 1 'w' entry 1:0 (eid 1): expected integer, got string \"2\""]),
    ("no heads", _set(("heads",), []), ["$.heads: expected at least 1 items, got 0"]),
    ("no nodes", _set(("nodes",), []), ["$.nodes: expected at least 1 items, got 0"]),
    # --- semantic rules
    ("later input", _set(("nodes", 2, "inputs", 1), [4, 0, 0]),
     ["graph.json: node 2 'dense0' input 1 refers to node 4, which comes later; "
      "nodes must be in topological order"]),
    ("self input", _set(("nodes", 2, "inputs", 0), [2, 0]),
     ["node 2 'dense0' input 0 refers to node 2 itself"]),
    ("missing input node", _set(("nodes", 4, "inputs", 1), [9, 0]),
     ["node 4 'add' input 1 refers to node 9, which does not exist (the graph has 5 nodes)"]),
    ("output index", _set(("nodes", 2, "inputs", 0), [0, 1, 0]),
     ["node 2 'dense0' input 0 refers to output 1 of node 0 'x', which has 1 output"]),
    ("row_ptr length", _set(("node_row_ptr",), [0, 1, 2, 3, 5]),
     ["graph.json at $.node_row_ptr: expected 6 items (num_nodes + 1), got 5"]),
    ("row_ptr start", _set(("node_row_ptr",), [1, 1, 2, 3, 5, 6]),
     ["at $.node_row_ptr[0]: expected 0, got 1"]),
    ("row_ptr vs num_outputs", _set(("nodes", 3, "attrs", "num_outputs"), "3"),
     ["at $.node_row_ptr[4]: expected 6 (node 3 'split' starts at entry 3 and has 3 outputs), "
      "got 5"]),
    ("column length", _set(("attrs", "shape", 1), [[1]] * 5),
     ["at $.attrs.shape: expected 6 values (one per entry", "got 5"]),
    ("arg missing", _set(("arg_nodes",), [0]),
     ["at $.arg_nodes: node 1 'w' is a 'null' (input) node missing from arg_nodes"]),
    ("arg is op", _set(("arg_nodes",), [0, 1, 2]),
     ["at $.arg_nodes[2]: node 2 'dense0' is a 'tvm_op' node; arg_nodes lists only 'null'"]),
    ("arg twice", _set(("arg_nodes",), [0, 1, 1]),
     ["at $.arg_nodes[2]: node 1 'w' is listed twice (first at $.arg_nodes[1])"]),
    ("arg out of range", _set(("arg_nodes",), [0, 1, 7]),
     ["at $.arg_nodes[2]: node 7 does not exist"]),
    ("arg order", _set(("arg_nodes",), [1, 0]),
     ["at $.arg_nodes: expected the 'null' nodes in node order [0, 1], got [1, 0]"]),
    ("bad head", _set(("heads", 0), [9, 0, 0]),
     ["at $.heads[0]: head 0 refers to node 9, which does not exist"]),
    ("head output", _set(("heads", 0), [3, 2, 0]),
     ["at $.heads[0]: head 0 refers to output 2 of node 3 'split', which has 2 outputs"]),
    ("no func_name", _delete("nodes", 2, "attrs", "func_name"),
     ["node 2 'dense0' is a tvm_op node without attrs.func_name"]),
    ("num_inputs", _set(("nodes", 2, "attrs", "num_inputs"), 3),
     ["node 2 'dense0' has attrs.num_inputs 3 but 2 inputs"]),
    ("arg names", _set(("nodes", 1, "name"), "x"),
     ["node 1 'x' has the same name as node 0; input names must be unique"]),
    ("null num_inputs", _set(("nodes", 0, "attrs"), {"num_inputs": "1"}),
     ["node 0 'x' has attrs.num_inputs 1 but 0 inputs"]),
    ("null with inputs", _set(("nodes", 1, "inputs"), [[0, 0]]),
     ["node 1 'w' is a 'null' (input) node but has 1 input; expected none"]),
    ("null with 2 outputs", _set(("nodes", 1, "attrs"), {"num_outputs": "2"}),
     ["node 1 'w' is a 'null' (input) node with attrs.num_outputs 2"]),
    ("attr and attrs", _set(("nodes", 2, "attr"), {"func_name": "x"}),
     ["node 2 'dense0' has both 'attr' and 'attrs'"]),
    ("output name count", _set(("metadata",), {"output_names": ["y", "z"]}),
     ["at $.metadata.output_names: expected 1 name (one per head), got 2"]),
    ("output name type", _set(("metadata",), {"output_names": ["y", 3]}),
     ["$.metadata.output_names[1]", "an output name (a non-empty string)"]),
    ("output name empty", _set(("metadata",), {"output_names": [""]}),
     ["$.metadata.output_names[0]", 'got ""']),
]


@pytest.mark.parametrize("mutate, fragments", [pytest.param(m, f, id=i) for i, m, f in MALFORMED])
def test_malformed_graph(mutate: Callable[[dict], None], fragments: list[str]) -> None:
    doc = base_doc()
    mutate(doc)
    message = problems_of(doc)
    for fragment in fragments:
        assert fragment in message
    assert message.startswith("graph.json")
    assert check_graph(doc, "graph.json"), "check_graph must agree with from_json"
    assert matches_schema(doc) == (schema_problems(doc, "graph.schema.json", "g") == [])


def test_all_problems_are_reported_and_counted() -> None:
    doc = base_doc()
    doc["nodes"][2]["inputs"][1] = [4, 0]
    doc["arg_nodes"] = [0]
    doc["attrs"]["storage_id"][1].pop()
    problems = check_graph(doc, "graph.json")
    assert len(problems) == 3
    assert all(isinstance(p, GraphError) for p in problems)
    with pytest.raises(GraphError, match=r"\(and 2 more problems\)$") as info:
        Graph.from_json(doc, source_name="graph.json")
    assert [str(p) for p in info.value.problems] == [str(p) for p in problems]
    assert str(info.value).startswith(str(problems[0]))


def test_schema_problems_come_before_semantic_ones() -> None:
    doc = base_doc()
    doc["nodes"][2]["inputs"][1] = [4, 0]     # semantic
    doc["attrs"]["dltype"][1][0] = "int3"     # schema
    problems = check_graph(doc)
    assert len(problems) == 1 and "int3" in str(problems[0])


def test_huge_counts_and_lists_stay_cheap() -> None:
    doc = base_doc()
    doc["nodes"][3]["attrs"]["num_outputs"] = "999999999"
    doc["attrs"]["shape"][1][1] = [2 ** 62, 2 ** 62]
    assert "expected 1000000002 (node 3 'split' starts at entry 3" in problems_of(doc)
    doc = base_doc()
    doc["attrs"]["storage_id"][1] = ["x"] * 200_000
    problems = check_graph(doc)
    assert len(problems) == MAX_PROBLEMS + 1
    assert "stopped checking" in str(problems[-1])
    doc["attrs"]["storage_id"][0] = "list_str"  # one real problem, then only repeats of it
    problems = check_graph(doc)
    assert [str(p) for p in problems] == [
        '<graph> at $.attrs.storage_id: expected ["list_int", [...]], got ["list_str", [...]]',
        f"<graph>: stopped checking after {20 * MAX_PROBLEMS} schema errors"]


def test_huge_shape_product_is_kept_exact() -> None:
    doc = base_doc()
    doc["attrs"]["shape"][1][0] = [2 ** 29, 2 ** 29, 7]
    g = Graph.from_json(doc)
    assert g.shape(0) == (2 ** 29, 2 ** 29, 7)


@pytest.mark.parametrize("shape", [[0, 2 ** 62], [2 ** 40, 2 ** 40], [2 ** 62, 2 ** 62, 7]])
def test_shapes_no_array_can_hold_are_refused(shape: list[int]) -> None:
    # [0, 2**62] is 0 bytes but NumPy and PyOpenCL refuse it ("array is too big").
    doc = base_doc()
    doc["attrs"]["shape"][1][0] = shape
    with pytest.raises(GraphError, match=r"at \$\.attrs\.shape\[1\]\[0\]: node 0 .* has shape "
                                         r".*more than 2\^63 bytes"):
        Graph.from_json(doc)


def test_a_tvm_op_without_flatten_data_is_refused_naming_it() -> None:
    doc = base_doc()
    tvm = next(n for n in doc["nodes"] if n["op"] == "tvm_op")
    del tvm["attrs"]["flatten_data"]
    with pytest.raises(GraphError, match=r"node \d+ '.*' is a tvm_op node without "
                                         r"attrs\.flatten_data; TVM requires"):
        Graph.from_json(doc)


# ---------------------------------------------------------------- random mutations

JSON_SCALARS = (st.none() | st.booleans() | st.integers(-3, 12) | st.integers()
                | st.floats(allow_nan=False) | st.text(max_size=6)
                | st.sampled_from(["null", "tvm_op", "list_int", "list_str", "float32", "1"]))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=6)


def _positions(value: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _positions(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _positions(item, path + (index,))
    return out


def _mutate(doc: dict, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(_positions(doc)[1:]))
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    key = path[-1]
    value = parent[key]
    kind = data.draw(st.sampled_from(["delete", "replace", "number", "truncate", "swap", "dup"]))
    if kind == "delete":
        del parent[key]
    elif kind == "replace":
        parent[key] = data.draw(JSON_VALUES)
    elif kind == "number":
        parent[key] = data.draw(st.integers(-2, 8) | st.integers(2 ** 31, 2 ** 64))
    elif kind == "truncate" and isinstance(value, list):
        del value[data.draw(st.integers(0, len(value))):]
    elif kind == "swap" and isinstance(value, list) and len(value) >= 2:
        i = data.draw(st.integers(0, len(value) - 1))
        j = data.draw(st.integers(0, len(value) - 1))
        value[i], value[j] = value[j], value[i]
    elif kind == "dup" and isinstance(value, list) and value:
        value.append(copy.deepcopy(value[data.draw(st.integers(0, len(value) - 1))]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_graph_is_a_graph_error_or_a_valid_graph(data: st.DataObject) -> None:
    doc = base_doc()
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate(doc, data)
    try:
        plain = json.loads(json.dumps(doc))
    except ValueError:  # inf
        plain = None
    if plain is not None:  # the fast path agrees with jsonschema
        assert matches_schema(plain) == (schema_problems(plain, "graph.schema.json", "g") == [])
    try:
        g = Graph.from_json(doc)
    except GraphError as e:
        assert str(e).startswith("<graph>")
        return
    assert check_graph(doc) == []
    assert json.loads(g.to_json()) == doc
    for eid in range(g.num_entries):  # every accessor works on whatever validated
        assert len(g.shape(eid)) <= 32 and g.storage_id(eid) >= 0
        assert g.dtype(eid) in SUPPORTED_DTYPES and f"(eid {eid})" in g.entry_label(eid)
    for node in g.nodes:
        assert node.num_inputs == len(node.inputs)
        assert len(g.node_entries(node.nid)) == node.num_outputs
        assert isinstance(node.flatten_data, bool)
    assert all(0 <= eid < g.num_entries for eid in g.output_entries)
    assert len(set(g.input_names)) == len(g.arg_nodes)


# ---------------------------------------------------------------- build and with_columns

NODES = [
    {"op": "null", "name": "x"},
    {"op": "null", "name": "w"},
    {"op": "tvm_op", "name": "dense0", "inputs": [[0, 0, 0], [1, 0, 0]],
     "attrs": {"func_name": "dense", "num_inputs": "2", "num_outputs": "1", "flatten_data": "0"}},
    {"op": "tvm_op", "name": "split", "inputs": [[2, 0, 0]],
     "attrs": {"func_name": "split", "num_inputs": 1, "num_outputs": 2, "flatten_data": 0}},
]


def test_build_computes_arg_nodes_row_ptr_and_storage() -> None:
    g = Graph.build(NODES, [[3, 0, 0], 3], shapes=[(1, 4), (4, 4), (1, 4), (1, 2), (1, 2)],
                    dtypes="float32", device_index=[1, 1, 4, 4, 4])
    assert g.arg_nodes == (0, 1)
    assert g.node_row_ptr == (0, 1, 2, 3, 5)
    assert g.heads == ((3, 0, 0), (3, 0, 0))
    assert g.column("storage_id") == [0, 1, 2, 3, 4]
    assert g.column("shape") == [[1, 4], [4, 4], [1, 4], [1, 2], [1, 2]]
    assert g.device_index(2) == 4
    assert g.nodes[0].inputs == () and "inputs" not in NODES[0]  # caller's dicts untouched
    assert Graph.from_json(g.to_json()).to_dict() == g.to_dict()


def test_build_accepts_numpy_values_and_extra_columns() -> None:
    g = Graph.build(NODES[:2], [np.int64(1)], shapes=np.array([[2, 3], [3, 2]]),
                    dtypes=["int8", "bool"], storage_ids=np.array([0, 0]), device_id=[0, 1],
                    extra_columns={"tag": ["a", "b"], "ranks": ("list_int", [2, 2])})
    assert g.storage_id(1) == 0 and g.dtype(1) == "bool" and g.device_id(1) == 1
    assert g.attrs["tag"] == ("list_str", ["a", "b"])
    assert g.attrs["ranks"] == ("list_int", [2, 2])


def test_build_validates() -> None:
    with pytest.raises(GraphError, match=r"at \$.attrs.dltype: expected 5 values"):
        Graph.build(NODES, [3], shapes=[[1]] * 5, dtypes=["float32"] * 4)
    with pytest.raises(GraphError, match="node 3 'split' input 0 refers to node 7"):
        Graph.build(NODES[:3] + [dict(NODES[3], inputs=[[7, 0]])], [3], shapes=[[1]] * 5,
                    dtypes="float32")


def test_with_columns_replaces_adds_and_removes() -> None:
    g = Graph.from_json(base_doc())
    shared = g.with_columns(storage_id=[0, 1, 0, 1, 0, 1], device_index=[1, 1, 2, 2, 2, 2])
    assert shared.column("storage_id") == [0, 1, 0, 1, 0, 1]
    assert shared.device_index(3) == 2
    assert g.column("storage_id") == [0, 1, 2, 3, 4, 5] and g.column("device_index") is None
    assert shared.with_columns(device_index=None).to_dict() == \
        g.with_columns(storage_id=[0, 1, 0, 1, 0, 1]).to_dict()
    named = g.with_columns(notes=["a"] * 6, dims=[[1]] * 6)
    assert named.attrs["notes"][0] == "list_str" and named.attrs["dims"][0] == "list_shape"


def test_with_columns_validates() -> None:
    g = Graph.from_json(base_doc(), source_name="graph.json")
    with pytest.raises(GraphError, match=r"graph.json at \$.attrs.device_index: expected 6 values"):
        g.with_columns(device_index=[1, 2])
    with pytest.raises(GraphError, match=r"eid 1\): expected a storage id .* got -1"):
        g.with_columns(storage_id=[0, -1, 0, 0, 0, 0])
    with pytest.raises(GraphError, match=r"\$.attrs: missing key 'storage_id'"):
        g.with_columns(storage_id=None)


def test_accessors_name_the_bad_entry_or_node() -> None:
    g = Graph.from_json(base_doc(), source_name="graph.json")
    with pytest.raises(GraphError, match="graph.json: node 9 does not exist"):
        g.entry_id(9, 0)
    with pytest.raises(GraphError, match=r"node 3 'split' has no output 2 \(it has 2 outputs\)"):
        g.entry_id(3, 2)
    with pytest.raises(GraphError, match="entry 6 does not exist .the graph has 6 entries"):
        g.shape(6)
    with pytest.raises(GraphError, match="entry -1 does not exist"):
        g.dtype(-1)
    with pytest.raises(GraphError, match="node 5 does not exist .the graph has 5 nodes"):
        g.node_entries(5)


def test_node_properties_parse_or_say_why() -> None:
    node = Node(nid=3, op="tvm_op", name="f", inputs=((0, 0),), attrs={"num_outputs": "x"})
    assert node.num_inputs == 1 and node.func_name is None
    with pytest.raises(GraphError, match=r"node 3 'f': attrs.num_outputs: expected a count"):
        node.num_outputs
    assert node.to_dict() == {"op": "tvm_op", "name": "f", "inputs": [[0, 0]],
                              "attrs": {"num_outputs": "x"}}
