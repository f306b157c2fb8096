"""Converters for the dense linear-algebra ops and softmax: Gemm, MatMul, Softmax/LogSoftmax."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .convert import Context, converts, norm_axis
from .fold_size import broadcast, size_matmul
from .ir import Unsupported, Value
from .onnx_node import OnnxNode
from .symdim import same, same_shape


@converts("Gemm")
def gemm(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
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
    batch = broadcast([a2[:-2], w2[:-2]], "the batch dims of inputs 0 and 1")
    shape = batch + (a2[-2], w2[-1])
    if len(a) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(w) == 1:
        shape = shape[:-1]
    return shape


@converts("MatMul", predict=size_matmul)
def matmul(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
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
    # same(): a batch only decided at run time (batch*1) takes the general path, right for 1 too.
    w_batch = math.prod(w.shape[:-2])
    if same(w_batch, 1) and w.rank > 2 and w.rank <= a.rank:
        w = b.reshape(w, w.shape[-2:])
    if w.rank == 2:
        if w.const is not None:
            y = b.op("dense", a, b.const(np.ascontiguousarray(w.const.T), w.name))
        else:
            y = b.op("matmul", a, w)
        return [b.reshape(y, final)]
    batch = broadcast([a.shape[:-2], w.shape[:-2]], "the batch dims of inputs 0 and 1")
    count = math.prod(batch)

    def as_3d(v: Value) -> Value:
        own = tuple(v.shape[:-2])
        pad = (1,) * (len(batch) - len(own)) + own
        if same_shape(pad, batch):
            return b.reshape(v, (count,) + tuple(v.shape[-2:]))
        if same(math.prod(own), 1):
            return b.reshape(v, (1,) + tuple(v.shape[-2:]))
        full = b.op("broadcast_to", b.reshape(v, pad + tuple(v.shape[-2:])),
                    shape=list(batch + tuple(v.shape[-2:])))
        return b.reshape(full, (count,) + tuple(v.shape[-2:]))

    y = b.op("batch_matmul", as_3d(a), as_3d(w), transpose_b=False)
    return [b.reshape(y, final)]


# -- softmax --------------------------------------------------------------------------------------

@converts("Softmax", "LogSoftmax")
def softmax(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
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


