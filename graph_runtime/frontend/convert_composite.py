"""Converters that compose several standard ops: losses, RMS norm, Swish, Hardmax, OneHot."""
from __future__ import annotations

import math

import numpy as np

from .convert import Context, const_input, converts, norm_axis
from .fold_size import size_one_hot
from .ir import Unsupported, Value, check_const_bytes
from .onnx_node import OnnxNode


def _nll(ctx: Context, node: OnnxNode, logp: Value, target: Value, weight: Value | None) -> Value:
    """NegativeLogLikelihoodLoss on log-probabilities (N, C, d...) and int targets (N, d...)."""
    b = ctx.b
    reduction = node.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise Unsupported(f"reduction {reduction!r}")
    if logp.rank < 2 or tuple(target.shape) != (logp.shape[0],) + tuple(logp.shape[2:]):
        raise Unsupported(f"input {logp.shape} with target {target.shape}")
    t = b.cast(target, "int64")
    ignore = node.attr("ignore_index")
    ignored = None
    if ignore is not None:
        ignored = b.op("equal", t, b.const(np.array(int(ignore), np.int64), "ignore_index"))
        t = b.op("where", ignored, b.const(np.array(0, np.int64), "zero"), t)
    index = b.reshape(t, (t.shape[0], 1) + tuple(t.shape[1:]))
    picked = b.op("gather_elements", logp, index, axis=1)
    loss = b.op("negative", b.reshape(picked, t.shape))
    w = None
    if weight is not None:
        w = b.op("take", weight, t, axis=0, mode="clip")
    if ignored is not None:
        keep = b.op("where", ignored, b.scalar(0.0, loss), b.scalar(1.0, loss))
        w = keep if w is None else b.op("multiply", w, keep)
    if w is not None:
        loss = b.op("multiply", loss, w)
    if reduction == "none":
        return loss
    total = b.op("sum", loss, axis=list(range(loss.rank)), keepdims=False)
    if reduction == "sum":
        return total
    if w is None:
        return b.op("divide", total, b.scalar(float(math.prod(loss.shape)), total))
    return b.op("divide", total, b.op("sum", w, axis=list(range(w.rank)), keepdims=False))


@converts("NegativeLogLikelihoodLoss")
def nll_loss(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    weight = args[2] if len(args) > 2 else None
    return [_nll(ctx, node, args[0], args[1], weight)]


@converts("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    scores = args[0]
    if scores.rank < 2:
        raise Unsupported(f"scores of rank {scores.rank}")
    logp = ctx.b.op("log_softmax", scores, axis=1)
    weight = args[2] if len(args) > 2 else None
    return [_nll(ctx, node, logp, args[1], weight), logp]


@converts("RMSNormalization")
def rms_norm(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x, scale = args[0], args[1]
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, node)
    eps = float(node.attr("epsilon", 1e-5))
    stash = "float32" if int(node.attr("stash_type", 1)) == 1 else x.dtype
    xs = b.cast(x, stash)
    axes = list(range(axis, x.rank))
    ms = b.op("mean", b.op("multiply", xs, xs), axis=axes, keepdims=True)
    rms = b.op("sqrt", b.op("add", ms, b.scalar(eps, ms)))
    y = b.cast(b.op("divide", xs, rms), x.dtype)
    return [b.op("multiply", y, scale)]


@converts("Swish")
def swish(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    alpha = float(node.attr("alpha", 1.0))
    scaled = x if alpha == 1.0 else b.op("multiply", x, b.scalar(alpha, x))
    return [b.op("multiply", b.op("sigmoid", scaled), x)]


def _positions(n: int, axis: int, rank: int) -> np.ndarray:
    """0 .. n-1 laid along axis of a rank-`rank` array (ones elsewhere), for broadcasting."""
    shape = [1] * rank
    shape[axis] = n
    check_const_bytes(shape, np.int64, "positions table")
    return np.arange(n, dtype=np.int64).reshape(shape)


@converts("Hardmax")
def hardmax(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    if x.rank == 0:
        raise Unsupported("scalar input")
    axis = norm_axis(int(node.attr("axis", -1 if node.opset >= 13 else 1)), x.rank, node)
    if node.opset < 13 and axis != x.rank - 1:
        flat = b.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
        inner = _hardmax_axis(ctx, flat, 1)
        return [b.reshape(inner, x.shape)]
    return [_hardmax_axis(ctx, x, axis)]


def _hardmax_axis(ctx: Context, x: Value, axis: int) -> Value:
    b = ctx.b
    first = b.cast(b.op("argmax", x, axis=[axis], keepdims=True), "int64")
    hit = b.op("equal", first, b.const(_positions(x.shape[axis], axis, x.rank), "positions"))
    return b.cast(hit, x.dtype)


@converts("OneHot", shape_inputs=(1,), value_inputs=(2,), predict=size_one_hot)
def one_hot(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    indices, values = args[0], args[2]
    depth_in = const_input(node, args, 1, "depth")
    if depth_in is None:
        raise Unsupported("depth is missing")
    flat = np.asarray(depth_in).reshape(-1)
    if flat.size != 1 or not np.isfinite(flat[0]) or flat[0] < 1:
        raise Unsupported(f"depth {flat[:4].tolist()}; expected one number >= 1")
    depth = int(flat[0])
    if values is None or values.const is None or values.const.size != 2:
        raise Unsupported("values must be a constant [off, on]")
    rank = indices.rank + 1
    axis = norm_axis(int(node.attr("axis", -1)), rank, node)
    wrapped = b.op("mod", b.cast(indices, "int64"), b.const(np.array(depth, np.int64), "depth"))
    # NOTE: an index outside [-depth, depth) gives an all-off row in ONNX; mod would wrap it.
    if indices.const is None:
        lo = b.op("greater_equal", b.cast(indices, "int64"),
                  b.const(np.array(-depth, np.int64), "lo"))
        hi = b.op("less", b.cast(indices, "int64"), b.const(np.array(depth, np.int64), "hi"))
        valid = b.op("logical_and", lo, hi)
    else:
        valid = b.const((indices.const >= -depth) & (indices.const < depth), "valid")
    shape = list(indices.shape)
    shape.insert(axis, 1)
    hit = b.op("equal", b.reshape(wrapped, shape),
               b.const(_positions(depth, axis, rank), "positions"))
    hit = b.op("logical_and", hit, b.reshape(valid, shape))
    off = b.const(np.asarray(values.const.reshape(-1)[0]), "off")
    on = b.const(np.asarray(values.const.reshape(-1)[1]), "on")
    return [b.op("where", hit, on, off)]
