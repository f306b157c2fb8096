"""Converters for GridSample, AffineGrid and Col2Im."""
from __future__ import annotations

import math

import numpy as np

from .convert import Context, converts, required_ints
from .fold_size import float64_copies, size_affine_grid
from .ir import Unsupported, Value, check_const_bytes
from .onnx_node import OnnxNode

_MODES = {"bilinear": "linear", "bicubic": "cubic"}


@converts("GridSample")
def grid_sample(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x, grid = args[0], args[1]
    mode = str(node.attr("mode", "linear" if node.opset >= 20 else "bilinear"))
    return [ctx.b.op("grid_sample", x, ctx.b.cast(grid, x.dtype), mode=_MODES.get(mode, mode),
                     padding_mode=str(node.attr("padding_mode", "zeros")),
                     align_corners=bool(int(node.attr("align_corners", 0))))]


def base_grid(sizes: list[int], align: bool) -> np.ndarray:
    """(prod(sizes), k + 1) homogeneous points, x (the last axis) first, as ONNX's AffineGrid."""
    check_const_bytes((math.prod(sizes), len(sizes) + 1), np.float64, "the grid's points")
    axes = []
    for size in sizes:
        if align:
            axes.append(np.linspace(-1.0, 1.0, size) if size > 1 else np.array([-1.0]))
        else:
            axes.append((np.arange(size) * 2.0 + 1) / size - 1)
    mesh = np.meshgrid(*axes, indexing="ij")
    points = [m.reshape(-1) for m in reversed(mesh)]
    return np.stack(points + [np.ones_like(points[0])], axis=1)


@converts("AffineGrid", predict=size_affine_grid, workspace=float64_copies(2))
def affine_grid(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    """theta (N, k, k + 1) times the fixed grid of points: one dense in float64."""
    b = ctx.b
    theta = args[0]
    size = required_ints(node, args, 1, "size")
    sizes = size[2:]
    k = len(sizes)
    if k not in (2, 3) or theta.shape != (size[0], k, k + 1):
        raise Unsupported(f"theta {theta.shape} for size {size}: expected (N, 2, 3) with a 4-D "
                          "size or (N, 3, 4) with a 5-D size")
    points = base_grid(sizes, bool(int(node.attr("align_corners", 0))))
    rows = b.reshape(b.cast(theta, "float64"), (size[0] * k, k + 1))
    mapped = b.op("dense", rows, b.const(points, "affine_grid_points"))
    grid = b.transpose(b.reshape(mapped, (size[0], k, points.shape[0])), [0, 2, 1])
    return [b.cast(b.reshape(grid, (size[0],) + tuple(sizes) + (k,)), theta.dtype)]


@converts("Col2Im")
def col2im(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    image = required_ints(node, args, 1, "image_shape")
    block = required_ints(node, args, 2, "block_shape")
    k = len(image)
    return [ctx.b.op("col2im", x, image_shape=image, block_shape=block,
                     dilations=[int(v) for v in node.attr("dilations", [1] * k)],
                     pads=[int(v) for v in node.attr("pads", [0] * (2 * k))],
                     strides=[int(v) for v in node.attr("strides", [1] * k)])]
