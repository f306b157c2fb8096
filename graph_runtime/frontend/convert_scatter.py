"""Converters for ScatterElements / Scatter / ScatterND whose indices are computed at run time."""
from __future__ import annotations

from .convert import Context, converts, norm_axis
from .convert_index import scatter as scatter_known
from .ir import TooLarge, Value
from .onnx_node import OnnxNode


@converts("ScatterElements", "Scatter", "ScatterND")
def scatter(ctx: Context, node: OnnxNode, args: list) -> list[Value | None]:
    """Indices known at import: a take and a select (every backend); else the scatter ops."""
    data, indices, updates = args[0], args[1], args[2]
    if indices is not None and indices.const is not None:
        try:
            return list(scatter_known(ctx, node, args))
        except TooLarge:
            pass  # its tables would pass the import's budget: the scatter ops read the indices
    reduction = str(node.attr("reduction", "none"))
    if node.op_type == "ScatterND":
        return [ctx.b.op("scatter_nd", data, indices, updates, reduction=reduction)]
    axis = norm_axis(int(node.attr("axis", 0)), data.rank, node)
    return [ctx.b.op("scatter_elements", data, indices, updates, axis=axis,
                     reduction=reduction)]
