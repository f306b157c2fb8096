"""A control-flow sub-graph (an ONNX model, base64) imported and created as a module of its own.

The body of an If, Loop or Scan is imported like any model (the usual converters, folding,
fusion) for the static specs its inputs have, and created on the node's device, so its ops run
where the node runs. A body whose own shapes depend on values it computes (a Slice started at
the iteration number) imports deferred (frontend/deferred.py) and specialises per value like any
such model. Imports are cached per (model, input specs), least recently used dropped first;
each kernel creates its own module from one.

Importing and creating a module are the layers above's jobs (frontend, planner, runtime): as
ONNX Runtime hands an If/Loop kernel its subgraph's session, they hand this module a
SubgraphBuilder (graph_runtime/subgraphs.py installs it when the package is imported), so the
kernel library imports none of them.
"""
from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._lru import LruCache
from ..device import Device
from ..errors import GraphRuntimeError, LibraryError
from ..nd import NDArray
from .library import TensorSpec

CACHE_SIZE = 32
_cache: LruCache[Imported] = LruCache(CACHE_SIZE)


@dataclass(frozen=True)
class SubgraphBuilder:
    """What the layers above give kernels that run a model of their own.

    import_model(model, shapes, name, freeze) -> (graph_json, lib Module, params);
    create_on(graph_json, lib, device) -> a module whose nodes the device lacks run on the CPU;
    inferred_specs(model, shapes, name) -> {output name: (shape, dtype)} ONNX inference knows.
    """

    import_model: Callable[..., tuple[str, Any, dict[str, np.ndarray]]]
    create_on: Callable[[str, Any, Device], Any]
    inferred_specs: Callable[..., dict[str, tuple[tuple[int, ...], str]]]


_builder: SubgraphBuilder | None = None


def install_builder(builder: SubgraphBuilder) -> None:
    """Set the builder kernels use (graph_runtime/subgraphs.py, at package import)."""
    global _builder
    _builder = builder


def builder() -> SubgraphBuilder:
    """The installed builder; LibraryError when none is (the package was not imported whole)."""
    if _builder is None:
        raise LibraryError("no sub-graph builder is installed: import graph_runtime (its "
                           "__init__ installs graph_runtime.subgraphs) before running sub-graphs")
    return _builder


@dataclass(frozen=True)
class Imported:
    """A body imported for one set of input specs: what create() takes, its input names (the
    node's order) and output specs (None where a deferred body's shape is known only when it
    runs)."""

    graph_json: str
    lib: Any
    params: dict[str, np.ndarray]
    input_names: list[str]
    output_specs: list[TensorSpec | None]


@dataclass
class SubModule:
    """A body created on one device for one node: kernels never share one (each GraphModule,
    clones included, runs its own)."""

    module: Any
    input_names: list[str]
    device: Device

    def feed(self, index: int, native: Any) -> None:
        """Copy a native array of the node's device into body input index."""
        self.module.set_input(self.input_names[index], NDArray(native, self.device))

    def feed_host(self, index: int, array: np.ndarray) -> None:
        self.module.set_input(self.input_names[index], array)

    def read(self, index: int, native: Any) -> None:
        """Copy body output index into a native array of the node's device."""
        self.module.get_output(index, out=NDArray(native, self.device))

    def read_host(self, index: int) -> np.ndarray:
        return np.asarray(self.module.get_output(index).numpy())


def body_import(op: str, model_b64: str, inputs: Sequence[TensorSpec]) -> Imported:
    """The body imported for these input specs (cached); LibraryError naming op."""
    key = (model_b64, tuple((tuple(s.shape), s.dtype) for s in inputs))
    return _cache.get_or_build(key, lambda: _import(op, model_b64, inputs))


def sub_module(op: str, model_b64: str, inputs: Sequence[TensorSpec], dev: Device) -> SubModule:
    """A new module of the body for these input specs on dev; LibraryError naming op."""
    imported = body_import(op, model_b64, inputs)
    try:
        module = create_on(imported.graph_json, imported.lib, dev)
        if imported.params:
            module.load_params(imported.params)
    except GraphRuntimeError as e:
        raise LibraryError(f"{op}: its sub-graph on {dev}, for inputs {_specs_text(inputs)}: "
                           f"{e}") from e
    return SubModule(module, imported.input_names, dev)


def _import(op: str, model_b64: str, inputs: Sequence[TensorSpec]) -> Imported:
    import onnx

    from ..graph.model import Graph
    model = onnx.ModelProto()
    model.ParseFromString(base64.b64decode(model_b64))
    names = [i.name for i in model.graph.input]
    if len(names) != len(inputs):
        raise LibraryError(f"{op}: its sub-graph {model.graph.name!r} takes {len(names)} inputs; "
                           f"the node gives {len(inputs)}")
    shapes = {n: list(s.shape) for n, s in zip(names, inputs)}
    where = f"{op} sub-graph {model.graph.name!r}"
    try:
        graph_json, lib, params = builder().import_model(model, shapes, where, False)
        specs = _output_specs(Graph.from_json(graph_json), model, shapes, where)
    except GraphRuntimeError as e:
        raise LibraryError(f"{where}, for inputs {_specs_text(inputs)}: {e}") from e
    return Imported(graph_json, lib, params, names, specs)


def create_on(graph_json: str, lib: Any, dev: Device) -> Any:
    """create() on dev through the installed builder (nodes dev lacks run on the CPU)."""
    return builder().create_on(graph_json, lib, dev)


def _output_specs(graph: Any, model: Any, shapes: Mapping[str, Sequence[int]],
                  where: str) -> list[TensorSpec | None]:
    specs: list[TensorSpec | None] = []
    for eid in graph.output_entries:
        shape = tuple(graph.shape(eid))
        if all(isinstance(d, int) for d in shape):
            specs.append(TensorSpec(tuple(int(d) for d in shape), graph.dtype(eid)))
        else:
            specs.append(None)
    if any(s is None for s in specs):
        # A deferred body: ONNX shape inference may still know its outputs' shapes.
        known = builder().inferred_specs(model, shapes, where)
        for k, out in enumerate(model.graph.output):
            if specs[k] is None and out.name in known:
                shape, dtype = known[out.name]
                specs[k] = TensorSpec(tuple(int(d) for d in shape), dtype)
    return specs


def _specs_text(inputs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{tuple(s.shape)} {s.dtype}" for s in inputs) or "none"


def row(native: Any, index: tuple[int, ...]) -> Any:
    """The sub-array native[index] as a view (a 0-d view, not a scalar, for a 1-D numpy array)."""
    if isinstance(native, np.ndarray):
        return native[index + (Ellipsis,)]
    return native[index]
