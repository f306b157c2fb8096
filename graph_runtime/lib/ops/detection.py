"""Detection heads: non_max_suppression (ONNX NonMaxSuppression) and roi_align (ONNX RoiAlign)."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..attrs import bool_attr, float_attr, int_attr, op_error, str_attr
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import FLOAT_DTYPES, check_dtype, check_rank

NMS_ATTRS = ("center_point_box", "capacity", "exact", "use_score_threshold")
ROI_ATTRS = ("mode", "output_height", "output_width", "sampling_ratio", "spatial_scale",
             "half_pixel")


# -- non_max_suppression --------------------------------------------------------------------------
# The number of selected boxes depends on the data. The op writes them into a static output of
# `capacity` rows and the count into its second output: with exact=1 a count other than
# capacity is an error at run time (the graph was planned for that many rows); with exact=0 the
# rows past the count hold -1 (for the data-dependent output-shape machinery to cut).

def _nms_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    op = "non_max_suppression"
    if len(inputs) != 5:
        raise op_error(op, f"takes 5 inputs (boxes, scores, max_output_boxes_per_class, "
                           f"iou_threshold, score_threshold), got {len(inputs)}")
    boxes, scores, max_out, iou, score = inputs
    check_dtype(op, boxes, ("float32",))
    check_rank(op, boxes, (3,))
    if tuple(scores.shape[::2]) != tuple(boxes.shape[:2]) or len(scores.shape) != 3 \
            or boxes.shape[2] != 4 or scores.dtype != "float32":
        raise op_error(op, f"boxes {boxes} and scores {scores}: expected (B, N, 4) and "
                           "(B, C, N) float32")
    for i, spec, dtype in ((2, max_out, "int64"), (3, iou, "float32"), (4, score, "float32")):
        if tuple(spec.shape) != (1,) or spec.dtype != dtype:
            raise op_error(op, f"input {i} is {spec}; expected (1,) {dtype}")
    capacity = int_attr(op, attrs, "capacity")
    if capacity < 0:
        raise op_error(op, f"capacity {capacity}; expected >= 0")
    int_attr(op, attrs, "center_point_box", 0)
    bool_attr(op, attrs, "exact", True)
    bool_attr(op, attrs, "use_score_threshold", True)
    return [TensorSpec((capacity, 3), "int64"), TensorSpec((), "int64")]


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """(..., 4) boxes as (y_min, x_min, y_max, x_max) in float64."""
    b = boxes.astype(np.float64)
    if center:
        x, y, w, h = (b[..., k] for k in range(4))
        return np.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], axis=-1)
    return np.stack([np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
                     np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3])], axis=-1)


def select_boxes(boxes: np.ndarray, scores: np.ndarray, max_out: int, iou: float,
                 score: float | None, center: bool) -> list[tuple[int, int, int]]:
    """ONNX's greedy selection: per batch and class, highest score first (lower index on ties),
    dropping a box whose IoU with a kept one is above iou; scores at or below score dropped."""
    picked: list[tuple[int, int, int]] = []
    corners = _corners(boxes, center)
    for bi in range(scores.shape[0]):
        c = corners[bi]
        area = (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1])
        for ci in range(scores.shape[1]):
            s = scores[bi, ci]
            order = np.lexsort((np.arange(len(s)), -s.astype(np.float64)))
            if score is not None:
                order = order[s[order] > score]
            kept: list[int] = []
            for k in order:
                if len(kept) >= max_out:
                    break
                if kept:
                    other = c[kept]
                    h = np.minimum(c[k, 2], other[:, 2]) - np.maximum(c[k, 0], other[:, 0])
                    w = np.minimum(c[k, 3], other[:, 3]) - np.maximum(c[k, 1], other[:, 1])
                    inter = np.where((h > 0) & (w > 0), h * w, 0.0)
                    union = area[k] + area[kept] - inter
                    valid = (inter > 0) & (area[k] > 0) & (area[kept] > 0) & (union > 0)
                    ratio = np.divide(inter, union, out=np.zeros_like(inter), where=valid)
                    if (valid & (ratio > iou)).any():
                        continue
                kept.append(int(k))
                picked.append((bi, ci, int(k)))
    return picked


def _cpu_nms(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    op = "non_max_suppression"
    center = int_attr(op, attrs, "center_point_box", 0) == 1
    capacity = int_attr(op, attrs, "capacity")
    exact = bool_attr(op, attrs, "exact", True)
    thresholded = bool_attr(op, attrs, "use_score_threshold", True)

    def run(boxes: Any, scores: Any, max_out: Any, iou: Any, score: Any, selected: Any,
            count: Any) -> None:
        picked = select_boxes(boxes, scores, max(int(max_out[0]), 0), float(iou[0]),
                              float(score[0]) if thresholded else None, center)
        if len(picked) > capacity or (exact and len(picked) != capacity):
            raise op_error(op, f"selected {len(picked)} boxes; the graph was planned for "
                               f"{'exactly' if exact else 'at most'} {capacity} (the output's "
                               "static shape)")
        selected[...] = -1
        if picked:
            selected[:len(picked)] = np.asarray(picked, np.int64)
        count[...] = len(picked)
    return run


define_op("non_max_suppression", _nms_infer, 5, NMS_ATTRS)
kernel("non_max_suppression", "cpu")(_cpu_nms)


# -- roi_align ------------------------------------------------------------------------------------

def _roi_params(attrs: Mapping[str, Any]) -> tuple[str, int, int, int, float, bool]:
    op = "roi_align"
    return (str_attr(op, attrs, "mode", "avg", choices=("avg", "max")),
            int_attr(op, attrs, "output_height", 1), int_attr(op, attrs, "output_width", 1),
            int_attr(op, attrs, "sampling_ratio", 0), float_attr(op, attrs, "spatial_scale", 1.0),
            bool_attr(op, attrs, "half_pixel", True))


def _roi_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    op = "roi_align"
    if len(inputs) != 3:
        raise op_error(op, f"takes 3 inputs (X, rois, batch_indices), got {len(inputs)}")
    x, rois, index = inputs
    check_dtype(op, x, FLOAT_DTYPES)
    check_rank(op, x, (4,))
    if len(rois.shape) != 2 or rois.shape[1] != 4 or rois.dtype != x.dtype:
        raise op_error(op, f"input 1 (rois) is {rois}; expected (R, 4) {x.dtype}")
    if tuple(index.shape) != (rois.shape[0],) or index.dtype != "int64":
        raise op_error(op, f"input 2 (batch_indices) is {index}; expected ({rois.shape[0]},) "
                           "int64")
    _, height, width, sampling, _, _ = _roi_params(attrs)
    if height < 1 or width < 1 or sampling < 0:
        raise op_error(op, f"output {height}x{width}, sampling_ratio {sampling}: expected "
                           "sizes >= 1 and a ratio >= 0")
    return [TensorSpec((rois.shape[0], x.shape[1], height, width), x.dtype)]


def _axis_samples(start: float, size: float, bins: int, grid: int, extent: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per bin and sample along one axis: low index, high index, low and high weights, and
    whether the sample lies within [-1, extent] (ONNX RoiAlign's bilinear sampling)."""
    bin_size = size / bins
    pos = start + np.arange(bins)[:, None] * bin_size \
        + (np.arange(grid)[None, :] + 0.5) * bin_size / grid
    inside = (pos >= -1.0) & (pos <= extent)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    edge = low >= extent - 1
    low = np.where(edge, extent - 1, low)
    high = np.where(edge, extent - 1, low + 1)
    frac = np.where(edge, 0.0, pos - low)
    return low, high, 1.0 - frac, frac, inside


