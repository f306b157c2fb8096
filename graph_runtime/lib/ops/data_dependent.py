"""Ops whose output size depends on the data: nonzero, unique, compress, topk_dynamic (k read at
run time), non_max_suppression_dynamic.

Each op's attr `count` is the data-dependent size (an int, or a symbolic dim `{"dim": name}`
that a segmented run binds: runtime/segments.py). A graph holding such a node runs in segments
cut at it: the op's host function (registry OpDef.host) computes the node on the host (NumPy) from its inputs, the sizes it
produced bind the following segment. The destination-passing CPU kernel is for a graph that
states the count statically: it computes the same result and refuses a different count.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..attrs import bool_attr, int_attr, normalize_axis, op_error
from ..library import TensorSpec
from ..registry import HostFn, define_op, kernel
from ..shapes import NUMERIC_DTYPES, check_dtype, check_rank
from .detection import select_boxes



def _count(op: str, attrs: Mapping[str, Any]) -> int:
    count = int_attr(op, attrs, "count")
    if count < 0:
        raise op_error(op, f"count {count}; expected >= 0")
    return int(count)


# -- nonzero: ONNX NonZero ------------------------------------------------------------------------

def _nonzero_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    if len(inputs) != 1:
        raise op_error("nonzero", f"takes 1 input, got {len(inputs)}")
    return [TensorSpec((max(len(inputs[0].shape), 1), _count("nonzero", attrs)), "int64")]


def _nonzero(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    # NOTE: ONNX treats a scalar as a 1-element vector (one row of indices).
    return [np.array(np.nonzero(x.reshape(-1) if x.ndim == 0 else x), dtype=np.int64)]


# -- compress: ONNX Compress with a condition computed at run time --------------------------------

def _compress_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    op = "compress"
    if len(inputs) != 2:
        raise op_error(op, f"takes 2 inputs (data, condition), got {len(inputs)}")
    x, condition = inputs
    check_dtype(op, condition, ("bool",), "input 1 (condition)")
    check_rank(op, condition, (1,), "input 1 (condition)")
    count = _count(op, attrs)
    axis = int_attr(op, attrs, "axis", -1)
    if not bool_attr(op, attrs, "has_axis", False):
        return [TensorSpec((count,), x.dtype)]
    if not 0 <= axis < len(x.shape):
        raise op_error(op, f"axis {axis} for data {x}; expected 0 <= axis < {len(x.shape)}")
    return [TensorSpec(tuple(x.shape[:axis]) + (count,) + tuple(x.shape[axis + 1:]), x.dtype)]


def _compress(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    x, condition = np.asarray(arrays[0]), np.asarray(arrays[1]).astype(bool).reshape(-1)
    has_axis = bool_attr("compress", attrs, "has_axis", False)
    axis = int_attr("compress", attrs, "axis", -1) if has_axis else 0
    data = x if has_axis else x.reshape(-1)
    size = data.shape[axis]
    if condition[size:].any():
        raise op_error("compress", f"condition selects index {int(np.flatnonzero(condition)[-1])}"
                                   f" of an axis of size {size}")
    return [np.compress(condition[:size], data, axis=axis)]


# -- unique: ONNX Unique (sorted or in order of first occurrence) ---------------------------------

def _unique_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    op = "unique"
    if len(inputs) != 1:
        raise op_error(op, f"takes 1 input, got {len(inputs)}")
    x = inputs[0]
    count = _count(op, attrs)
    if bool_attr(op, attrs, "has_axis", False):
        axis = int_attr(op, attrs, "axis")
        if not 0 <= axis < len(x.shape):
            raise op_error(op, f"axis {axis} for {x}; expected 0 <= axis < {len(x.shape)}")
        y = tuple(x.shape[:axis]) + (count,) + tuple(x.shape[axis + 1:])
        length = x.shape[axis]
    else:
        y = (count,)
        length = int(np.prod(x.shape, dtype=np.int64))
    return [TensorSpec(y, x.dtype), TensorSpec((count,), "int64"),
            TensorSpec((length,), "int64"), TensorSpec((count,), "int64")]


def _unique(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    x = np.asarray(arrays[0])
    has_axis = bool_attr("unique", attrs, "has_axis", False)
    axis = int_attr("unique", attrs, "axis", 0) if has_axis else 0
    data = x if has_axis else x.reshape(-1)
    # Rows along axis as one key each: np.unique's sort, then first occurrences for the order.
    moved = np.moveaxis(data, axis, 0)
    rows = moved.reshape(moved.shape[0], int(np.prod(moved.shape[1:], dtype=np.int64)))
    _, first, inverse, counts = np.unique(rows, axis=0, return_index=True,
                                          return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    if not bool_attr("unique", attrs, "sorted", True):
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
    y = np.take(data, first, axis=axis)
    return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]


# -- non_max_suppression_dynamic: ONNX NonMaxSuppression, every selected box ----------------------

NMS_ATTRS = ("center_point_box", "use_score_threshold", "count")


def _nms_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    from .detection import _nms_infer as static_infer
    static = {"capacity": _count("non_max_suppression_dynamic", attrs),
              "center_point_box": attrs.get("center_point_box", 0),
              "use_score_threshold": attrs.get("use_score_threshold", 1)}
    return static_infer(inputs, static)[:1]


def _nms(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    op = "non_max_suppression_dynamic"
    boxes, scores, max_out, iou, score = (np.asarray(a) for a in arrays)
    thresholded = bool_attr(op, attrs, "use_score_threshold", True)
    picked = select_boxes(boxes, scores, max(int(max_out.reshape(-1)[0]), 0),
                          float(iou.reshape(-1)[0]),
                          float(score.reshape(-1)[0]) if thresholded else None,
                          int_attr(op, attrs, "center_point_box", 0) == 1)
    return [np.asarray(picked, np.int64).reshape(len(picked), 3)]


# -- topk_dynamic: ONNX TopK with k computed at run time -------------------------------------------

def _topk_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    op = "topk_dynamic"
    if len(inputs) != 2:
        raise op_error(op, f"takes 2 inputs (data, k), got {len(inputs)}")
    x, k = inputs
    if tuple(k.shape) not in ((), (1,)) or k.dtype != "int64":
        raise op_error(op, f"input 1 (k) is {k}; expected (1,) int64")
    check_dtype(op, x, NUMERIC_DTYPES)
    axis = normalize_axis(op, int_attr(op, attrs, "axis", -1), len(x.shape))
    bool_attr(op, attrs, "largest", True)
    bool_attr(op, attrs, "sorted", True)
    # NOTE: count is not checked against the axis: the import plans probe sizes past it, and
    # the host function refuses a k the data's axis cannot give.
    shape = tuple(_count(op, attrs) if i == axis else d for i, d in enumerate(x.shape))
    return [TensorSpec(shape, x.dtype), TensorSpec(shape, "int64")]


def _topk(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    from ...backends import get_backend
    from .sorting import _host_topk, topk_params
    x = np.asarray(arrays[0])
    k = int(np.asarray(arrays[1]).reshape(-1)[0])
    spec = TensorSpec(tuple(x.shape), str(x.dtype))
    static = {"k": k, "axis": int_attr("topk_dynamic", attrs, "axis", -1),
              "largest": int_attr("topk_dynamic", attrs, "largest", 1)}
    _, axis, _ = topk_params(spec, static)  # refuses k outside 0..length of the axis
    shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
    values, indices = np.empty(shape, x.dtype), np.empty(shape, np.int64)
    _host_topk(np, get_backend("cpu"), 0, [spec], [], static)(x, values, indices)
    return [values, indices]


def destination_kernel(op: str, host: HostFn) -> Any:
    """The CPU kernel for a graph that states the count: host's result, checked against it."""
    def factory(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        n_in = len(inputs)

        def run(*arrays: Any) -> None:
            results = host(arrays[:n_in], attrs)
            for k, (got, out) in enumerate(zip(results, arrays[n_in:])):
                if got.shape != out.shape:
                    raise op_error(op, f"output {k} is {got.shape} for this data; the graph was "
                                       f"planned for {out.shape} (a data-dependent size: "
                                       "leave it symbolic and the graph runs in segments)")
                out[...] = got
        return run
    return factory


for _name, _infer, _n, _attrs, _host in (
        ("nonzero", _nonzero_infer, 1, ("count",), _nonzero),
        ("compress", _compress_infer, 2, ("count", "axis", "has_axis"), _compress),
        ("unique", _unique_infer, 1, ("count", "axis", "has_axis", "sorted"), _unique),
        ("topk_dynamic", _topk_infer, 2, ("count", "axis", "largest", "sorted"), _topk),
        ("non_max_suppression_dynamic", _nms_infer, 5, NMS_ATTRS, _nms)):
    define_op(_name, _infer, _n, _attrs, host=_host)
    kernel(_name, "cpu")(destination_kernel(_name, _host))
