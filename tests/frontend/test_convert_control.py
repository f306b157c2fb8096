"""If, Loop and Scan built with onnx.helper against ONNX Runtime, and their refusals.

Scan axes and directions, a while loop whose body computes its condition, a Loop whose scan
outputs specialise on its trip count, an If whose branches differ in shape (specialised on the
condition), control flow nested in a body reading values two scopes out; each on every backend.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime", reason="ONNX Runtime is the reference here")
from onnx import TensorProto, helper

import graph_runtime as gr
from graph_runtime.errors import FrontendError, GraphRuntimeError
from graph_runtime.frontend import import_onnx

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _info(name: str, elem: int, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes: list, inputs: list, outputs: list, inits: tuple = (),
           opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8  # what every ONNX Runtime the tests may meet reads
    return m


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value))


def _check(model: onnx.ModelProto, backend: str, feeds_list: list[dict]) -> gr.GraphModule:
    """Import once, run every feed, compare each output with ONNX Runtime."""
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    result = import_onnx(model)
    module = gr.create(result.graph_json, result.module(), gr.device(backend))
    if result.params:
        module.load_params(gr.save_param_dict(result.params))
    for feeds in feeds_list:
        want = session.run(None, feeds)
        module.run(**feeds)
        for i, ref in enumerate(want):
            got = module.get_output(i).numpy()
            assert got.shape == ref.shape and got.dtype == ref.dtype, (i, got.shape, ref.shape)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    return module


def scan_model() -> onnx.ModelProto:
    """A running sum over axis 1 read backwards, scaled by an outer value; the scan output laid
    out along axis 1 and written backwards, plus a second scan output along axis 0."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["x_t", "scale"], ["xs"]),
         helper.make_node("Add", ["s_in", "xs"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y_t"]),
         helper.make_node("Neg", ["x_t"], ["z_t"])],
        "body", [_info("s_in", F, [3]), _info("x_t", F, [3])],
        [_info("s_out", F, [3]), _info("y_t", F, [3]), _info("z_t", F, [3])])
    scan = helper.make_node("Scan", ["s0", "x"], ["s", "y", "z"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1],
                            scan_output_axes=[1, 0], scan_output_directions=[1, 0])
    return _model([helper.make_node("Sqrt", ["two"], ["scale"]), scan],
                  [_info("s0", F, [3]), _info("x", F, [3, 5]), _info("two", F, [])],
                  [_info("s", F, [3]), _info("y", F, [3, 5]), _info("z", F, [5, 3])])


def test_scan_axes_directions_and_outer_reads(backend_name: str) -> None:
    rng = np.random.default_rng(0)
    feeds = {"s0": rng.standard_normal(3).astype(np.float32),
             "x": rng.standard_normal((3, 5)).astype(np.float32),
             "two": np.array(2.0, np.float32)}
    _check(scan_model(), backend_name, [feeds])


def test_a_scan_of_length_zero_passes_its_states_through(backend_name: str) -> None:
    """Against NumPy: ONNX Runtime 1.32 dies of a floating point exception on this model."""
    model = scan_model()
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 0
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    result = import_onnx(model)
    module = gr.create(result.graph_json, result.module(), gr.device(backend_name))
    if result.params:
        module.load_params(gr.save_param_dict(result.params))
    s0 = np.arange(3, dtype=np.float32)
    module.run(s0=s0, x=np.zeros((3, 0), np.float32), two=np.array(2.0, np.float32))
    np.testing.assert_array_equal(module.get_output(0).numpy(), s0)
    assert module.get_output(1).numpy().shape == (3, 0)
    assert module.get_output(2).numpy().shape == (0, 3)


