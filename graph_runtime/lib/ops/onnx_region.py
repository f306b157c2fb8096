"""onnx_region: an ONNX (sub)model whose shapes depend on input values, imported per value set.

A node calling it holds the model (attr `model`, base64 of its bytes). The inputs at the
positions `value_inputs` decide shapes (a Reshape's target, a TopK's k, a Slice's starts...):
while a graph specialises (runtime/specialize.py), their host values arrive under VALUES_KEY;
the model is then imported with those values frozen as initializers (the usual converters,
static shapes) and created on the node's device (functions it lacks there run on the CPU:
the sub-graph builder's create_on). That static module is cached per (input specs, values, device);
each run feeds it the other inputs and copies its outputs out.
"""
from __future__ import annotations

import base64
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..._lru import LruCache
from ...backends.base import Backend
from ..attrs import op_error
from ..library import TensorSpec
from ..prepared import HoldsModules
from ..registry import VALUES_KEY, define_op, kernel

# Static sub-modules kept (least recently used dropped first).
CACHE_SIZE = 32
_cache: LruCache[tuple[Any, list[str]]] = LruCache(CACHE_SIZE)


def value_positions(attrs: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(int(p) for p in attrs.get("value_inputs", ()))


def _values(attrs: Mapping[str, Any]) -> Mapping[int, np.ndarray]:
    values = attrs.get(VALUES_KEY)
    if not isinstance(values, Mapping):
        raise op_error("onnx_region", f"the values of inputs {list(value_positions(attrs))} "
                                      "decide its shapes and were not given; a graph calling "
                                      "it must be specialised for them (create() does)")
    return values


def _key(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any], device: Any) -> tuple:
    values = _values(attrs)
    return (attrs["model"], tuple((tuple(s.shape), s.dtype) for s in inputs),
            tuple((p, values[p].dtype.str, values[p].shape, values[p].tobytes())
                  for p in sorted(values)), str(device))


def region_module(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
                  device: Any) -> tuple[Any, list[str]]:
    """(static GraphModule of the model for these input specs and values, the model's input
    names in order), cached."""
    return _cache.get_or_build(_key(inputs, attrs, device),
                               lambda: _build(inputs, attrs, device))


def _build(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
           device: Any) -> tuple[Any, list[str]]:
    import onnx
    from onnx import numpy_helper

    from ...errors import GraphRuntimeError
    from ..subgraph_module import builder
    model = onnx.ModelProto()
    model.ParseFromString(base64.b64decode(attrs["model"]))
    values = _values(attrs)
    names = [i.name for i in model.graph.input]
    frozen = {names[p] for p in values}
    kept = [i for i in model.graph.input if i.name not in frozen]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for p, array in values.items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(array), names[p]))
    shapes = {names[k]: list(s.shape) for k, s in enumerate(inputs) if names[k] not in frozen}
    try:
        graph_json, lib, params = builder().import_model(model, shapes, "onnx_region", True)
        module = builder().create_on(graph_json, lib, device)
    except GraphRuntimeError as e:
        raise op_error("onnx_region", f"for input values {_shown(values)}: {e}") from e
    if params:
        module.load_params(params)
    return module, names  # the outer node's input k is the model's input names[k]


def _shown(values: Mapping[int, np.ndarray]) -> str:
    return ", ".join(f"input {p} = {np.asarray(v).reshape(-1)[:8].tolist()}"
                     for p, v in sorted(values.items()))


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    from ...device import cpu
    module, _ = region_module(inputs, attrs, cpu(0))
    g = module.graph
    return [TensorSpec(tuple(int(d) for d in g.shape(eid)), g.dtype(eid))
            for eid in g.output_entries]


def _region_kernel(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                   outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ...device import device
    module, names = region_module(inputs, attrs, device(backend.name, device_id))
    positions = set(_values(attrs))
    feeds = [(k, n) for k, n in enumerate(names) if k not in positions]
    n_in = len(inputs)

    def run(*arrays: Any) -> None:
        # NOTE: inputs and outputs pass through the host: the sub-module owns its own storage.
        for k, name in feeds:
            module.set_input(name, backend.to_host(arrays[k]))
        module.run()
        for i, out in enumerate(arrays[n_in:]):
            # NOTE: ascontiguousarray would make a 0-d output 1-d.
            backend.from_host(np.asarray(module.get_output(i).numpy(), order="C"), out)
    return HoldsModules(run, [module])


define_op("onnx_region", _infer, None, ("model", "value_inputs"), value_inputs=value_positions)
for _backend in ("cpu", "cuda", "opencl"):
    kernel("onnx_region", _backend)(_region_kernel)
