"""Converters for shape ops: Shape, Size, Reshape, Flatten, Transpose, (Un)Squeeze, Concat,
Split, Expand, Tile, EyeLike, Trilu, DepthToSpace/SpaceToDepth."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .convert import (Context, add_facts, const_input, converts, ints_of, norm_axis,
                      required_ints)
from .fold import fold_concat, fold_expand, fold_shape, fold_tile
from .fold_sym import normal
from .symdim import decided_unequal, floordiv, index_of_same_size, is_int, same_shape
from .fold_size import broadcast, size_constant_of_shape, size_expand, size_range, size_tile
from .ir import NeedsValue, Unsupported, Value, check_const_bytes, check_entry, check_rank
from .onnx_node import OnnxNode


@converts("Shape", fold=fold_shape)
def shape(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    dims = normal(np.array(args[0].shape, dtype=object))
    start = int(node.attr("start", 0))
    end = node.attr("end")
    return [ctx.b.const(dims[start:None if end is None else int(end)], "shape")]


@converts("Size")
def size(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.const(normal(np.array(math.prod(args[0].shape), dtype=object)), "size")]


@converts("Reshape", shape_inputs=(1,))
def reshape(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    if node.opset < 5:
        target = node.ints("shape")
    else:
        if len(args) > 1 and args[1] is not None and args[1].rank != 1:
            raise Unsupported(f"input 1 (shape) of shape {list(args[1].shape)}: expected 1-D")
        target = required_ints(node, args, 1, "shape")
    allowzero = int(node.attr("allowzero", 0))
    out = []
    # NOTE: a symbolic item is a size (a dim that is 0 at run time copies the input's dim in
    # ONNX and in the lib's reshape alike); only literal 0 and -1 are codes here.
    for i, d in enumerate(target or []):
        copies = is_int(d, 0) and not allowzero
        if (isinstance(d, int) and d < -1) or (copies and i >= x.rank):
            raise Unsupported(f"shape {target}: item {i} is {d}; expected a size, -1, or 0 "
                              f"for a dim the input {list(x.shape)} has")
        out.append(x.shape[i] if copies else d)
    infer = [i for i, d in enumerate(out) if is_int(d, -1)]
    if len(infer) > 1:
        raise Unsupported(f"shape {target} has more than one -1")
    if infer:
        known = math.prod(d for i, d in enumerate(out) if i != infer[0])
        if is_int(known, 0):
            raise Unsupported(f"shape {target} with -1 and a zero dim")
        out[infer[0]] = floordiv(*_unmatched(list(x.shape),
                                             [d for i, d in enumerate(out) if i != infer[0]]))
    if decided_unequal(math.prod(out), math.prod(x.shape)):
        raise Unsupported(f"cannot reshape {x.shape} to {target}")
    return [x if same_shape(out, x.shape) else ctx.b.reshape(x, out)]


def _unmatched(dims: list[Any], known: list[Any]) -> tuple[Any, Any]:
    """The products of the input's dims and of the target's known dims left after each known
    dim cancels an input dim of the same size (symdim.same_size): a -1 is their quotient
    (wav2vec2's dynamo export reshapes (batch, frames, 256) to (batch, its own count of the
    frames, -1): 256, where the products' quotient stays a fraction of two formulas)."""
    rest = list(known)
    left = []
    for d in dims:
        k = index_of_same_size(d, rest)
        if k is None:
            left.append(d)
        else:
            del rest[k]
    return math.prod(left), math.prod(rest)


