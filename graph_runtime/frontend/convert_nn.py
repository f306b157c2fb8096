"""Converters for the neural-network ops: conv, gemm/matmul, normalization, pooling, softmax."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .convert import Context, converts, norm_axis
from .ir import Unsupported, Value, has_op
from .onnx_model import Node

# -- windows (conv and pooling) -------------------------------------------------------------------

def window_pads(node: Node, sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                dilations: Sequence[int]) -> list[int]:
    """ONNX pads as [begin..., end...] with auto_pad resolved for these input sizes."""
    nd = len(sizes)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = node.ints("pads", [0] * (2 * nd))
        if len(pads) != 2 * nd:
            raise Unsupported(f"pads {pads}: expected {2 * nd} values")
        if min(pads) < 0:
            raise Unsupported(f"negative pads {pads}")
        return pads
    if auto == "VALID":
        return [0] * (2 * nd)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad {auto!r}")
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin + end


def _window_attrs(node: Node, x: Value, kernel: Sequence[int], dilation_attr: bool = True
                  ) -> tuple[list[int], list[int], list[int]]:
    nd = len(kernel)
    strides = node.ints("strides", [1] * nd)
    dilations = node.ints("dilations", [1] * nd) if dilation_attr else [1] * nd
    pads = window_pads(node, x.shape[2:], kernel, strides, dilations)
    return strides, dilations, pads


def _to_2d(ctx: Context, x: Value) -> Value:
    """An (N, C, W) tensor as (N, C, 1, W), so 1-D windows run as 2-D ones."""
    return ctx.b.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))


def _channel_vector(ctx: Context, v: Value, rank: int) -> Value:
    """A (C,) vector shaped (C, 1, ...) to broadcast over an NC... tensor of rank."""
    return ctx.b.reshape(v, (v.shape[0],) + (1,) * (rank - 2))


@converts("Conv")
def conv(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    if x.rank not in (3, 4):
        raise Unsupported(f"{x.rank - 2}-D convolution (input {x.shape}); 1-D and 2-D are "
                          "supported")
    kernel = list(w.shape[2:])
    strides, dilations, pads = _window_attrs(node, x, kernel)
    group = int(node.attr("group", 1))
    if x.rank == 3:
        x = _to_2d(ctx, x)
        w = b.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
        strides, dilations = [1] + strides, [1] + dilations
        pads = [0, pads[0], 0, pads[1]]
    y = b.op("conv2d", x, w, strides=strides, padding=[pads[0], pads[1], pads[2], pads[3]],
             dilation=dilations, groups=group)
    if bias is not None:
        y = b.op("add", y, _channel_vector(ctx, bias, 4))
    if args[0].rank == 3:
        y = b.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    return [y]


@converts("ConvTranspose")
def conv_transpose(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    if x.rank not in (3, 4):
        raise Unsupported(f"{x.rank - 2}-D transposed convolution; 1-D and 2-D are supported")
    nd = x.rank - 2
    kernel = list(w.shape[2:])
    strides = node.ints("strides", [1] * nd)
    dilations = node.ints("dilations", [1] * nd)
    outpad = node.ints("output_padding", [0] * nd)
    group = int(node.attr("group", 1))
    out_shape = node.opt_ints("output_shape")
    auto = node.attr("auto_pad", "NOTSET")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is None:
            out_shape = [s * st for s, st in zip(x.shape[2:], strides)]
        out_shape = out_shape[-nd:]
        begin, end, extra = [], [], []
        for size, k, s, d, op, want in zip(x.shape[2:], kernel, strides, dilations, outpad,
                                           out_shape):
            total = s * (size - 1) + op + (k - 1) * d + 1 - want
            if total < 0:
                # The output is longer than the data reaches: the tail is output padding.
                extra.append(-total)
                total = 0
            else:
                extra.append(0)
            if auto == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
        pads = begin + end
        outpad = [p + e for p, e in zip(outpad, extra)]
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    else:
        pads = node.ints("pads", [0] * (2 * nd))
    if x.rank == 3:
        x = _to_2d(ctx, x)
        w = b.reshape(w, (w.shape[0], w.shape[1], 1, w.shape[2]))
        strides, dilations, outpad = [1] + strides, [1] + dilations, [0] + outpad
        pads = [0, pads[0], 0, pads[1]]
    y = b.op("conv2d_transpose", x, w, strides=strides, padding=pads, dilation=dilations,
             groups=group, output_padding=outpad)
    if bias is not None:
        y = b.op("add", y, _channel_vector(ctx, bias, 4))
    if args[0].rank == 3:
        y = b.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    return [y]


# -- gemm / matmul --------------------------------------------------------------------------------

@converts("Gemm")
def gemm(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    a, w = args[0], args[1]
    c = args[2] if len(args) > 2 else None
    alpha = float(node.attr("alpha", 1.0))
    beta = float(node.attr("beta", 1.0))
    if int(node.attr("transA", 0)):
        a = b.transpose(a, [1, 0])
    trans_b = bool(int(node.attr("transB", 0)))
    if w.const is not None:
        weight = w.const if trans_b else w.const.T
        if alpha != 1.0:
            weight = weight * np.asarray(alpha, weight.dtype)
        y = b.op("dense", a, b.const(np.ascontiguousarray(weight), w.name))
    else:
        y = b.op("dense", a, w) if trans_b else b.op("matmul", a, w)
        if alpha != 1.0:
            y = b.op("multiply", y, b.scalar(alpha, y))
    if c is not None and beta != 0.0:
        if c.const is not None:
            c = b.const(c.const * np.asarray(beta, c.const.dtype), c.name)
        elif beta != 1.0:
            c = b.op("multiply", c, b.scalar(beta, c))
        y = b.op("add", y, c)
    return [y]


def _matmul_shape(a: Sequence[int], w: Sequence[int]) -> tuple[int, ...]:
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    w2 = tuple(w) + (1,) if len(w) == 1 else tuple(w)
    batch = tuple(np.broadcast_shapes(a2[:-2], w2[:-2]))
    shape = batch + (a2[-2], w2[-1])
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(w) == 1:
        shape = shape[:-1]
    return shape


@converts("MatMul")
def matmul(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    a, w = args[0], args[1]
    if a.rank == 0 or w.rank == 0:
        raise Unsupported("MatMul of a scalar")
    try:
        final = _matmul_shape(a.shape, w.shape)
    except ValueError:
        raise Unsupported(f"MatMul shapes {a.shape} and {w.shape} do not broadcast") from None
    if a.rank == 1:
        a = b.reshape(a, (1, a.shape[0]))
    if w.rank == 1:
        w = b.reshape(w, (w.shape[0], 1))
    w_batch = math.prod(w.shape[:-2])
    if w_batch == 1 and w.rank > 2 and w.rank <= a.rank:
        w = b.reshape(w, w.shape[-2:])
    if w.rank == 2:
        if w.const is not None:
            y = b.op("dense", a, b.const(np.ascontiguousarray(w.const.T), w.name))
        else:
            y = b.op("matmul", a, w)
        return [b.reshape(y, final)]
    batch = tuple(np.broadcast_shapes(a.shape[:-2], w.shape[:-2]))
    count = math.prod(batch)

    def as_3d(v: Value) -> Value:
        own = tuple(v.shape[:-2])
        pad = (1,) * (len(batch) - len(own)) + own
        if pad == batch:
            return b.reshape(v, (count,) + tuple(v.shape[-2:]))
        if math.prod(own) == 1:
            return b.reshape(v, (1,) + tuple(v.shape[-2:]))
        if not has_op("broadcast_to"):
            raise Unsupported(f"MatMul batch dims {a.shape[:-2]} and {w.shape[:-2]} need a "
                              "broadcast (op broadcast_to is missing)")
        full = b.op("broadcast_to", b.reshape(v, pad + tuple(v.shape[-2:])),
                    shape=list(batch + tuple(v.shape[-2:])))
        return b.reshape(full, (count,) + tuple(v.shape[-2:]))

    y = b.op("batch_matmul", as_3d(a), as_3d(w), transpose_b=False)
    return [b.reshape(y, final)]


# -- normalization --------------------------------------------------------------------------------

def _bn_scale_shift(node: Node, args: list) -> tuple[np.ndarray, np.ndarray] | None:
    if any(a.const is None for a in args[1:5]):
        return None
    scale, bias, mean, var = (a.const.astype(np.float64) for a in args[1:5])
    eps = float(node.attr("epsilon", 1e-5))
    factor = scale / np.sqrt(var + eps)
    return factor, bias - mean * factor


def _fold_into_conv(ctx: Context, node: Node, x: Value, factor: np.ndarray,
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
def batch_norm(ctx: Context, node: Node, args: list) -> list[Value]:
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
def layer_norm(ctx: Context, node: Node, args: list) -> list[Value | None]:
    b = ctx.b
    x, scale = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, node)
    eps = float(node.attr("epsilon", 1e-5))
    inner = x.shape[axis:]
    flat = math.prod(inner)
    for what, v in (("scale", scale), ("bias", bias)):
        if v is not None and tuple(np.broadcast_shapes(v.shape, inner)) != tuple(inner):
            raise Unsupported(f"{what} of shape {v.shape} for normalized shape {inner}")

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


def _layer_norm_stats(ctx: Context, node: Node, x: Value, x2: Value, axis: int,
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
def instance_norm(ctx: Context, node: Node, args: list) -> list[Value]:
    x, scale, bias = args[0], args[1], args[2]
    if x.rank < 3:
        raise Unsupported(f"input of rank {x.rank}")
    return [ctx.b.op("instance_norm", x, scale, bias, epsilon=float(node.attr("epsilon", 1e-5)))]


@converts("GroupNormalization")
def group_norm(ctx: Context, node: Node, args: list) -> list[Value]:
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
def lrn(ctx: Context, node: Node, args: list) -> list[Value]:
    return [ctx.b.op("lrn", args[0], size=int(node.attr("size")),
                     alpha=float(node.attr("alpha", 1e-4)), beta=float(node.attr("beta", 0.75)),
                     bias=float(node.attr("bias", 1.0)))]


@converts("LpNormalization")
def lp_normalization(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, node)
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise Unsupported(f"p={p} (1 or 2)")
    norm = b.op("l2" if p == 2 else "l1", x, axis=[axis], keepdims=True)
    # ONNX gives 0 where the norm is 0 (all of x there is 0): divide those by 1 instead.
    safe = b.op("where", b.op("equal", norm, b.scalar(0.0, norm)), b.scalar(1.0, norm), norm)
    return [b.op("divide", x, safe)]


# -- pooling --------------------------------------------------------------------------------------

def _pool_out(size: int, k: int, s: int, d: int, pb: int, pe: int, ceil: bool) -> int:
    span = (k - 1) * d + 1
    if ceil:
        out = -(-(size + pb + pe - span) // s) + 1
        if (out - 1) * s >= size + pb:
            out -= 1
        return out
    return (size + pb + pe - span) // s + 1


@converts("MaxPool", "AveragePool")
def pool(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    is_max = node.op_type == "MaxPool"
    if is_max:
        ctx.only_first_output(node)
        if int(node.attr("storage_order", 0)):
            raise Unsupported("storage_order=1")
    if x.rank not in (3, 4, 5):
        raise Unsupported(f"{x.rank - 2}-D pooling; 1-D, 2-D and 3-D are supported")
    kernel = node.ints("kernel_shape")
    strides, dilations, pads = _window_attrs(node, x, kernel)
    nd = len(kernel)
    ceil = bool(int(node.attr("ceil_mode", 0)))
    include = bool(int(node.attr("count_include_pad", 0)))
    want = [_pool_out(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i],
                      pads[nd + i], ceil) for i in range(nd)]
    if x.rank == 3:
        x = _to_2d(ctx, x)
        kernel, strides, dilations = [1] + kernel, [1] + strides, [1] + dilations
        pads = [0, pads[0], 0, pads[1]]
        want = [1] + want
    attrs = dict(pool_size=kernel, strides=strides, dilation=dilations, padding=pads,
                 ceil_mode=ceil)
    if not is_max:
        attrs["count_include_pad"] = include
    dims = "3d" if x.rank == 5 else "2d"
    y = b.op(f"max_pool{dims}" if is_max else f"avg_pool{dims}", x, **attrs)
    if list(y.shape[2:]) != want:
        raise Unsupported(f"ceil_mode={int(ceil)} with pads {pads}: the op library gives "
                          f"{list(y.shape[2:])} windows, ONNX {want}")
    if args[0].rank == 3:
        y = b.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    return [y]


@converts("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    is_max = node.op_type == "GlobalMaxPool"
    if x.rank == 4:
        return [b.op("global_max_pool2d" if is_max else "global_avg_pool2d", x)]
    if x.rank < 3:
        raise Unsupported(f"input of rank {x.rank}")
    return [b.op("max" if is_max else "mean", x, axis=list(range(2, x.rank)), keepdims=True)]


# -- softmax --------------------------------------------------------------------------------------

@converts("Softmax", "LogSoftmax")
def softmax(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    op = "softmax" if node.op_type == "Softmax" else "log_softmax"
    if x.rank == 0:
        raise Unsupported("scalar input")
    if node.opset >= 13:
        axis = norm_axis(int(node.attr("axis", -1)), x.rank, node)
        return [b.op(op, x, axis=axis)]
    # Before opset 13: the input is seen as 2-D, [prod(shape[:axis]), prod(shape[axis:])].
    axis = norm_axis(int(node.attr("axis", 1)), x.rank, node)
    if axis == x.rank - 1:
        return [b.op(op, x, axis=-1)]
    flat = b.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return [b.reshape(b.op(op, flat, axis=1), x.shape)]


__all__ = ["window_pads"]
