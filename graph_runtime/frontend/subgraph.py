"""A control-flow node's sub-graph as an ONNX model of its own, its outer-scope reads made inputs.

An If branch, a Loop body or a Scan body reads values of the graphs around it by name (ONNX's
implicit inputs). The control-flow kernels (lib/ops/control_flow.py) import each sub-graph as a
model like any other, so those reads must become explicit: a small constant known at import is
embedded as an initializer (it folds inside the body), anything else becomes a model input fed
by the node. The body's formal inputs get the static types the node's inputs have.
"""
from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .ir import Unsupported, Value

# Outer constants up to this many elements are embedded in a body; larger ones (weights) are
# passed as node inputs, so lib.json does not hold a second copy of them.
EMBED_ELEMENTS = 4096


def free_names(graph: Any) -> list[str]:
    """Names a graph (and the graphs nested in it) reads but does not define, in read order."""
    defined = {i.name for i in graph.input}
    defined.update(t.name for t in graph.initializer)
    defined.update(s.values.name for s in graph.sparse_initializer)
    free: dict[str, None] = {}
    for node in graph.node:
        reads = [n for n in node.input if n]
        for attr in node.attribute:
            if attr.HasField("g"):
                reads += free_names(attr.g)
            for g in attr.graphs:
                reads += free_names(g)
        for name in reads:
            if name not in defined:
                free.setdefault(name, None)
        defined.update(o for o in node.output if o)
    return list(free)


def outer_reads(graphs: Sequence[Any], scope: Mapping[str, Value | None],
                where: str) -> tuple[list[str], dict[str, np.ndarray]]:
    """(names fed as node inputs, {name: array} embedded) for what the graphs read outside.

    Raises Unsupported naming a read that the outer graph could not import.
    """
    fed: list[str] = []
    embedded: dict[str, np.ndarray] = {}
    for graph in graphs:
        for name in free_names(graph):
            if name in fed or name in embedded:
                continue
            value = scope.get(name)
            if value is None:
                raise Unsupported(f"{where} reads outer value {name!r}, which is "
                                  + ("not defined" if name not in scope else "itself refused"))
            # A value holding symbolic dims is fed (a dim_values node makes it per shape).
            if value.const is not None and value.const.size <= EMBED_ELEMENTS \
                    and value.const.dtype != object:
                embedded[name] = value.const
            else:
                fed.append(name)
    return fed, embedded


def body_model(graph: Any, parent: Any, formal: Sequence[Value | tuple[tuple[int, ...], str]],
               fed: Mapping[str, Value], embedded: Mapping[str, np.ndarray]) -> str:
    """The sub-graph as a model (base64 of its bytes) whose inputs are its formal inputs (typed
    as given: Values or (shape, dtype)), then the fed outer values by their ONNX names; embedded
    ones initializers."""
    import onnx
    from onnx import helper, numpy_helper
    for out in graph.output:
        kind = out.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            raise Unsupported(f"sub-graph {graph.name!r} output {out.name!r} is of "
                              f"{kind.replace('_type', '')} type; only tensors are supported")
    if len(formal) != len(graph.input):
        raise Unsupported(f"sub-graph {graph.name!r} declares {len(graph.input)} inputs; "
                          f"the node gives it {len(formal)}")
    body = onnx.GraphProto()
    body.CopyFrom(graph)
    del body.input[:]
    # NOTE: inputs keep their rank only: the body is imported for the node's input shapes at
    # create(), and a model text that holds no sizes stays the same across symbolic probes.
    for info, spec in zip(graph.input, formal):
        shape, dtype = (spec.shape, spec.dtype) if isinstance(spec, Value) else spec
        body.input.append(helper.make_tensor_value_info(info.name, _elem_type(dtype, info.name),
                                                        [None] * len(shape)))
    for value_name, value in fed.items():
        body.input.append(helper.make_tensor_value_info(
            value_name, _elem_type(value.dtype, value_name), [None] * len(value.shape)))
    for name, array in embedded.items():
        body.initializer.append(numpy_helper.from_array(np.asarray(array), name))
    # Outputs keep their names only: the body's import infers their types for these inputs.
    outputs = list(graph.output)
    del body.output[:]
    for out in outputs:
        kept = body.output.add()
        kept.CopyFrom(out)
        if kept.type.HasField("tensor_type"):
            kept.type.tensor_type.ClearField("shape")
    model = helper.make_model(body, opset_imports=list(parent.opset_import),
                              ir_version=parent.ir_version)
    model.functions.extend(parent.functions)
    return base64.b64encode(model.SerializeToString()).decode("ascii")


def fed_values(names: Sequence[str], scope: Mapping[str, Value | None]) -> dict[str, Value]:
    """The Values of the fed outer names by name (outer_reads checked they exist)."""
    return {n: scope[n] for n in names}  # type: ignore[misc]


def _elem_type(dtype: str, name: str) -> int:
    from onnx import helper
    try:
        return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except (TypeError, KeyError, ValueError) as e:
        raise Unsupported(f"value {name!r} of dtype {dtype} cannot enter a sub-graph") from e
