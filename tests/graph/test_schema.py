"""Tests for schemas/graph.schema.json and graph_runtime.schema: examples validate, errors read."""
from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from graph_runtime.errors import GraphError, LibraryError
from graph_runtime.graph.checks import matches_schema
from graph_runtime.graph.model import SUPPORTED_DTYPES, Graph, load_graph
from graph_runtime.graph.schema import brief, json_path, load_schema, schema_problems, type_name

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("examples/graphs/*/graph*.json"))


def small_graph() -> Graph:
    return Graph.build(
        [{"op": "null", "name": "x"},
         {"op": "tvm_op", "name": "relu0", "inputs": [[0, 0, 0]],
          "attrs": {"func_name": "relu", "num_inputs": "1", "num_outputs": "1",
                    "flatten_data": "0"}}],
        [1], shapes=[[2, 3], [2, 3]], dtypes="float32", device_index=[1, 4])


def test_schema_is_package_data_and_a_valid_2020_12_schema() -> None:
    shipped = json.loads(files("graph_runtime.schemas").joinpath("graph.schema.json").read_text())
    assert shipped == json.loads((ROOT / "schemas" / "graph.schema.json").read_text())
    assert load_schema("graph.schema.json") == shipped
    assert shipped["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(shipped)


def test_schema_lists_the_supported_dtypes() -> None:
    assert tuple(load_schema("graph.schema.json")["$defs"]["dltype"]["enum"]) == SUPPORTED_DTYPES


def test_built_graph_validates_with_a_plain_validator() -> None:
    validator = Draft202012Validator(load_schema("graph.schema.json"))
    doc = small_graph().to_dict()
    assert list(validator.iter_errors(doc)) == []
    doc["attrs"]["storage_id"] = ["list_int", [0, -1]]
    assert [e.json_path for e in validator.iter_errors(doc)] == ["$.attrs.storage_id[1][1]"]


@pytest.mark.parametrize("path", EXAMPLES, ids=[f"{p.parent.name}/{p.name}" for p in EXAMPLES])
def test_example_validates(path: Path) -> None:
    doc = json.loads(path.read_text())
    errors = Draft202012Validator(load_schema("graph.schema.json")).iter_errors(doc)
    assert [f"{e.json_path}: {e.message}" for e in errors] == []
    assert json.loads(load_graph(path).to_json()) == doc  # and passes the semantic checks


def test_json_path() -> None:
    assert json_path([]) == "$"
    assert json_path(["nodes", 3, "inputs", 0]) == "$.nodes[3].inputs[0]"
    assert json_path(["attrs", "my col"]) == '$.attrs["my col"]'


def test_brief_and_type_name() -> None:
    assert brief(["list_str", ["a", "b"]]) == '["list_str", [...]]'
    assert brief(list(range(10))) == "[0, 1, 2, 3, ...]"
    assert brief("x" * 100).endswith('..."') and len(brief("x" * 100)) <= 40
    assert brief({"a": {"b": 1}}) == '{"a": {...}}'
    assert brief(object()) == "<object>"
    assert [type_name(v) for v in (None, True, 1, 1.5, "s", [], {})] == \
        ["null", "boolean", "integer", "number", "string", "array", "object"]


def test_schema_problems_use_the_given_error_type_and_labels() -> None:
    doc = small_graph().to_dict()
    doc["nodes"][1]["inputs"] = [[0, 0.0]]
    doc["heads"] = [[1, True]]
    problems = schema_problems(doc, "graph.schema.json", "lib.json", error=LibraryError,
                               where=lambda path: "HERE" if path[:1] == ["nodes"] else "")
    assert [type(p) for p in problems] == [LibraryError, LibraryError]
    assert str(problems[0]) == ("lib.json at $.nodes[1].inputs[0][1], HERE: expected an output "
                                "index (integer), got number 0.0")
    assert str(problems[1]) == ("lib.json at $.heads[0][1]: expected an output index (integer), "
                                "got boolean true")


def test_problems_are_not_repeated() -> None:
    doc = small_graph().to_dict()
    del doc["nodes"][1]["name"]
    del doc["nodes"][1]["op"]
    problems = schema_problems(doc, "graph.schema.json", "g.json")
    assert [str(p) for p in problems] == [
        "g.json at $.nodes[1]: missing keys 'op', 'name'; required keys: op, name, inputs"]
    assert all(isinstance(p, GraphError) for p in problems)


def test_missing_schema_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="schema 'nope.schema.json' is not installed"):
        load_schema("nope.schema.json")


TRICKY = [
    (("nodes", 1, "attrs", "num_outputs"), v) for v in
    ("0", "01", "1\n", "", "\u0661", "1000000000", True, 1.0, 0, 10 ** 9, "999999999", None)
] + [
    (("nodes", 1, "attrs", "num_inputs"), v) for v in ("0", "007", " 1", -1, False, "1e3")
] + [
    (("nodes", 1, "attrs", "flatten_data"), v) for v in (True, 1.0, "2", "1", 0, None)
] + [
    (("nodes", 1, "attrs", "func_name"), v) for v in ("", None, 3, "f")
] + [
    (("nodes", 1, "inputs", 0), [0, 0, 0, 0]), (("nodes", 1, "inputs", 0), [0, 0, -1]),
    (("nodes", 1, "inputs", 0), [0, 0, 2 ** 31]), (("nodes", 1, "inputs", 0), [0, 10 ** 9]),
    (("nodes", 1, "control_deps"), [-1]), (("nodes", 1, "control_deps"), [0]),
    (("nodes", 1, "attr"), {"func_name": "g"}), (("nodes", 1, "attrs"), []),
    (("nodes", 1, "op"), ["null"]), (("nodes", 1, "name"), 1), (("nodes", 0, "inputs"), None),
    (("attrs", "dltype", 1, 0), 32), (("attrs", "dltype", 0), "list_int"),
    (("attrs", "shape", 1, 0), [1] * 32), (("attrs", "shape", 1, 0), [1] * 33),
    (("attrs", "shape", 1, 0), [2 ** 63]), (("attrs", "shape", 1, 0), [2 ** 63 - 1]),
    (("attrs", "device_index", 1, 0), 0), (("attrs", "device_id"), ["list_int", [0, -1]]),
    (("attrs", "x"), ["list_shape", [[1], [-1]]]), (("attrs", "x"), ["list_str", ["a", 1]]),
    (("attrs", "x"), ["list_int", [True, 1]]), (("attrs", "x"), ["list_int", [1, 2], 3]),
    (("attrs", "x"), "list_int"), (("attrs",), {}), (("node_row_ptr",), []),
    (("node_row_ptr", 0), -1), (("arg_nodes",), {}), (("heads", 0), [1]),
    (("metadata",), [float("1e308"), {"deep": [[[]]]}]),
]


@pytest.mark.parametrize("path, value", TRICKY, ids=[f"{p}={v!r}"[:60] for p, v in TRICKY])
def test_fast_path_agrees_with_the_schema(path: tuple, value: object) -> None:
    doc = small_graph().to_dict()
    target = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    expected = schema_problems(doc, "graph.schema.json", "g") == []
    assert matches_schema(doc) == expected
