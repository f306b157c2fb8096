"""Detection heads: an onnx.helper-built head (TopK, Gather, NonMaxSuppression, RoiAlign) against
ONNX Runtime, with as many selected boxes as the data gives, and RoiAlign against ONNX's float64
reference."""
from __future__ import annotations

import numpy as np
import pytest
from onnx_builders import init, model, run_ort, run_ours, tensor

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper

import graph_runtime as gr
from graph_runtime.errors import GraphRuntimeError
from graph_runtime.frontend import from_onnx

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _head(selected_shape):
    nodes = [
        helper.make_node("TopK", ["scores_flat", "k"], ["top_scores", "top_idx"], axis=-1),
        helper.make_node("Gather", ["boxes", "top_idx"], ["top_boxes"], axis=1),
        helper.make_node("Unsqueeze", ["top_scores", "axes01"], ["nms_scores"]),
        helper.make_node("NonMaxSuppression", ["top_boxes", "nms_scores", "max_out", "iou",
                                               "score_thr"], ["selected"]),
        helper.make_node("Gather", ["selected", "col2"], ["box_idx"], axis=1),
        helper.make_node("Gather", ["selected", "col0"], ["batch_idx"], axis=1),
        helper.make_node("Squeeze", ["top_boxes", "axes0"], ["boxes2d"]),
        helper.make_node("Gather", ["boxes2d", "box_idx"], ["rois"], axis=0),
        helper.make_node("RoiAlign", ["features", "rois", "batch_idx"], ["pooled"],
                         output_height=3, output_width=3, sampling_ratio=2,
                         spatial_scale=0.5),
    ]
    inits = [init("k", np.array([10], np.int64)), init("axes01", np.array([0, 1], np.int64)),
             init("axes0", np.array([0], np.int64)), init("max_out", np.array([3], np.int64)),
             init("iou", np.array([0.5], np.float32)),
             init("score_thr", np.array([0.0], np.float32)),
             init("col2", np.array(2, np.int64)), init("col0", np.array(0, np.int64))]
    return model(nodes, [tensor("boxes", F32, (1, 20, 4)), tensor("scores_flat", F32, (20,)),
                         tensor("features", F32, (1, 4, 16, 16))],
                 [tensor("selected", I64, selected_shape), tensor("pooled", F32, None)],
                 inits, opset=16)


def _inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # Boxes on a grid never overlap: NMS keeps max_out of them, as the stated shape says.
    corners = np.array([[r * 8, c * 6] for r in range(4) for c in range(5)], np.float32)
    sizes = rng.uniform(2, 5, (20, 2)).astype(np.float32)
    boxes = np.concatenate([corners, corners + sizes], axis=1)[None]
    return {"boxes": boxes[:, :, [1, 0, 3, 2]].copy(),  # (y1, x1, y2, x2)
            "scores_flat": rng.uniform(0.1, 1.0, 20).astype(np.float32),
            "features": rng.standard_normal((1, 4, 16, 16)).astype(np.float32)}


def test_detection_head_matches_onnxruntime() -> None:
    m = _head([3, 3])
    feeds = _inputs()
    got = run_ours(m, feeds, "cpu")
    want = run_ort(m, feeds)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-6)


def _crowded(seed: int) -> dict[str, np.ndarray]:
    """Boxes that overlap: how many NMS keeps depends on the data (0 to max_out)."""
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 20, (20, 2)).astype(np.float32)
    size = rng.uniform(2, 9, (20, 2)).astype(np.float32)
    return {"boxes": np.concatenate([corner, corner + size], axis=1)[None],
            "scores_flat": rng.uniform(0.1, 1.0, 20).astype(np.float32),
            "features": rng.standard_normal((1, 4, 16, 16)).astype(np.float32)}