def _check_batch_indices(index: np.ndarray, batch: int) -> None:
    """The rows' batch indices lie in [0, batch): data decides them, so this runs each call."""
    bad = (index < 0) | (index >= batch)
    if bad.any():
        row = int(np.argmax(bad))
        raise op_error("roi_align", f"row {row} of batch_indices is {int(index[row])}, but X has "
                                    f"batch size {batch}; expected indices in [0, {batch})")


def _cpu_roi_align(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                   outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    mode, out_h, out_w, sampling, scale, half_pixel = _roi_params(attrs)
    height, width = inputs[0].shape[2:]

    def run(x: Any, rois: Any, index: Any, out: Any) -> None:
        _check_batch_indices(index, x.shape[0])
        shift = 0.5 if half_pixel else 0.0
        for n in range(rois.shape[0]):
            x0, y0, x1, y1 = (float(v) * scale - shift for v in rois[n])
            roi_w, roi_h = x1 - x0, y1 - y0
            if not half_pixel:
                roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
            grid_h = sampling if sampling > 0 else int(np.ceil(roi_h / out_h))
            grid_w = sampling if sampling > 0 else int(np.ceil(roi_w / out_w))
            yl, yh, wyl, wyh, iny = _axis_samples(y0, roi_h, out_h, grid_h, height)
            xl, xh, wxl, wxh, inx = _axis_samples(x0, roi_w, out_w, grid_w, width)
            image = x[int(index[n])].astype(np.float64)
            # (C, PH, IY, PW, IX) per corner: weight times value, zero outside the image.
            inside = iny[:, :, None, None] & inx[None, None, :, :]
            terms = []
            for yi, wy in ((yl, wyl), (yh, wyh)):
                for xi, wx in ((xl, wxl), (xh, wxh)):
                    w = np.where(inside, wy[:, :, None, None] * wx[None, None, :, :], 0.0)
                    v = image[:, yi[:, :, None, None], xi[None, None, :, :]]
                    terms.append(w * v)
            if mode == "avg":
                total = sum(terms[1:], terms[0]).sum(axis=(2, 4))
                out[n] = total / max(grid_h * grid_w, 1)
            else:
                # NOTE: ONNX (and ONNX Runtime) take the max of the weighted corner values.
                out[n] = np.max(np.stack(terms), axis=(0, 3, 5))
    return run


define_op("roi_align", _roi_infer, 3, ROI_ATTRS)
kernel("roi_align", "cpu")(_cpu_roi_align)