@converts("Flatten")
def flatten(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    axis = int(node.attr("axis", 1))
    axis = axis + x.rank if axis < 0 else axis
    if not 0 <= axis <= x.rank:
        raise Unsupported(f"axis {node.attr('axis')} for rank {x.rank}")
    out = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return [x if same_shape(out, x.shape) else ctx.b.reshape(x, out)]


@converts("Transpose")
def transpose(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    perm = node.ints("perm", list(range(x.rank))[::-1])
    if perm == list(range(x.rank)):
        return [x]
    return [ctx.b.transpose(x, perm)]


def _axes(ctx: Context, node: OnnxNode, args: list, index: int) -> list[int] | None:
    if node.opset >= 13:
        return ints_of(const_input(node, args, index, "axes"))
    return node.opt_ints("axes")


@converts("Squeeze", shape_inputs=(1,))
def squeeze(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    axes = _axes(ctx, node, args, 1)
    if axes is None:
        picked = {i for i, d in enumerate(x.shape) if d == 1}
    else:
        picked = {norm_axis(a, x.rank, node, "axes") for a in axes}
        for a in picked:
            if x.shape[a] != 1:
                raise Unsupported(f"axis {a} has size {x.shape[a]}, not 1")
    out = tuple(d for i, d in enumerate(x.shape) if i not in picked)
    return [x if same_shape(out, x.shape) else ctx.b.reshape(x, out)]


@converts("Unsqueeze", shape_inputs=(1,))
def unsqueeze(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    axes = _axes(ctx, node, args, 1) or []
    rank = x.rank + len(axes)
    picked = sorted(norm_axis(a, rank, node, "axes") for a in axes)
    out = list(x.shape)
    for a in picked:
        out.insert(a, 1)
    return [ctx.b.reshape(x, out)]


@converts("Concat", fold=fold_concat)
def concat(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    values = [a for a in args if a is not None]
    first = values[0]
    if first.rank == 0:
        raise Unsupported("input 0 is 0-d; expected a tensor with the axis to concatenate on")
    axis = norm_axis(int(node.attr("axis", 1)), first.rank, node)  # Concat-1 defaults to 1
    for k, v in enumerate(args):
        if v is not None and (v.rank != first.rank or any(
                a != b for i, (a, b) in enumerate(zip(v.shape, first.shape)) if i != axis)):
            raise Unsupported(f"input {k} of shape {list(v.shape)}: expected the shape of "
                              f"input 0 {list(first.shape)} but for axis {axis}")
    nonempty = [v for v in values if not is_int(v.shape[axis], 0)]
    if not nonempty:
        shape = list(values[0].shape)
        shape[axis] = 0
        return [ctx.b.const(np.zeros(shape, values[0].dtype), "empty")]
    if len(nonempty) == 1:
        return [nonempty[0]]
    return [ctx.b.op("concatenate", *nonempty, axis=axis)]


@converts("Split", shape_inputs=(1,))
def split(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    if x.rank == 0:
        raise Unsupported("input 0 is 0-d; expected a tensor with the axis to split")
    axis = norm_axis(int(node.attr("axis", 0)), x.rank, node)
    dim = x.shape[axis]
    count = len(node.outputs)
    if node.opset >= 13:
        sizes = ints_of(const_input(node, args, 1, "split"))
    else:
        sizes = node.opt_ints("split")
    if sizes is None:
        parts = int(node.attr("num_outputs", count))
        if parts != count:
            raise Unsupported(f"num_outputs {parts}; expected {count}, the node's outputs")
        step = -(-dim // parts)
        sizes = [min(step, dim - i * step) for i in range(parts)]
    if sum(sizes) != dim or len(sizes) != count:
        raise Unsupported(f"split sizes {sizes} for axis {axis} of size {dim} and {count} "
                          "outputs")
    if count == 1:
        return [x]
    indices = list(np.cumsum(sizes)[:-1])
    return ctx.b.ops("split", [x], indices_or_sections=indices, axis=axis)


def _broadcast(ctx: Context, x: Value, shape: Sequence[int]) -> Value:
    if same_shape(shape, x.shape):
        return x
    return ctx.b.op("broadcast_to", x, shape=list(shape))


@converts("Expand", shape_inputs=(1,), fold=fold_expand, predict=size_expand)
def expand(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    target = required_ints(node, args, 1, "shape")
    check_rank(target, "input 1 (shape)")
    out = broadcast([x.shape, tuple(target)], "input 0 and input 1 (shape)")
    return [_broadcast(ctx, x, out)]


@converts("Tile", shape_inputs=(1,), fold=fold_tile, predict=size_tile)
def tile(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    reps = required_ints(node, args, 1, "repeats")
    if len(reps) != x.rank:
        raise Unsupported(f"repeats {reps} for rank {x.rank}")
    check_entry([d * r for d, r in zip(x.shape, reps)], x.dtype, "its output")
    return [b.op("tile", x, reps=reps)]


@converts("EyeLike")
def eye_like(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    from .onnx_model import np_dtype
    x = args[0]
    if x.rank != 2:
        raise Unsupported(f"input of rank {x.rank}")
    dtype = np_dtype(int(node.attr("dtype"))) if node.attr("dtype") is not None else x.dtype
    check_const_bytes(x.shape, dtype, "EyeLike")
    eye = np.eye(x.shape[0], x.shape[1], k=int(node.attr("k", 0)), dtype=dtype)
    return [ctx.b.const(eye, "eye")]


@converts("ConstantOfShape", "Range")
def needs_constants(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    if all(a is None or a.const is not None for a in args):
        # Known at import but holding symbolic dims (folding refused them): computed by ops.
        from .convert_dims import convert_unfolded
        return [v for v in convert_unfolded(ctx, node, args) if v is not None]
    raise NeedsValue("its inputs are computed at run time (a dynamic shape); only constant "
                      "inputs are supported")


add_facts("ConstantOfShape", shape_inputs=(0,), predict=size_constant_of_shape)
add_facts("Range", shape_inputs=(0, 1, 2), predict=size_range)


@converts("Trilu", shape_inputs=(1,))
def trilu(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    k = ints_of(const_input(node, args, 1, "k"))
    k0 = 0 if k is None else k[0]
    if x.rank < 2:
        raise Unsupported(f"input of rank {x.rank}")
    rows, cols = x.shape[-2:]
    upper = int(node.attr("upper", 1))
    check_const_bytes((rows, cols), bool, "Trilu mask")
    keep = np.triu(np.ones((rows, cols), bool), k0) if upper else \
        np.tril(np.ones((rows, cols), bool), k0)
    zero = b.const(np.zeros((), x.dtype), "zero")
    return [b.op("where", b.const(keep, "mask"), x, zero)]


@converts("DepthToSpace", "SpaceToDepth")
def depth_space(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    if x.rank != 4:
        raise Unsupported(f"input of rank {x.rank}")
    bs = int(node.attr("blocksize"))
    if bs < 1:
        raise Unsupported(f"blocksize {bs}; expected at least 1")
    n, c, h, w = x.shape
    if node.op_type == "SpaceToDepth":
        y = b.reshape(x, (n, c, h // bs, bs, w // bs, bs))
        crd = node.attr("mode", "DCR") == "CRD"
        y = b.transpose(y, [0, 1, 3, 5, 2, 4] if crd else [0, 3, 5, 1, 2, 4])
        return [b.reshape(y, (n, c * bs * bs, h // bs, w // bs))]
    mode = node.attr("mode", "DCR")
    if mode == "DCR":
        y = b.transpose(b.reshape(x, (n, bs, bs, c // (bs * bs), h, w)), [0, 3, 4, 1, 5, 2])
    else:
        y = b.transpose(b.reshape(x, (n, c // (bs * bs), bs, bs, h, w)), [0, 1, 4, 2, 5, 3])
    return [b.reshape(y, (n, c // (bs * bs), h * bs, w * bs))]