@pytest.mark.parametrize("stated", [None, [3, 3]])
def test_head_with_a_data_dependent_count_matches_onnxruntime(stated) -> None:
    """The count of selected boxes is whatever the data gives (a stated shape is not trusted,
    as in ONNX Runtime): the graph is cut after NonMaxSuppression and RoiAlign's segment is
    specialised per count; one module serves every count."""
    m = _head(stated)
    graph_json, lib, params = from_onnx(m)
    module = gr.create(graph_json, lib, gr.cpu())
    module.load_params(gr.save_param_dict(params))
    counts = set()
    for seed in range(6):
        feeds = _crowded(seed)
        if seed == 5:
            feeds["boxes"][:] = feeds["boxes"][:, :1]  # every box the same: NMS keeps one
        module.run(**feeds)
        got = [module.get_output(i).numpy() for i in range(2)]
        want = run_ort(m, feeds)
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1].shape == want[1].shape
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-6)
        counts.add(len(want[0]))
    assert len(counts) > 1, counts  # the data really changed the size


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
def test_roi_align_against_onnx_reference(mode: str, ctm: str) -> None:
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float64)
    rois = np.array([[0, 0, 9, 9], [1.5, 2.5, 8, 6], [-2, -1, 14, 12], [3, 3, 3.2, 3.1]],
                    np.float64)
    index = np.array([0, 1, 1, 0], np.int64)
    node = helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], mode=mode,
                            coordinate_transformation_mode=ctm, output_height=4,
                            output_width=3, sampling_ratio=0, spatial_scale=0.8)
    m = model([node], [tensor("x", TensorProto.DOUBLE, x.shape),
                       tensor("rois", TensorProto.DOUBLE, rois.shape),
                       tensor("idx", I64, index.shape)],
              [tensor("y", TensorProto.DOUBLE, None)], opset=16)
    feeds = {"x": x, "rois": rois, "idx": index}
    (want,) = ReferenceEvaluator(m).run(None, feeds)
    (got,) = run_ours(m, feeds, "cpu")
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", [2, -1])
def test_roi_align_batch_index_out_of_range_is_refused_at_run(bad: int) -> None:
    x = np.zeros((2, 1, 4, 4), np.float32)
    rois = np.array([[0, 0, 2, 2], [1, 1, 3, 3], [0, 0, 1, 1]], np.float32)
    node = helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], output_height=2,
                            output_width=2)
    m = model([node], [tensor("x", F32, x.shape), tensor("rois", F32, rois.shape),
                       tensor("idx", I64, (3,))], [tensor("y", F32, None)], opset=16)
    with pytest.raises(GraphRuntimeError, match=rf"node \d+ '\w+roi_align' .*: row 1 of "
                                                rf"batch_indices is {bad}, but X has batch size "
                                                r"2; expected indices in \[0, 2\)"):
        run_ours(m, {"x": x, "rois": rois, "idx": np.array([1, bad, 0], np.int64)}, "cpu")


def test_nms_over_a_symbolic_box_count_imports_once() -> None:
    """Boxes (1, n, 4) and scores (1, 1, n) with n named, NMS keeping what the data gives:
    imported once, it matches ONNX Runtime for 5, 30 and 200 boxes (issue 32)."""
    from graph_runtime.frontend.importer import import_onnx
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou",
                                                    "score_thr"], ["selected"]),
             helper.make_node("Gather", ["selected", "col2"], ["idx"], axis=1),
             helper.make_node("Squeeze", ["scores", "axes01"], ["flat"]),
             helper.make_node("Gather", ["flat", "idx"], ["kept"], axis=0)]
    inits = [init("max_out", np.array([10], np.int64)), init("iou", np.array([0.5], np.float32)),
             init("score_thr", np.array([0.1], np.float32)),
             init("col2", np.array(2, np.int64)), init("axes01", np.array([0, 1], np.int64))]
    graph = helper.make_graph(
        nodes, "nms", [helper.make_tensor_value_info("boxes", F32, [1, "n", 4]),
                       helper.make_tensor_value_info("scores", F32, [1, 1, "n"])],
        [helper.make_tensor_value_info("kept", F32, ["k"])], inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    result = import_onnx(onnx_model)
    module = gr.create(result.graph_json, result.module())
    module.load_params(result.params)
    rng = np.random.default_rng(0)
    for n in (5, 30, 200):
        corner = rng.uniform(0, 100, (1, n, 2)).astype(np.float32)
        boxes = np.concatenate([corner, corner + rng.uniform(5, 20, (1, n, 2))], -1)
        feeds = {"boxes": boxes.astype(np.float32),
                 "scores": rng.uniform(0, 1, (1, 1, n)).astype(np.float32)}
        module.run(**feeds)
        np.testing.assert_array_equal(module.get_output(0).numpy(),
                                      run_ort(onnx_model, feeds)[0])
