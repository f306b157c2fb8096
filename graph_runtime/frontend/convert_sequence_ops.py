"""Converters for Shrink and ReverseSequence, composed from selects and gathers (every backend)."""
from __future__ import annotations

import numpy as np

from .convert import Context, converts
from .ir import Unsupported, Value, check_const_bytes
from .onnx_node import OnnxNode


@converts("Shrink")
def shrink(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    """x + bias below -lambd, x - bias above lambd, 0 between (computed in float64)."""
    b = ctx.b
    x = args[0]
    lambd = float(node.attr("lambd", 0.5))
    bias = float(node.attr("bias", 0.0))
    wide = b.cast(x, "float64")
    below = b.op("less", wide, b.const(np.array(-lambd)))
    above = b.op("greater", wide, b.const(np.array(lambd)))
    zero = b.const(np.array(0.0))
    y = b.op("where", below, b.op("add", wide, b.const(np.array(bias))),
             b.op("where", above, b.op("subtract", wide, b.const(np.array(bias))), zero))
    return [b.cast(y, x.dtype)]


@converts("ReverseSequence")
def reverse_sequence(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    """Per batch entry b, the first lens[b] steps reversed: one gather_elements along time."""
    b = ctx.b
    x, lens = args[0], args[1]
    time_axis = int(node.attr("time_axis", 0))
    batch_axis = int(node.attr("batch_axis", 1))
    if sorted((time_axis, batch_axis)) != [0, 1] or x.rank < 2:
        raise Unsupported(f"time_axis {time_axis}, batch_axis {batch_axis} for rank {x.rank}")
    steps, batch = x.shape[time_axis], x.shape[batch_axis]
    t_shape = [1] * x.rank
    t_shape[time_axis] = steps
    l_shape = [1] * x.rank
    l_shape[batch_axis] = batch
    check_const_bytes(t_shape, np.int64, "ReverseSequence's step table")
    t = b.const(np.arange(steps, dtype=np.int64).reshape(t_shape), "steps")
    n = b.reshape(b.cast(lens, "int64"), l_shape)
    flipped = b.op("subtract", b.op("subtract", n, b.const(np.array(1, np.int64))), t)
    index = b.op("where", b.op("less", t, n), flipped, t)
    full = b.op("broadcast_to", index, shape=list(x.shape))
    return [b.op("gather_elements", x, full, axis=time_axis)]