def while_model() -> onnx.ModelProto:
    """Double x until its sum passes a limit (no trip count: the body computes the condition)."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "two"], ["v_out"]),
         helper.make_node("ReduceSum", ["v_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["go"])],
        "body", [_info("i", I64, []), _info("c", B, []), _info("v_in", F, [4])],
        [_info("go", B, []), _info("v_out", F, [4])])
    loop = helper.make_node("Loop", ["", "c0", "x"], ["v"], body=body)
    return _model([_const("two", np.array(2.0, np.float32)), loop],
                  [_info("c0", B, []), _info("x", F, [4]), _info("limit", F, [])],
                  [_info("v", F, [4])])


def test_while_loop_stops_on_the_condition_its_body_computes(backend_name: str) -> None:
    x = np.array([0.5, 1.0, 0.25, 0.125], np.float32)
    feeds = [{"c0": np.array(c), "x": x, "limit": np.array(lim, np.float32)}
             for c, lim in [(True, 100.0), (True, 1.0), (False, 100.0), (True, 5000.0)]]
    _check(while_model(), backend_name, feeds)


def scan_loop_model() -> onnx.ModelProto:
    """A trip-count input; a carried accumulator and a scan output of each step's value."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["step"]),
         helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
         helper.make_node("Identity", ["c"], ["c_out"])],
        "body", [_info("i", I64, []), _info("c", B, []), _info("acc_in", F, [2])],
        [_info("c_out", B, []), _info("acc_out", F, [2]), _info("step", F, [2])])
    loop = helper.make_node("Loop", ["n", "", "acc0"], ["acc", "steps"], body=body)
    return _model([loop], [_info("n", I64, []), _info("acc0", F, [2]), _info("x", F, [2])],
                  [_info("acc", F, [2]), _info("steps", F, [None, 2])])


def test_loop_scan_outputs_specialise_on_the_trip_count(backend_name: str) -> None:
    acc0, x = np.array([1.0, -1.0], np.float32), np.array([0.5, 2.0], np.float32)
    feeds = [{"n": np.array(n, np.int64), "acc0": acc0, "x": x} for n in (3, 0, 6, 3)]
    module = _check(scan_loop_model(), backend_name, feeds)
    assert module.specializations == 3  # n = 3 again is cached


