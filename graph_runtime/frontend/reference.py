"""Reference data for an imported model: seeded inputs and ONNX Runtime's outputs for them."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import FrontendError
from .importer import ImportResult

# Ops an integer input passes through unchanged on its way to a Gather's indices.
_PASS_THROUGH = frozenset({"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity"})


def index_bounds(model: Any) -> dict[str, int]:
    """Per graph input that ends up as Gather indices: the size of the axis it indexes."""
    from .inference import inferred_types, static_specs
    graph = model.graph
    known = {t.name: tuple(t.dims) for t in graph.initializer}
    for name, (shape, _) in static_specs(inferred_types(model, {})).items():
        known.setdefault(name, shape)
    for inp in graph.input:
        dims = inp.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            known.setdefault(inp.name, tuple(d.dim_value for d in dims))
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, i))
    bounds: dict[str, int] = {}
    for inp in graph.input:
        frontier, seen = [inp.name], set()
        while frontier:
            name = frontier.pop()
            if name in seen:
                continue
            seen.add(name)
            for node, i in readers.get(name, []):
                if node.op_type in _PASS_THROUGH and i == 0:
                    frontier.extend(node.output)
                elif node.op_type == "Gather" and i == 1 and node.input[0] in known:
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    size = known[node.input[0]][axis]
                    bounds[inp.name] = min(bounds.get(inp.name, size), size)
    return bounds


def reference_inputs(result: ImportResult, model: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: normal floats, ints within what they index (else 0/1), random bools."""
    graph = __import__("json").loads(result.graph_json)
    shapes = graph["attrs"]["shape"][1]
    dtypes = graph["attrs"]["dltype"][1]
    bounds = index_bounds(model)
    rng = np.random.default_rng(seed)
    inputs: dict[str, np.ndarray] = {}
    for nid, node in enumerate(graph["nodes"]):
        if node["name"] not in result.input_names:
            continue
        shape, dtype = tuple(shapes[nid]), dtypes[nid]
        kind = np.dtype(dtype).kind
        if kind == "f":
            value = rng.standard_normal(shape).astype(dtype)
        elif kind in "iu":
            value = rng.integers(0, bounds.get(node["name"], 2), size=shape).astype(dtype)
        else:
            value = rng.integers(0, 2, size=shape).astype(dtype)
        inputs[node["name"]] = value
    return inputs


def onnxruntime_outputs(model: Any, inputs: Mapping[str, np.ndarray], names: Sequence[str]
                        ) -> list[np.ndarray]:
    """ONNX Runtime's outputs for inputs.

    model is the proto load_model gave, its external data already read from the model's folder
    only, so ONNX Runtime gets bytes and opens no file itself.
    """
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise FrontendError("--reference needs onnxruntime: pip install onnxruntime") from e
    try:
        source = model.SerializeToString()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        return [np.asarray(v) for v in session.run(list(names), dict(inputs))]
    except Exception as e:
        raise FrontendError(f"ONNX Runtime could not run the model: {type(e).__name__}: "
                            f"{e}") from e
