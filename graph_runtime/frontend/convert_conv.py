"""Converters for sliding-window ops: Conv, ConvTranspose (1-D and 2-D), MaxPool/AveragePool,
global pools."""
from __future__ import annotations

import math
from collections.abc import Sequence

from .convert import Context, converts
from .ir import Unsupported, Value
from .onnx_node import OnnxNode
from .symdim import has_sym, same_shape

# -- windows (conv and pooling) -------------------------------------------------------------------

def window_pads(node: OnnxNode, sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
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


def _window_attrs(node: OnnxNode, x: Value, kernel: Sequence[int], dilation_attr: bool = True
                  ) -> tuple[list[int], list[int], list[int]]:
    nd = x.rank - 2
    strides = node.ints("strides", [1] * nd)
    dilations = node.ints("dilations", [1] * nd) if dilation_attr else [1] * nd
    for what, values in (("the kernel", kernel), ("strides", strides),
                         ("dilations", dilations)):
        if len(values) != nd or min(values, default=1) < 1:
            raise Unsupported(f"{what} {list(values)} for input of shape {list(x.shape)}: "
                              f"expected {nd} positive values, one per spatial axis")
    pads = window_pads(node, x.shape[2:], kernel, strides, dilations)
    return strides, dilations, pads


def _to_2d(ctx: Context, x: Value) -> Value:
    """An (N, C, W) tensor as (N, C, 1, W), so 1-D windows run as 2-D ones."""
    return ctx.b.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2]))


def channel_vector(ctx: Context, v: Value, rank: int, channels: int) -> Value:
    """A (C,) vector shaped (C, 1, ...) to broadcast over an NC... tensor of rank; a vector of
    another shape is refused (one value per output channel)."""
    if tuple(v.shape) != (channels,):
        raise Unsupported(f"bias of shape {list(v.shape)}; expected [{channels}], one value per "
                          "output channel")
    return ctx.b.reshape(v, (channels,) + (1,) * (rank - 2))


@converts("Conv")
def conv(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
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
    x, pads = _absorb_zero_pad(x, pads)
    y = b.op("conv2d", x, w, strides=strides, padding=[pads[0], pads[1], pads[2], pads[3]],
             dilation=dilations, groups=group)
    if bias is not None:
        y = b.op("add", y, channel_vector(ctx, bias, 4, y.shape[1]))
    if args[0].rank == 3:
        y = b.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    return [y]


def _absorb_zero_pad(x: Value, pads: list[int]) -> tuple[Value, list[int]]:
    """A conv reading a zero Pad of its input's rows and columns reads the unpadded input with
    the widths added to its own pads (TensorFlow-style 'same' exports, e.g. Hugging Face's
    MobileNetV2, pad before every stride-2 conv): one pass over the data fewer, and the conv's
    neighbours can keep oneDNN's channels-last layout. The Pad stays for any other reader."""
    prim = x.producer
    if prim is None or prim.op != "pad" or x.rank != 4 or prim.attrs.get("pad_value") != 0:
        return x, pads
    widths = prim.attrs["pad_width"]
    if any(widths[0]) or any(widths[1]) or min(w for pair in widths for w in pair) < 0:
        return x, pads
    (top, bottom), (left, right) = widths[2], widths[3]
    return prim.inputs[0], [pads[0] + top, pads[1] + left, pads[2] + bottom, pads[3] + right]


@converts("ConvTranspose")
def conv_transpose(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    if x.rank not in (3, 4):
        raise Unsupported(f"{x.rank - 2}-D transposed convolution; 1-D and 2-D are supported")
    if w.rank != x.rank:
        raise Unsupported(f"weight of shape {list(w.shape)} for input of shape {list(x.shape)}: "
                          f"expected a weight of rank {x.rank}")
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
        y = b.op("add", y, channel_vector(ctx, bias, 4, y.shape[1]))
    if args[0].rank == 3:
        y = b.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    return [y]


# -- pooling --------------------------------------------------------------------------------------

def _pool_out(size: int, k: int, s: int, d: int, pb: int, pe: int, ceil: bool) -> int:
    span = (k - 1) * d + 1
    if ceil:
        out = -(-(size + pb + pe - span) // s) + 1
        if (out - 1) * s >= size + pb:
            out -= 1
        return out
    return (size + pb + pe - span) // s + 1


@converts("MaxPool", "AveragePool", "LpPool")
def pool(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    is_max = node.op_type == "MaxPool"
    is_lp = node.op_type == "LpPool"
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
    p = int(node.attr("p", 2))
    if is_lp:
        # (sum |x|^p)^(1/p) = (taps * mean of |x|^p, zero padding counted)^(1/p)
        if ceil:
            raise Unsupported("LpPool with ceil_mode=1")
        include = True
        x = b.op("multiply", x, x) if p == 2 else \
            b.op("power", b.op("abs", x), b.scalar(float(p), x))
    for i in range(nd):
        span = (kernel[i] - 1) * dilations[i] + 1
        padded = x.shape[2 + i] + pads[i] + pads[nd + i]
        # A symbolic size's fit is checked by the op's own rule when the module is specialised.
        if not ceil and not has_sym(padded) and span > padded:
            raise Unsupported(f"ceil_mode=0 with a window spanning {span} on axis {2 + i} but "
                              f"the padded input has only {padded}: ONNX's formula floors to "
                              "no window (ONNX Runtime truncates toward zero and may pool one); "
                              "with ceil_mode=1 the window pools what it covers")
    want = [_pool_out(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i],
                      pads[nd + i], ceil) for i in range(nd)]
    if x.rank == 3:
        x = _to_2d(ctx, x)
        kernel, strides, dilations = [1] + kernel, [1] + strides, [1] + dilations
        pads = [0, pads[0], 0, pads[1]]
        want = [1] + want
    attrs: dict[str, object] = {"pool_size": kernel, "strides": strides, "dilation": dilations,
                                "padding": pads, "ceil_mode": ceil}
    if not is_max:
        attrs["count_include_pad"] = include
    dims = "3d" if x.rank == 5 else "2d"
    y = b.op(f"max_pool{dims}" if is_max else f"avg_pool{dims}", x, **attrs)
    if not same_shape(y.shape[2:], want):
        raise Unsupported(f"ceil_mode={int(ceil)} with pads {pads}: the op library gives "
                          f"{list(y.shape[2:])} windows, ONNX {want}")
    if args[0].rank == 3:
        y = b.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    if is_lp:
        total = b.op("multiply", y, b.scalar(float(math.prod(kernel)), y))
        y = b.op("sqrt", total) if p == 2 else b.op("power", total, b.scalar(1.0 / p, y))
    return [y]


@converts("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    is_max = node.op_type == "GlobalMaxPool"
    if x.rank == 4:
        return [b.op("global_max_pool2d" if is_max else "global_avg_pool2d", x)]
    if x.rank < 3:
        raise Unsupported(f"input of rank {x.rank}")
    return [b.op("max" if is_max else "mean", x, axis=list(range(2, x.rank)), keepdims=True)]