def if_shapes_model() -> onnx.ModelProto:
    """The then branch gives x (2 elements), the else branch x concatenated to itself (4)."""
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                             [_info("t", F, None)])
    other = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["e"], axis=0)], "else",
                              [], [_info("e", F, None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    return _model([node], [_info("c", B, []), _info("x", F, [2])], [_info("y", F, None)])


def test_if_with_branches_of_different_shapes_specialises_on_the_condition(
        backend_name: str) -> None:
    x = np.array([3.0, 4.0], np.float32)
    _check(if_shapes_model(), backend_name,
           [{"c": np.array(c), "x": x} for c in (True, False, True)])


def test_if_of_different_shapes_on_a_data_condition_specialises_per_value() -> None:
    """cond = sum(x) > 0: x becomes a value input; each new x value is one specialisation."""
    model = if_shapes_model()
    del model.graph.input[0]
    model.graph.node.insert(0, helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0))
    model.graph.node.insert(1, _const("z", np.array(0.0, np.float32)))
    model.graph.node.insert(2, helper.make_node("Greater", ["s", "z"], ["c"]))
    feeds = [{"x": np.array(v, np.float32)} for v in ([1, 2], [-1, -2], [3, 4], [1, 2])]
    assert _check(model, "cpu", feeds).specializations == 3


def nested_model() -> onnx.ModelProto:
    """A Loop whose body holds an If reading the outer graph's w and the body's own value."""
    then = helper.make_graph([helper.make_node("Add", ["h", "w"], ["a"])], "then", [],
                             [_info("a", F, [3])])
    other = helper.make_graph([helper.make_node("Sub", ["h", "w"], ["b"])], "else", [],
                              [_info("b", F, [3])])
    body = helper.make_graph(
        [helper.make_node("Tanh", ["h_in"], ["h"]),
         helper.make_node("ReduceSum", ["h"], ["s"], keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["pos"]),
         helper.make_node("If", ["pos"], ["h_out"], then_branch=then, else_branch=other),
         helper.make_node("Identity", ["c"], ["c_out"])],
        "body", [_info("i", I64, []), _info("c", B, []), _info("h_in", F, [3])],
        [_info("c_out", B, []), _info("h_out", F, [3])])
    loop = helper.make_node("Loop", ["n", "", "h0"], ["h"], body=body)
    return _model([_const("zero", np.array(0.0, np.float32)), loop],
                  [_info("n", I64, []), _info("h0", F, [3]), _info("w", F, [3])],
                  [_info("h", F, [3])])


def test_nested_control_flow_reads_values_two_scopes_out(backend_name: str) -> None:
    rng = np.random.default_rng(1)
    feeds = [{"n": np.array(n, np.int64), "h0": rng.standard_normal(3).astype(np.float32),
              "w": rng.standard_normal(3).astype(np.float32)} for n in (1, 4, 9)]
    _check(nested_model(), backend_name, feeds)


# ---- refusals and bounds -----------------------------------------------------------------

def test_a_loop_that_never_ends_stops_at_the_iteration_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from graph_runtime.settings import LOOP_MAX_ITERATIONS
    monkeypatch.setenv(LOOP_MAX_ITERATIONS.name, "30")
    model = while_model()
    result = import_onnx(model)
    module = gr.create(result.graph_json, result.module())
    module.load_params(gr.save_param_dict(result.params))
    x = np.array([0.5, 1.0, 0.25, 0.125], np.float32)
    # The sum never reaches an infinite limit: the condition holds forever.
    with pytest.raises(GraphRuntimeError, match=r"node \d+ 'tvmgen_default_fused_onnx_loop'.*"
                                                r"ran 30 iterations.*"
                                                r"GRAPH_RUNTIME_LOOP_MAX_ITERATIONS"):
        module.run(c0=np.array(True), x=x, limit=np.array(np.inf, np.float32))


def early_stop_scan_model(trip_count: bool = True, width: int | str = 2
                          ) -> onnx.ModelProto:
    """A Loop whose body stops it once the accumulator's sum passes a limit, with a scan output
    of each step read after it (how many rows it has only the data decides)."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["step"]),
         helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["go"])],
        "body", [_info("i", I64, []), _info("c", B, []), _info("acc_in", F, [width])],
        [_info("go", B, []), _info("acc_out", F, [width]), _info("step", F, [width])])
    loop = helper.make_node("Loop", ["n" if trip_count else "", "c0", "acc0"], ["acc", "steps"],
                            body=body)
    inputs = [_info("c0", B, []), _info("acc0", F, [width]), _info("x", F, [width]),
              _info("limit", F, [])]
    return _model([loop, _const("axis0", np.array([0], np.int64)),
                   helper.make_node("ReduceSum", ["steps", "axis0"], ["summed"], keepdims=0)],
                  ([_info("n", I64, [])] if trip_count else []) + inputs,
                  [_info("acc", F, [width]), _info("steps", F, [None, width]),
                   _info("summed", F, [width])])


def test_scan_outputs_of_a_loop_that_stops_early_run_in_segments(backend_name: str) -> None:
    """The scan outputs' length is named (Loop_steps) and the graph is cut at the Loop: it runs
    on the host, and the sum after it is specialised per length; stopped by the body, by the
    trip count, before the first iteration, and with no trip count at all."""
    from graph_runtime.runtime.segmented_module import SegmentedGraphModule
    base = {"acc0": np.array([1.0, -1.0], np.float32), "x": np.array([0.5, 2.0], np.float32)}
    feeds = [{"n": np.array(n, np.int64), "c0": np.array(c0),
              "limit": np.array(limit, np.float32), **base}
             for n, c0, limit in [(10, True, 20.0), (10, True, 1e9), (10, False, 5.0),
                                  (3, True, 1e9), (10, True, -1.0), (0, True, 5.0),
                                  (10, True, 20.0)]]
    module = _check(early_stop_scan_model(), backend_name, feeds)
    assert isinstance(module, SegmentedGraphModule)
    assert module.describe_cuts()[0].endswith("(onnx_loop_dynamic) after segment 0, binds "
                                              "Loop_steps; outputs (2,), (Loop_steps, 2)")
    assert module.modules[1].specializations == 5  # lengths 5, 10, 0, 3, 1 (0 again, 5 again)
    whiles = [{"c0": np.array(True), "limit": np.array(limit, np.float32), **base}
              for limit in (30.0, 1.0)]
    _check(early_stop_scan_model(trip_count=False), backend_name, whiles)


def test_an_early_stopping_loop_over_a_symbolic_dim_specialises_per_width_and_length() -> None:
    """acc0 and x of a named width: imported once, each (width, length) runs against ONNX
    Runtime (the length bound by the cut, the width by the inputs)."""
    feeds = [{"n": np.array(12, np.int64), "c0": np.array(True),
              "acc0": np.ones(w, np.float32), "x": np.linspace(0.5, 2, w).astype(np.float32),
              "limit": np.array(limit, np.float32)}
             for w, limit in [(2, 20.0), (5, 100.0), (3, 1e9), (5, 100.0)]]
    module = _check(early_stop_scan_model(width="W"), "cpu", feeds)
    assert module.signature.endswith("acc0: (W,) float32; x: (W,) float32; limit: () float32")


def test_an_early_stopping_loop_with_scan_outputs_stops_at_the_iteration_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from graph_runtime.settings import LOOP_MAX_ITERATIONS
    monkeypatch.setenv(LOOP_MAX_ITERATIONS.name, "30")
    result = import_onnx(early_stop_scan_model(trip_count=False))
    module = gr.create(result.graph_json, result.module())
    feeds = {"c0": np.array(True), "acc0": np.zeros(2, np.float32), "x": np.zeros(2, np.float32),
             "limit": np.array(1.0, np.float32)}
    with pytest.raises(GraphRuntimeError, match=r"onnx_loop_dynamic\) reads input "
                                                r"'trip_count' \(eid \d+\), never set"):
        module.run(**feeds)
    module.load_params(gr.save_param_dict(result.params))
    with pytest.raises(GraphRuntimeError, match=r"node \d+ 'tvmgen_default_fused_onnx_loop_"
                                                r"dynamic' \(onnx_loop_dynamic\).*ran 30 "
                                                r"iterations.*GRAPH_RUNTIME_LOOP_MAX_ITERATIONS"):
        module.run(**feeds)


def test_a_huge_trip_count_with_scan_outputs_is_refused_before_allocating() -> None:
    model = scan_loop_model()
    model.graph.input.pop(0)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(10**12, np.int64), "n"))
    with pytest.raises(FrontendError, match=r"trip count of 1000000000000 with scan outputs"):
        import_onnx(model)


def test_a_carried_value_changing_shape_is_refused() -> None:
    model = while_model()
    body = model.graph.node[1].attribute[0].g
    body.node[0].CopyFrom(helper.make_node("Concat", ["v_in", "v_in"], ["v_out"], axis=0))
    with pytest.raises(FrontendError, match=r"carried value 0: its sub-graph gives \(8,\) "
                                            r"float32 for a value that enters as \(4,\)"):
        import_onnx(model)


def test_sequence_outputs_of_a_branch_are_refused() -> None:
    model = if_shapes_model()
    for branch in model.graph.node[0].attribute:
        out = branch.g.node[0].output[0]
        branch.g.node.append(helper.make_node("SequenceConstruct", [out], ["seq"]))
        del branch.g.output[:]
        branch.g.output.append(helper.make_tensor_sequence_value_info("seq", F, None))
    with pytest.raises(FrontendError, match=r"output 'seq' is of sequence type; only tensors"):
        import_onnx(model)


def test_a_body_op_the_device_lacks_runs_on_the_cpu(backend_name: str) -> None:
    """A Loop body rounding through bfloat16 (convert_type: CPU only): on OpenCL the body's
    other ops stay there and the casts run on the CPU, copies inserted by the planner."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "x"], ["m"]),
         helper.make_node("Cast", ["m"], ["b"], to=TensorProto.BFLOAT16),
         helper.make_node("Cast", ["b"], ["v_out"], to=F),
         helper.make_node("Identity", ["c"], ["c_out"])],
        "body", [_info("i", I64, []), _info("c", B, []), _info("v_in", F, [3])],
        [_info("c_out", B, []), _info("v_out", F, [3])])
    loop = helper.make_node("Loop", ["n", "", "v0"], ["v"], body=body)
    model = _model([loop], [_info("n", I64, []), _info("v0", F, [3]), _info("x", F, [3])],
                   [_info("v", F, [3])])
    feeds = [{"n": np.array(n, np.int64), "v0": np.array([1.0, -2.0, 0.5], np.float32),
              "x": np.array([1.1, 0.9, 1.7], np.float32)} for n in (0, 4)]
    _check(model, backend_name, feeds)


