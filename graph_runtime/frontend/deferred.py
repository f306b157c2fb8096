"""Deferred import: a model whose shape-deciding inputs arrive at run time, as one onnx_region node.

When every refusal of an import is an input that decides shapes (a Reshape's target, a TopK's
k, a Slice's starts...) computed at run time, the graph becomes the model's inputs feeding one
node calling `onnx_region` (lib/ops/onnx_region.py), its outputs of unknown size ("?"). The
inputs that reach a shape-deciding slot are its value inputs: create() specialises the graph
for their values (part of the cache key) and the region imports the model with them frozen,
through the usual converters.
"""
from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..graph.model import Graph, usable_output_names
from .ir import Unsupported
from .onnx_model import np_dtype

_SHAPE_READERS = frozenset({"Shape", "Size"})


def value_inputs(model: Any) -> list[str]:
    """Graph inputs that reach a slot deciding shapes or attributes (OpFacts.shape_inputs or
    value_inputs, registered with each op's converter), directly or through nodes computing it."""
    from .convert import op_facts
    uses: dict[str, list[tuple[Any, int]]] = {}
    for node in model.graph.node:
        for slot, name in enumerate(node.input):
            if name:
                uses.setdefault(name, []).append((node, slot))
    memo: dict[str, bool] = {}

    def reaches(name: str) -> bool:
        if name not in memo:
            memo[name] = False  # a graph has no cycles; this only guards the recursion
            memo[name] = any(
                slot in op_facts(node.op_type).shape_inputs
                or slot in op_facts(node.op_type).value_inputs or (
                    node.op_type not in _SHAPE_READERS
                    and any(reaches(out) for out in node.output if out))
                for node, slot in uses.get(name, []))
        return memo[name]

    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits and reaches(i.name)]


def deferred_documents(model: Any, shapes: Mapping[str, Sequence[int | str]],
                       types: Mapping[str, Any], description: str) -> dict[str, Any]:
    """{"graph": doc, "lib": doc, "params": {}} for the model as one onnx_region node.

    Raises Unsupported when an input's shape or an output's rank or dtype is not known.
    """
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    values = set(value_inputs(model))
    if not values:
        raise Unsupported("no graph input decides a shape; the constant is needed for data")
    nodes: list[dict[str, Any]] = []
    entry_shapes: list[list[Any]] = []
    dtypes: list[str] = []
    for inp in inputs:
        if inp.name not in shapes:
            raise Unsupported(f"input {inp.name!r} has no static shape")
        nodes.append({"op": "null", "name": inp.name, "inputs": []})
        entry_shapes.append([d if isinstance(d, str) else int(d) for d in shapes[inp.name]])
        dtypes.append(str(np_dtype(inp.type.tensor_type.elem_type)))
    out_shapes = []
    for out in model.graph.output:
        tp = types.get(out.name, out.type)
        tt = tp.tensor_type if tp.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape") or not tt.elem_type:
            raise Unsupported(f"output {out.name!r}: its rank or dtype is not known before run")
        out_shapes.append([int(d.dim_value) if d.HasField("dim_value") else "?"
                           for d in tt.shape.dim])
        dtypes.append(str(np_dtype(tt.elem_type)))
    outs = len(model.graph.output)
    nodes.append({"op": "tvm_op", "name": "onnx_region",
                  "inputs": [[k, 0, 0] for k in range(len(inputs))],
                  "attrs": {"func_name": "onnx_region", "num_inputs": str(len(inputs)),
                            "num_outputs": str(outs), "flatten_data": "0"}})
    # Every output is unknown until specialisation: "?" marks the graph symbolic.
    if not any(out_shapes):
        raise Unsupported("every output is a scalar: nothing marks the graph as specialised "
                          "per input value")
    entry_shapes += [["?"] * len(s) for s in out_shapes]
    graph = Graph.build(nodes, [[len(inputs), k, 0] for k in range(outs)], shapes=entry_shapes,
                        dtypes=dtypes,
                        output_names=usable_output_names([o.name for o in model.graph.output]))
    function = {"op": "onnx_region",
                "model": base64.b64encode(model.SerializeToString()).decode("ascii"),
                "value_inputs": [k for k, i in enumerate(inputs) if i.name in values]}
    lib = {"format": "graph_runtime.lib", "version": 1, "description": description,
           "functions": {"onnx_region": function}}
    return {"graph": graph.to_dict(), "lib": lib, "params": {}}


# A shape-deciding input (a Reshape target, Slice starts...) holds a few numbers; one declared
# larger is refused before anything is allocated for it.
MAX_VALUE_ELEMENTS = 1 << 16


def dtype_trial(model: Any, shapes: Mapping[str, Sequence[int]], name: str) -> None:
    """Lower the model with each value input frozen to ones: a refusal for a dtype (which no
    value changes) is raised now, at import, instead of at the first run."""
    import numpy as np
    from onnx import numpy_helper

    from ..errors import FrontendError
    from .lower import lower
    trial = type(model)()
    trial.CopyFrom(model)
    frozen = set(value_inputs(model))
    kept = [i for i in trial.graph.input if i.name not in frozen]
    for inp in trial.graph.input:
        if inp.name in frozen:
            size = math.prod(shapes[inp.name])
            if size > MAX_VALUE_ELEMENTS:
                raise FrontendError(
                    f"{name}: input {inp.name!r} decides shapes (its values are read on the host "
                    f"while specialising) but declares {size} elements; at most "
                    f"{MAX_VALUE_ELEMENTS} are accepted")
            ones = np.ones(shapes[inp.name], np_dtype(inp.type.tensor_type.elem_type))
            trial.graph.initializer.append(numpy_helper.from_array(ones, inp.name))
    del trial.graph.input[:]
    trial.graph.input.extend(kept)
    try:
        lower(trial, name, {k: v for k, v in shapes.items() if k not in frozen})
    except FrontendError as e:
        if "has dtype" in str(e):
            raise
