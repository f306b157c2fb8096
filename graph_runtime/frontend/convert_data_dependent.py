"""Converters for ops whose output size depends on the data: NonZero, Unique, run-time Compress
and NonMaxSuppression, each becoming a node the runtime cuts the graph at (runtime/segments.py);
the sizes are named here for them and for a Loop whose scan outputs' length is data
(convert_control.py).

The size is a symbolic dim named after the op's output (`NonZero_y`). The import lowers the
model at probe sizes for it (frontend/symbolic_import.py), so every shape and attr that
follows the size is written as an expression of it; the runtime binds it once the node has run.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .convert import Context, converts, norm_axis
from .ir import Unsupported, Value
from .onnx_node import OnnxNode
from .symbolic_import import Symbol

# ONNX op types whose first output's size depends on the data (TopK: when k is computed).
DATA_DEPENDENT_OPS = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression", "TopK"})
_IDENT = re.compile(r"[^A-Za-z0-9_]")


def data_symbols(model: Any, taken: Iterable[str] = ()) -> dict[str, Symbol]:
    """{ONNX output name: the symbol for its data-dependent size} for every such node."""
    used = set(taken)
    symbols: dict[str, Symbol] = {}
    known = {t.name for t in model.graph.initializer}
    known.update(o for n in model.graph.node if n.op_type == "Constant" for o in n.output)
    from .convert_control import data_dependent_loop
    for node in model.graph.node:
        out = data_dependent_loop(node)  # a Loop's scan outputs whose length is data
        if out is None:
            if node.op_type not in DATA_DEPENDENT_OPS or node.domain not in ("", "ai.onnx") \
                    or not node.output or not node.output[0]:
                continue
            if node.op_type == "TopK" and (len(node.input) < 2 or node.input[1] in known):
                continue  # k in the attrs (opset < 10) or a constant: a static size
            out = node.output[0]
        base = f"{node.op_type}_{_IDENT.sub('_', out)}"
        name = base
        k = 1
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        symbols[out] = Symbol(name, ())
    return symbols


def data_only_topk(model: Any, symbols: Mapping[str, Symbol]) -> bool:
    """Whether every data-dependent size is a TopK's (its k, once frozen, makes it static)."""
    producers = {o: n.op_type for n in model.graph.node for o in n.output if o}
    return all(producers.get(out) == "TopK" for out in symbols)


def downstream(model: Any, names: Iterable[str]) -> set[str]:
    """The ONNX value names computed from names (names, and the other outputs of their nodes,
    included)."""
    reached = set(names)
    for node in model.graph.node:  # nodes are in topological order
        if any(i in reached for i in node.input if i) or any(o in reached for o in node.output):
            reached.update(o for o in node.output if o)
    return reached


def data_size(ctx: Context, node: OnnxNode) -> int:
    """The probe size the import plans for node's data-dependent output."""
    size = ctx.data_sizes.get(node.outputs[0])
    if size is None:
        raise Unsupported(f"output {node.outputs[0]!r} has a size that depends on the data; "
                          "it is imported with a symbolic size (import_onnx does this)")
    return int(size)


def is_computed(value: Value | None) -> bool:
    return value is not None and value.const is None and value.known is None


@converts("NonZero")
def nonzero(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op("nonzero", args[0], count=data_size(ctx, node))]


@converts("Unique")
def unique(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    axis = node.attr("axis")
    attrs: dict[str, Any] = {"count": data_size(ctx, node), "sorted": int(node.attr("sorted", 1))}
    if axis is not None:
        attrs.update(axis=norm_axis(int(axis), x.rank, node), has_axis=1)
    return list(ctx.b.ops("unique", [x], **attrs))


def compress_computed(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    """Compress whose condition is computed at run time."""
    x, condition = args[0], args[1]
    attrs: dict[str, Any] = {"count": data_size(ctx, node)}
    if node.attr("axis") is not None:
        attrs.update(axis=norm_axis(int(node.attr("axis")), x.rank, node), has_axis=1)
    flat = ctx.b.reshape(condition, (math.prod(condition.shape),))
    return [ctx.b.op("compress", x, ctx.b.cast(flat, "bool"), **attrs)]


def topk_computed(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    """TopK whose k is computed at run time: as many values as k says."""
    x, k = args[0], args[1]
    return list(ctx.b.ops("topk_dynamic", [x, ctx.b.reshape(ctx.b.cast(k, "int64"), (1,))],
                          count=data_size(ctx, node),
                          axis=norm_axis(int(node.attr("axis", -1)), x.rank, node),
                          largest=int(node.attr("largest", 1)),
                          sorted=int(node.attr("sorted", 1))))


def nms_computed(ctx: Context, node: OnnxNode, args: list, inputs: list[Value]) -> list[Value]:
    """NonMaxSuppression with no stated output shape: every selected box, as many as the data
    gives."""
    return [ctx.b.op("non_max_suppression_dynamic", *inputs, count=data_size(ctx, node),
                     center_point_box=int(node.attr("center_point_box", 0)),
                     use_score_threshold=int(len(args) > 4 and args[4] is not None))]