def test_an_unsupported_op_in_a_body_is_refused_naming_the_node_and_the_body_node() -> None:
    model = while_model()
    body = model.graph.node[1].attribute[0].g
    body.node.append(helper.make_node("RandomNormalLike", ["v_out"], ["u"]))
    body.output[1].name = "u"
    with pytest.raises(FrontendError, match=r"Loop: onnx_loop sub-graph 'body'.*RandomNormalLike.*"
                                            r"\(node '<Loop -> v>'\)"):
        import_onnx(model)


def test_a_sequence_typed_graph_input_is_refused_as_such() -> None:
    """ONNX's test_loop13_seq feeds the Loop a sequence: refused naming the type, not a dtype."""
    model = while_model()
    model.graph.input[1].CopyFrom(helper.make_tensor_sequence_value_info("x", F, None))
    with pytest.raises(FrontendError, match=r"graph input: sequence type; sequences, optionals "
                                            r"and maps are not supported, only tensors"):
        import_onnx(model)


def test_a_loop_over_a_symbolic_dim_plans_its_scan_outputs_per_size(backend_name: str) -> None:
    """for i in range(x.shape[0]) with scan outputs, x's batch dim named: the iteration count
    is written as the dim (`{"dim": "batch"}`) and each batch size specialises."""
    body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
         helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
         helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Mul", ["acc_out", "row"], ["y"])],
        "body", [_info("i", I64, []), _info("c", B, []), _info("acc_in", F, [3])],
        [_info("c_out", B, []), _info("acc_out", F, [3]), _info("y", F, [3])])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Loop", ["n", "", "acc0"], ["acc", "ys"], body=body)]
    model = _model(nodes, [_info("x", F, ["batch", 3]), _info("acc0", F, [3])],
                   [_info("acc", F, [3]), _info("ys", F, ["batch", 3])],
                   [onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")])
    loop = [f for f in import_onnx(model).lib_doc["functions"].values()
            if f.get("op") == "onnx_loop"]
    assert loop[0]["iterations"] == {"dim": "batch"}
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.standard_normal((b, 3)).astype(np.float32),
              "acc0": np.ones(3, np.float32)} for b in (2, 5, 1)]
    _check(model, backend_name, feeds)


