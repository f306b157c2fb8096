"""Converters for normalization: BatchNormalization (folded into a conv where it can be),
Layer/Instance/Group normalization, LRN, LpNormalization."""
from __future__ import annotations

import math

import numpy as np

from .convert import Context, converts, norm_axis
from .fold_size import broadcast
from .ir import Unsupported, Value
from .onnx_node import OnnxNode
from .symdim import Undecidable, same_shape


def _bn_scale_shift(node: OnnxNode, args: list) -> tuple[np.ndarray, np.ndarray] | None:
    if any(a.const is None for a in args[1:5]):
        return None
    scale, bias, mean, var = (a.const.astype(np.float64) for a in args[1:5])
    eps = float(node.attr("epsilon", 1e-5))
    factor = scale / np.sqrt(var + eps)
    return factor, bias - mean * factor


def _fold_into_conv(ctx: Context, node: OnnxNode, x: Value, factor: np.ndarray,
                    shift: np.ndarray) -> Value | None:
    """x = conv2d(...)[+ bias] with constant weights read only here: scale them instead."""
    b = ctx.b
    if ctx.uses[node.inputs[0]] != 1 or x.producer is None:
        return None
    prim = x.producer
    bias_prim = None
    if prim.op == "add" and prim.inputs[0].producer is not None \
            and prim.inputs[0].producer.op == "conv2d" and prim.inputs[1].const is not None:
        bias_prim, prim = prim, prim.inputs[0].producer
    if prim.op != "conv2d" or prim.inputs[1].const is None or x.rank != 4:
        return None
    if bias_prim is None and prim.outputs[0] is not x:
        return None
    weight = prim.inputs[1].const
    assert weight is not None  # checked above
    dtype = weight.dtype
    prim.inputs[1] = b.const((weight * factor.reshape(-1, 1, 1, 1)).astype(dtype),
                             prim.inputs[1].name)
    if bias_prim is not None:
        old = np.asarray(bias_prim.inputs[1].const).reshape(-1).astype(np.float64)
        bias_prim.inputs[1] = b.const((old * factor + shift).astype(dtype).reshape(-1, 1, 1),
                                      bias_prim.inputs[1].name)
        out = x
    else:
        out = b.op("add", x, b.const(shift.astype(dtype).reshape(-1, 1, 1), "bias"))
    ctx.bn_folded += 1
    return out


@converts("BatchNormalization")
def batch_norm(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    if int(node.attr("training_mode", 0)):
        raise Unsupported("training_mode=1")
    ctx.only_first_output(node)
    x = args[0]
    if x.rank < 2:
        raise Unsupported(f"input of rank {x.rank}")
    pair = _bn_scale_shift(node, args)
    if pair is not None:
        factor, shift = pair
        folded = _fold_into_conv(ctx, node, x, factor, shift)
        if folded is not None:
            return [folded]
        # NOTE: as Relay's SimplifyInference: a multiply and an add, fused with their producer.
        rank = x.rank
        mul = b.const(factor.astype(x.dtype).reshape((-1,) + (1,) * (rank - 2)), "bn_scale")
        add = b.const(shift.astype(x.dtype).reshape((-1,) + (1,) * (rank - 2)), "bn_shift")
        return [b.op("add", b.op("multiply", x, mul), add)]
    return [b.op("batch_norm", *args[:5], axis=1, epsilon=float(node.attr("epsilon", 1e-5)))]


@converts("LayerNormalization")
def layer_norm(ctx: Context, node: OnnxNode, args: list) -> list[Value | None]:
    b = ctx.b
    x, scale = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, node)
    eps = float(node.attr("epsilon", 1e-5))
    inner = x.shape[axis:]
    flat = math.prod(inner)
    for what, v in (("scale", scale), ("bias", bias)):
        if v is None:
            continue
        try:
            fits = same_shape(broadcast([v.shape, inner], what), inner)
        except Undecidable:
            raise
        except Unsupported:  # not broadcastable at all
            fits = False
        if not fits:
            raise Unsupported(f"{what} of shape {list(v.shape)} for normalized shape "
                              f"{list(inner)} (axis {axis}): expected a shape that "
                              "broadcasts to it")

    def vector(v: Value | None, fill: float) -> Value:
        if v is None:
            return b.const(np.full(flat, fill, x.dtype), "ln_param")
        if v.const is not None:
            return b.const(np.ascontiguousarray(np.broadcast_to(v.const, inner)).reshape(-1),
                           v.name)
        if math.prod(v.shape) != flat:
            raise Unsupported(f"computed scale/bias of shape {v.shape} broadcast to {inner}")
        return b.reshape(v, (flat,))

    x2 = b.reshape(x, tuple(x.shape[:axis]) + (flat,))
    y = b.op("layer_norm", x2, vector(scale, 1.0), vector(bias, 0.0), axis=-1, epsilon=eps)
    outs: list[Value | None] = [b.reshape(y, x.shape)]
    if any(ctx.used(n) for n in node.outputs[1:]):
        outs += _layer_norm_stats(ctx, node, x, x2, axis, eps)
    return outs


def _layer_norm_stats(ctx: Context, node: OnnxNode, x: Value, x2: Value, axis: int,
                      eps: float) -> list[Value]:
    """LayerNormalization's Mean and InvStdDev outputs, in the stash type (float32 default)."""
    b = ctx.b
    stash = "float32" if int(node.attr("stash_type", 1)) == 1 else x.dtype
    xs = b.cast(x2, stash)
    mean = b.op("mean", xs, axis=[-1], keepdims=True)
    centered = b.op("subtract", xs, mean)
    var = b.op("mean", b.op("multiply", centered, centered), axis=[-1], keepdims=True)
    inv = b.op("divide", b.scalar(1.0, var), b.op("sqrt", b.op("add", var, b.scalar(eps, var))))
    shape = tuple(x.shape[:axis]) + (1,) * (x.rank - axis)
    return [b.reshape(mean, shape), b.reshape(inv, shape)]


@converts("InstanceNormalization")
def instance_norm(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x, scale, bias = args[0], args[1], args[2]
    if x.rank < 3:
        raise Unsupported(f"input of rank {x.rank}")
    return [ctx.b.op("instance_norm", x, scale, bias, epsilon=float(node.attr("epsilon", 1e-5)))]


@converts("GroupNormalization")
def group_norm(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x, scale, bias = args[0], args[1], args[2]
    groups = int(node.attr("num_groups"))
    eps = float(node.attr("epsilon", 1e-5))
    c = x.shape[1] if x.rank > 1 else 0
    if x.rank < 3 or groups < 1 or c % groups:
        raise Unsupported(f"{c} channels in {groups} groups (input {x.shape})")
    if node.opset < 21 and scale.shape[0] == groups and groups != c:
        # Opset 18 gives scale and bias per group; spread them over the group's channels.
        if scale.const is None or bias.const is None:
            raise Unsupported("per-group scale/bias computed at run time")
        scale = b.const(np.repeat(scale.const, c // groups), scale.name)
        bias = b.const(np.repeat(bias.const, c // groups), bias.name)
    return [b.op("group_norm", x, scale, bias, num_groups=groups, epsilon=eps)]


@converts("LRN")
def lrn(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op("lrn", args[0], size=int(node.attr("size")),
                     alpha=float(node.attr("alpha", 1e-4)), beta=float(node.attr("beta", 0.75)),
                     bias=float(node.attr("bias", 1.0)))]


@converts("LpNormalization")
def lp_normalization(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, node)
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise Unsupported(f"p={p} (1 or 2)")
    return [b.op("lp_normalization", x, axis=axis, p=p)]
