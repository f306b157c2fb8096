"""Converters for detection heads: NonMaxSuppression and RoiAlign."""
from __future__ import annotations

import numpy as np

from .convert import Context, converts
from .convert_data_dependent import nms_computed
from .ir import Unsupported, Value
from .onnx_node import OnnxNode


def _scalar_input(ctx: Context, args: list, i: int, dtype: str, default: float) -> Value:
    """Input i as a (1,) tensor of dtype; the default when it is omitted."""
    value = args[i] if i < len(args) else None
    if value is None:
        return ctx.b.const(np.array([default], dtype), "default")
    if value.shape not in ((), (1,)):
        raise Unsupported(f"input {i} has shape {value.shape}; expected one value")
    return ctx.b.reshape(ctx.b.cast(value, dtype), (1,))


@converts("NonMaxSuppression")
def non_max_suppression(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    boxes, scores = args[0], args[1]
    if boxes.dtype != "float32" or scores.dtype != "float32":
        raise Unsupported(f"boxes {boxes.dtype}, scores {scores.dtype}; expected float32")
    inputs = [boxes, scores, _scalar_input(ctx, args, 2, "int64", 0),
              _scalar_input(ctx, args, 3, "float32", 0.0),
              _scalar_input(ctx, args, 4, "float32", 0.0)]
    # The count of selected boxes depends on the data (a shape the model states holds for one
    # input only, as ONNX Runtime reads it): the graph is cut after this node.
    return nms_computed(ctx, node, args, inputs)


@converts("RoiAlign")
def roi_align(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x, rois, index = args[0], args[1], args[2]
    mode = str(node.attr("coordinate_transformation_mode",
                         "half_pixel" if node.opset >= 16 else "output_half_pixel"))
    if mode not in ("half_pixel", "output_half_pixel"):
        raise Unsupported(f"coordinate_transformation_mode {mode!r}")
    return [b.op("roi_align", x, b.cast(rois, x.dtype), b.cast(index, "int64"),
                 mode=str(node.attr("mode", "avg")),
                 output_height=int(node.attr("output_height", 1)),
                 output_width=int(node.attr("output_width", 1)),
                 sampling_ratio=int(node.attr("sampling_ratio", 0)),
                 spatial_scale=float(node.attr("spatial_scale", 1.0)),
                 half_pixel=int(mode == "half_pixel"))]
