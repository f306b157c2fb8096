"""Converters for CumProd and the signal ops: DFT, STFT, MelWeightMatrix."""
from __future__ import annotations

import numpy as np

from .convert import Context, const_input, converts, norm_axis
from .ir import Unsupported, Value
from .onnx_node import OnnxNode


@converts("CumProd")
def cumprod(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    axis = norm_axis(int(np.asarray(const_input(node, args, 1, "axis")).reshape(-1)[0]),
                     x.rank, node)
    return [ctx.b.op("cumprod", x, axis=axis, exclusive=bool(int(node.attr("exclusive", 0))),
                     reverse=bool(int(node.attr("reverse", 0))))]
