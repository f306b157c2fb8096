"""lib/ops/control_flow.py: the shape rules of onnx_if, onnx_loop and onnx_scan and their refusals
(the kernels run in tests/frontend/test_convert_control.py against ONNX Runtime)."""
from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

from graph_runtime.errors import LibraryError
from graph_runtime.frontend.subgraph import body_model
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.registry import get_op

F = TensorProto.FLOAT
PARENT = helper.make_model(helper.make_graph([], "g", [], []),
                           opset_imports=[helper.make_opsetid("", 17)])


_FORMAL = {F: ((0,), "float32"), TensorProto.INT64: ((), "int64"),
           TensorProto.BOOL: ((), "bool")}


def _add_body(inputs: list[tuple[str, int]], outputs: list[str], nodes: list,
              bool_first: bool = False) -> str:
    """A body model (base64); float outputs unless bool_first (a Loop's condition first)."""
    types = [TensorProto.BOOL if bool_first and k == 0 else F for k in range(len(outputs))]
    graph = helper.make_graph(nodes, "body",
                              [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
                              [helper.make_tensor_value_info(n, t, None)
                               for n, t in zip(outputs, types)])
    return body_model(graph, PARENT, [_FORMAL[t] for _, t in inputs], {}, {})


def _scan_body() -> str:
    return _add_body([("s", F), ("x", F)], ["s2", "y"],
                     [helper.make_node("Add", ["s", "x"], ["s2"]),
                      helper.make_node("Neg", ["s2"], ["y"])])


def test_scan_shapes_follow_its_inputs_and_batch() -> None:
    op = get_op("onnx_scan")
    attrs = {"body": _scan_body(), "num_states": 1, "num_scan_inputs": 1}
    got = op.infer([TensorSpec((4,), "float32"), TensorSpec((6, 4), "float32")], attrs)
    assert [(s.shape, s.dtype) for s in got] == [((4,), "float32"), ((6, 4), "float32")]
    got = op.infer([TensorSpec((2, 4), "float32"), TensorSpec((2, 6, 4), "float32")],
                   {**attrs, "batched": True})
    assert [s.shape for s in got] == [(2, 4), (2, 6, 4)]


def test_scan_inputs_of_different_lengths_are_refused() -> None:
    body = _add_body([("s", F), ("x", F), ("z", F)], ["s2", "y"],
                     [helper.make_node("Add", ["s", "x"], ["s2"]),
                      helper.make_node("Add", ["s2", "z"], ["y"])])
    attrs = {"body": body, "num_states": 1, "num_scan_inputs": 2}
    specs = [TensorSpec((4,), "float32"), TensorSpec((6, 4), "float32"),
             TensorSpec((5, 4), "float32")]
    with pytest.raises(LibraryError, match=r"onnx_scan: scan inputs must share their length on "
                                           r"axis 0; got shapes \[\(6, 4\), \(5, 4\)\]"):
        get_op("onnx_scan").infer(specs, attrs)


def test_if_needs_a_one_element_condition() -> None:
    branch = _add_body([], ["c"], [helper.make_node("Constant", [], ["c"], value_float=1.0)])
    attrs = {"then_branch": branch, "else_branch": branch}
    with pytest.raises(LibraryError, match=r"onnx_if: the condition must hold one element; got "
                                           r"shape \(2,\)"):
        get_op("onnx_if").infer([TensorSpec((2,), "bool")], attrs)


def test_loop_scan_outputs_need_a_planned_iteration_count() -> None:
    body = _add_body([("i", TensorProto.INT64), ("c", TensorProto.BOOL), ("v", F)],
                     ["c2", "v2", "y"],
                     [helper.make_node("Identity", ["c"], ["c2"]),
                      helper.make_node("Neg", ["v"], ["v2"]),
                      helper.make_node("Identity", ["v2"], ["y"])], bool_first=True)
    specs = [TensorSpec((), "int64"), TensorSpec((), "bool"), TensorSpec((3,), "float32")]
    op = get_op("onnx_loop")
    got = op.infer(specs, {"body": body, "num_carried": 1, "iterations": 5})
    assert [s.shape for s in got] == [(3,), (5, 3)]
    with pytest.raises(LibraryError, match="onnx_loop: scan outputs need the iteration count "
                                           "known at import"):
        op.infer(specs, {"body": body, "num_carried": 1, "iterations": -1})
