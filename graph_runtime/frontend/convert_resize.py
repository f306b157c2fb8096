"""Converter for Resize/Upsample onto the op library's resize op."""
from __future__ import annotations

from .convert import Context
from .ir import Unsupported, Value, has_op
from .onnx_model import Node


def convert_resize(ctx: Context, node: Node, args: list) -> list[Value]:
    if not has_op("resize"):
        raise Unsupported("needs standard op 'resize', which the op library does not have")
    raise Unsupported("the resize op's attributes are not mapped yet")
