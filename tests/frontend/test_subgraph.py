"""frontend/subgraph.py: what a sub-graph reads from outside, and the model it becomes."""
from __future__ import annotations

import base64

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

from graph_runtime.frontend.ir import Unsupported, Value
from graph_runtime.frontend.subgraph import (
    EMBED_ELEMENTS,
    body_model,
    fed_values,
    free_names,
    outer_reads,
)

F = TensorProto.FLOAT


def _body() -> onnx.GraphProto:
    """Reads a and big from outside, and c inside a nested branch; defines t and its input x."""
    inner = helper.make_graph([helper.make_node("Add", ["t", "c"], ["u"])], "inner", [],
                              [helper.make_tensor_value_info("u", F, None)])
    return helper.make_graph(
        [helper.make_node("Mul", ["x", "a"], ["t"]),
         helper.make_node("If", ["flag"], ["r"], then_branch=inner, else_branch=inner),
         helper.make_node("Add", ["r", "big"], ["y"])],
        "body", [helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, [2])])


def test_free_names_include_reads_of_nested_graphs_in_read_order() -> None:
    assert free_names(_body()) == ["a", "flag", "c", "big"]


def test_small_constants_are_embedded_and_the_rest_fed() -> None:
    big = np.zeros(EMBED_ELEMENTS + 1, np.float32)
    scope = {"a": Value("a", (2,), "float32", const=np.ones(2, np.float32)),
             "flag": Value("flag", (), "bool", is_input=True),
             "c": Value("c#3", (2,), "float32"),
             "big": Value("big", big.shape, "float32", const=big)}
    fed, embedded = outer_reads([_body()], scope, "Loop 'l'")
    assert fed == ["flag", "c", "big"] and list(embedded) == ["a"]
    parent = helper.make_model(helper.make_graph([], "g", [], []),
                               opset_imports=[helper.make_opsetid("", 17)])
    b64 = body_model(_body(), parent, [((2,), "float32")], fed_values(fed, scope), embedded)
    model = onnx.ModelProto.FromString(base64.b64decode(b64))
    # Fed values keep their ONNX names (not the importer's value names) and only their ranks.
    assert [i.name for i in model.graph.input] == ["x", "flag", "c", "big"]
    assert [len(i.type.tensor_type.shape.dim) for i in model.graph.input] == [1, 0, 1, 1]
    assert [t.name for t in model.graph.initializer] == ["a"]


def test_a_read_of_an_unknown_or_refused_value_is_refused_by_name() -> None:
    scope = {"a": None}
    with pytest.raises(Unsupported, match="Loop 'l' reads outer value 'a', which is itself "
                                          "refused"):
        outer_reads([_body()], scope, "Loop 'l'")
    with pytest.raises(Unsupported, match="reads outer value 'a', which is not defined"):
        outer_reads([_body()], {}, "Loop 'l'")
