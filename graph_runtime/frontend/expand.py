"""Function expansion: ONNX ops the spec defines as a function of other ops are inlined first.

Attention, CenterCropPad and friends have a function body in their schema (some depend on the
input types); a node of such an op with no converter of its own is replaced by that body, so
its primitive ops go through the ordinary converters.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

EXPAND_DOMAIN = "graph_runtime.expand"
_ROUNDS = 3  # a function body may itself use function ops


def _function_body(node: Any, opset: int, types: Mapping[str, Any]) -> Any | None:
    from onnx import FunctionProto, TypeProto, defs
    try:
        schema: Any = defs.get_schema(node.op_type, opset, node.domain)
    except Exception:  # noqa: BLE001
        return None
    try:
        if schema.has_function:
            body = schema.get_function_with_opset_version(opset)
            return body if body is not None and len(body.node) else None
        if schema.has_context_dependent_function:
            arg_types = [types.get(name, TypeProto()).SerializeToString() for name in node.input]
            raw = schema.get_context_dependent_function_with_opset_version(
                opset, node.SerializeToString(), arg_types)
            body = FunctionProto.FromString(raw)
            return body if len(body.node) else None
    except Exception:  # noqa: BLE001
        return None
    return None


def expand_functions(model: Any, convertible: Collection[str],
                     types: Mapping[str, Any]) -> tuple[Any, int]:
    """(model with function ops inlined, how many were expanded); the input is not modified."""
    import onnx
    import onnx.inliner
    from onnx import helper
    opset = next((int(e.version) for e in model.opset_import if e.domain in ("", "ai.onnx")), 1)
    expanded = 0
    current = model
    for _ in range(_ROUNDS):
        picked = [(i, n) for i, n in enumerate(current.graph.node)
                  if n.domain in ("", "ai.onnx") and n.op_type not in convertible]
        bodies = [(i, body) for i, n in picked
                  for body in [_function_body(n, opset, types)] if body is not None]
        if not bodies:
            break
        if current is model:
            current = onnx.ModelProto()
            current.CopyFrom(model)
            current.opset_import.append(helper.make_opsetid(EXPAND_DOMAIN, 1))
        for i, body in bodies:
            node = current.graph.node[i]
            body.domain = EXPAND_DOMAIN
            body.name = f"{node.op_type}_{expanded}"
            node.domain = EXPAND_DOMAIN
            node.op_type = body.name
            current.functions.append(body)
            expanded += 1
        try:
            current = onnx.inliner.inline_local_functions(current)
        except Exception:  # noqa: BLE001
            return (model, 0) if expanded == len(bodies) else (current, expanded)
    return current, expanded