def test_memory_report_counts_the_bodies_control_flow_holds(backend_name: str) -> None:
    """A Loop holds one body module, an If two (an If whose branches differ in shape is an
    onnx_region: its module per condition); their pools and workspace are the bodies column
    on the node's device (at least the body's inputs and outputs: the while body takes i
    int64, c bool and v (4,) float32 and gives go bool and v, 42 bytes), not the pool."""
    x = np.array([0.5, 1.0, 0.25, 0.125], np.float32)
    loop = _check(while_model(), backend_name,
                  [{"c0": np.array(True), "x": x, "limit": np.array(10.0, np.float32)}])
    dev = gr.device(backend_name)
    report = loop.memory_report()
    held = [m.held_bytes() for step in loop.executor.steps for m in step.kernel.sub_modules()]
    assert len(held) == 1 and report.bodies == held[0]
    assert report.bodies[dev] >= 8 + 1 + 16 + 1 + 16
    assert "bodies" in str(report) and report.held()[dev] == (
        report.pool[dev] + report.workspace.get(dev, 0) + report.bodies[dev])
    rng = np.random.default_rng(4)
    branches = _check(nested_model(), backend_name, [
        {"n": np.array(3, np.int64), "h0": rng.standard_normal(3).astype(np.float32),
         "w": rng.standard_normal(3).astype(np.float32)}])
    parts = [m for step in branches.executor.steps for m in step.kernel.sub_modules()]
    assert len(parts) == 1
    inner = [m for step in parts[0].executor.steps for m in step.kernel.sub_modules()]
    assert inner  # the If inside the Loop body: its branches are in the body's own bodies
    assert parts[0].memory_report().bodies[dev] == sum(m.held_bytes()[dev] for m in inner)
    assert branches.memory_report().bodies[dev] == parts[0].held_bytes()[dev]
    region = _check(if_shapes_model(), backend_name,
                    [{"c": np.array(c), "x": np.array([3.0, 4.0], np.float32)}
                     for c in (True, False)])
    assert region.memory_report().bodies[dev] > 0  # the module for c = False
    assert region.held_bytes()[dev] > region.memory_report().held()[dev]  # and for True
    relu = import_onnx(_model([helper.make_node("Relu", ["x"], ["y"])], [_info("x", F, [4])],
                              [_info("y", F, [4])]))
    plain = gr.create(relu.graph_json, relu.module())
    assert plain.memory_report().bodies == {} and "bodies" not in str(plain.memory_report())
