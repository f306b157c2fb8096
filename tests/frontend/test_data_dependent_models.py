"""Models whose output sizes depend on the data (NonZero, Unique, Compress, NonMaxSuppression),
built with onnx.helper, against ONNX Runtime: imported once, run for data of every size."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx_builders import init, model, run_ort, tensor

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

import graph_runtime as gr
from graph_runtime.errors import FrontendError
from graph_runtime.frontend import from_onnx, import_onnx

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _ending_in_nonzero():
    """x -> Relu -> NonZero (an output), and the selected values through GatherND after it."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"]),
             helper.make_node("GatherND", ["x", "idx"], ["picked"]),
             helper.make_node("Mul", ["picked", "two"], ["scaled"])]
    return model(nodes, [tensor("x", F32, (3, 5))],
                 [tensor("nz", I64, None), tensor("scaled", F32, None)],
                 [init("two", np.array(2.0, np.float32))], opset=13)


def _module(m, device="cpu"):
    graph_json, lib, params = from_onnx(m)
    module = gr.create(graph_json, lib, gr.device(device))
    if params:
        module.load_params(gr.save_param_dict(params))
    return module


def _check(module, m, feeds):
    module.run(**feeds)
    want = run_ort(m, feeds)
    for i, w in enumerate(want):
        got = module.get_output(i).numpy()
        assert got.dtype == w.dtype and got.shape == w.shape, (i, got.shape, w.shape)
        np.testing.assert_array_equal(got, w)


def test_segmented_module_outputs_answer_to_the_models_names() -> None:
    m = _ending_in_nonzero()
    module = _module(m)
    x = np.array([[1, -1, 2, 0, 3]] * 3, np.float32)
    module.run(x=x)
    assert [module.get_output_index(n) for n in ("nz", "scaled")] == [0, 1]
    want = run_ort(m, {"x": x})
    np.testing.assert_array_equal(module.get_output("nz").numpy(), want[0])
    np.testing.assert_array_equal(module.get_output("scaled").numpy(), want[1])


def test_import_names_the_data_dependent_size() -> None:
    result = import_onnx(_ending_in_nonzero())
    graph = json.loads(result.graph_json)
    shapes = graph["attrs"]["shape"][1]
    assert [2, "NonZero_nz"] in shapes and ["NonZero_nz"] in shapes
    counts = [f.get("count") for f in result.lib_doc["functions"].values() if "count" in f]
    assert counts == [{"dim": "NonZero_nz"}]


def test_model_ending_in_nonzero_matches_onnxruntime_for_every_count() -> None:
    m = _ending_in_nonzero()
    module = _module(m)
    rng = np.random.default_rng(0)
    for x in [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3)] + \
             [-np.ones((3, 5), np.float32), np.ones((3, 5), np.float32)]:  # 0 and 15 kept
        _check(module, m, {"x": x})


def test_unique_and_compress_on_computed_values_match_onnxruntime() -> None:
    nodes = [helper.make_node("Greater", ["x", "zero"], ["keep"]),
             helper.make_node("Compress", ["x", "keep"], ["kept"], axis=0),
             helper.make_node("Floor", ["kept"], ["floored"]),
             helper.make_node("Unique", ["floored"], ["y", "first", "inverse", "counts"],
                              sorted=0),
             helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)]
    m = model(nodes, [tensor("x", F32, (12,))],
              [tensor(n, t, None) for n, t in (("y", F32), ("first", I64), ("inverse", I64),
                                                ("counts", I64), ("total", F32))],
              [init("zero", np.array(0.0, np.float32))], opset=13)
    module = _module(m)
    rng = np.random.default_rng(1)
    for _ in range(4):
        _check(module, m, {"x": np.round(rng.uniform(-3, 3, 12), 1).astype(np.float32)})


def test_nonzero_over_symbolic_input_dims() -> None:
    """A size from the inputs' symbolic dims and one from the data, in one graph."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("ReduceSum", ["nz"], ["s"], keepdims=0)]
    m = model(nodes, [tensor("x", BOOL, ("n", 4))], [tensor("s", I64, None)], opset=13)
    module = _module(m)
    rng = np.random.default_rng(2)
    for rows in (3, 7, 3):
        _check(module, m, {"x": rng.uniform(size=(rows, 4)) > 0.5})


@pytest.mark.opencl
def test_segments_run_on_opencl(opencl_available: None) -> None:
    """The segments' nodes on OpenCL, the cut between them on the host."""
    m = _ending_in_nonzero()
    module = _module(m, "opencl")
    rng = np.random.default_rng(3)
    for _ in range(3):
        _check(module, m, {"x": rng.standard_normal((3, 5)).astype(np.float32)})


def test_topk_with_k_computed_from_the_data() -> None:
    """k = min(number of non-zero scores, 100): two cuts (NonZero, then TopK reading k on the
    host); the probe sizes alone would have fitted k as the count (wrong past 100)."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Shape", ["nz"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Min", ["n", "cap"], ["k"]),
             helper.make_node("TopK", ["x", "k"], ["v", "i"])]
    m = model(nodes, [tensor("x", F32, (300,))], [tensor("v", F32, None), tensor("i", I64, None)],
              [init("one", np.array([1], np.int64)), init("cap", np.array([100], np.int64))],
              opset=13)
    module = _module(m)
    rng = np.random.default_rng(4)
    for keep in (0.1, 0.5, 0.9, 0.1):
        x = rng.standard_normal(300).astype(np.float32)
        x[rng.uniform(size=300) > keep] = 0
        _check(module, m, {"x": x})
    assert module.env["TopK_v"] == min(module.env["NonZero_nz"], 100)


def test_a_size_the_probes_cannot_explain_is_refused() -> None:
    """ConstantOfShape(min(count, 100)) is folded at the probes (37, 53: it looks like the count);
    the check at 1009 finds it is not, and the import says so instead of running wrong."""
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Shape", ["nz"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Min", ["n", "cap"], ["k"]),
             helper.make_node("ConstantOfShape", ["k"], ["zeros"]),
             helper.make_node("Concat", ["zeros", "x"], ["y"], axis=0)]
    m = model(nodes, [tensor("x", F32, (300,))], [tensor("y", F32, None)],
              [init("one", np.array([1], np.int64)), init("cap", np.array([100], np.int64))],
              opset=13)
    with pytest.raises(FrontendError, match=r"the data-dependent size NonZero_nz decides "
                                            r"\$\.attrs\.shape.* \(checked at NonZero_nz = 1009\)"):
        from_onnx(m)


def test_data_dependent_size_with_a_run_time_shape_input_is_refused_at_import() -> None:
    """A NonZero and a Reshape whose target is a graph input: neither the segments (the target
    is read while lowering) nor the deferred region (per input value, not per data) can run
    it; the import says so rather than failing at the first run."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("NonZero", ["r"], ["y"])]
    m = model(nodes, [tensor("x", F32, (2, 6)), tensor("shape", I64, (2,))],
              [tensor("y", I64, None)], opset=13)
    with pytest.raises(FrontendError, match=r"Reshape: input 1 \(shape\) must be a constant"):
        from_onnx(m)
