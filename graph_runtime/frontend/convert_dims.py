"""Converters for nodes whose inputs are known at import but whose values follow symbolic dims.

A symbolic import (frontend/symbolic_import.py) finds the folded constants that change with the
dims and are read as data (BERT's position ids, GPT-2's causal mask); their nodes are lowered
to ops instead, so the graph computes them for each shape: Shape as `shape_of`, Range as a
cumulative sum, ConstantOfShape as a broadcast, any other node through its usual converter.
"""
from __future__ import annotations

import math

import numpy as np

from collections.abc import Sequence
from typing import Any

from .convert import CONVERTERS, Context, const_input, required_ints
from .fold import fold
from .ir import Unsupported, Value
from .onnx_node import OnnxNode
from .symdim import floordiv, has_sym, sym_max


def convert_unfolded(ctx: Context, node: OnnxNode, args: list) -> list[Value | None]:
    """The node as ops computed at run time (never folded), outputs in ONNX order."""
    b = ctx.b
    if node.op_type == "Shape":
        end = node.attr("end")
        attrs = {"start": int(node.attr("start", 0))}
        if end is not None:
            attrs["end"] = int(end)
        out = b.op("shape_of", args[0], **attrs)
        out.known = np.array(args[0].shape, np.int64)[attrs["start"]:end]
        return [out]
    if node.op_type == "Range":
        return [_range(ctx, node, args)]
    if node.op_type == "ConstantOfShape":
        dims = required_ints(node, args, 0, "shape")
        value = node.attr("value")
        fill = np.zeros((), np.float32) if value is None else np.asarray(value).reshape(())
        return [b.op("broadcast_to", b.const(fill, "fill"), shape=dims)]
    convert = CONVERTERS.get(node.op_type) if node.domain == "" else None
    if convert is None:
        raise Unsupported("__unknown__")
    outs = list(convert(ctx, node, args))
    return outs + [None] * (len(node.outputs) - len(outs))


def keep_known(node: OnnxNode, outs: Sequence[Value | None],
               inputs: Sequence[Any], opset_imports: Any) -> None:
    """Attach each output's value at this import's shapes (Value.known), for the nodes that read
    it at import (a Range's limit from the same Shape a Mul reads as data)."""
    try:
        results = fold(node, inputs, opset_imports)
    except Unsupported:
        return
    for value, result in zip(outs, results):
        if value is not None and result is not None and value.const is None:
            value.known = np.asarray(result)


def _range(ctx: Context, node: OnnxNode, args: list) -> Value:
    """start + delta * [0, 1, ..., n-1] with n = ceil((limit - start) / delta)."""
    b = ctx.b
    start, limit, delta = (const_input(node, args, i, what)
                           for i, what in enumerate(("start", "limit", "delta")))
    if start is None or limit is None or delta is None:
        raise Unsupported("start, limit and delta are all required")
    dtype = np.asarray(start).dtype
    s, lim, d = (np.asarray(v).reshape(-1)[0] for v in (start, limit, delta))
    if has_sym([s, lim, d]):
        # A limit that follows symbolic dims (Range(0, seq)): the count as an expression.
        dtype = np.dtype(args[0].dtype)
        if has_sym([s, d]) or dtype.kind not in "iu":
            raise Unsupported(f"Range({s}, {lim}, {d}) of {dtype}: expected a symbolic limit "
                              "only, with integer start and delta")
        s, d = int(s), int(d)
        if d == 0:
            raise Unsupported("delta 0")
        n = sym_max(floordiv(lim - s + d - 1, d) if d > 0 else floordiv(s - lim - d - 1, -d), 0)
    else:
        s, lim, d = (v.item() for v in (s, lim, d))
        if d == 0:
            raise Unsupported("delta 0")
        n = max(int(math.ceil((lim - s) / d)), 0)
    ones = b.op("broadcast_to", b.const(np.ones((), dtype), "one"), shape=[n])
    out = b.op("cumsum", ones, axis=0, exclusive=True)
    if d != 1:
        out = b.op("multiply", out, b.const(np.asarray(d, dtype), "delta"))
    if s != 0:
        out = b.op("add", out, b.const(np.asarray(s, dtype), "start"))
    return out
