"""The sub-graph builder kernels are handed: import a model, create it on a device, infer specs.

Control-flow bodies (If, Loop, Scan) and deferred regions are ONNX models their kernels import
and create at prepare time. Those are the frontend's, planner's and runtime's jobs, which sit
above the kernel library, so this module, above all three, installs them into
lib/subgraph_module.py when the package is imported (graph_runtime/__init__.py).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .device import Device, cpu
from .lib.subgraph_module import SubgraphBuilder, install_builder


def import_model(model: Any, shapes: Mapping[str, Sequence[int]], name: str,
                 freeze: bool) -> tuple[str, Any, dict[str, np.ndarray]]:
    """(graph_json, lib Module, params) of an ONNX model imported for these input shapes."""
    from .frontend import import_onnx
    result = import_onnx(model, shapes, name=name, freeze=freeze)
    return result.graph_json, result.module(), result.params


def create_on(graph_json: str, lib: Any, dev: Device) -> Any:
    """create() on dev; nodes whose function lib lacks there run on the CPU, with the copies
    the planner inserts (its fallback rule), so a body runs wherever its node is placed."""
    from .graph.model import COPY_OP, NOP_OP, Graph
    from .runtime.graph_module import create
    graph = Graph.from_json(graph_json)
    host = cpu(0)
    missing = [n for n in graph.nodes if not n.is_arg and n.func_name not in (COPY_OP, NOP_OP)
               and not lib.has_function(n.func_name or "", dev)]
    if dev == host or not missing or graph.is_symbolic:
        return create(graph, lib, [dev])
    from .planner.constraints import Placement
    from .planner.plan import plan_graph
    from .planner.virtual_device import VirtualDevice
    placement = Placement(default_device=VirtualDevice.from_device(host),
                          node_devices={"*": VirtualDevice.from_device(dev)})
    return create(plan_graph(graph, placement, lib).graph, lib, [dev, host])


def inferred_specs(model: Any, shapes: Mapping[str, Sequence[int]],
                   name: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """{value name: (shape, dtype)} for the values ONNX shape inference gives static shapes."""
    from .frontend.inference import inferred_types, static_specs
    from .frontend.onnx_model import np_dtype
    known = static_specs(inferred_types(model, shapes, name))
    return {n: (tuple(int(d) for d in shape), np_dtype(elem))
            for n, (shape, elem) in known.items()}


def install() -> None:
    """Hand the kernel library this module's builder."""
    install_builder(SubgraphBuilder(import_model, create_on, inferred_specs))
