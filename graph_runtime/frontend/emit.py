"""Emission: the fused groups as TVM graph JSON (planned storage), a lib.json document, params."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..device import cpu
from ..errors import FrontendError, GraphError, LibraryError
from ..graph.model import Graph, entry_bytes, usable_output_names
from ..lib.library import TensorSpec
from ..lib.loader import function_from_json
from ..graph.storage_plan import plan_storage
from .fusion.fuse_ops import Group, base_name, function_doc, fuse
from ..graph.symbolic import shape_is_symbolic
from .ir import Prim, Value
from .symdim import dim_text, has_sym, to_json
from .lower import Lowered

_SMALL = 64  # constants with at most this many elements are shared when equal


@dataclass
class Emitted:
    """What the import writes, plus what its summary reports."""

    graph_doc: dict[str, Any]
    lib_doc: dict[str, Any]
    params: dict[str, np.ndarray]
    groups: list[Group]
    func_names: list[str]


def _live_prims(prims: list[Prim], outputs: list[Value]) -> list[Prim]:
    needed = {id(v) for v in outputs}
    live = []
    for p in reversed(prims):
        if any(id(v) in needed for v in p.outputs):
            live.append(p)
            needed.update(id(v) for v in p.inputs)
    return live[::-1]


def _safe(name: str) -> str:
    base = name.split("#")[0] or "param"
    base = re.sub(r"[^A-Za-z0-9_.]", "_", base)
    return base if base[0].isalpha() or base[0] == "_" else "p_" + base


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        taken.add(name)
        return name
    k = 1
    while f"{name}_{k}" in taken:
        k += 1
    taken.add(f"{name}_{k}")
    return f"{name}_{k}"


def emit(lowered: Lowered, description: str) -> Emitted:
    b = lowered.builder
    b.origin = "output"
    outputs: list[Value] = []
    seen: set[int] = set()
    for v in lowered.outputs:
        # An output must be an entry the graph writes: copy inputs, constants and repeats.
        if v.is_input or v.const is not None or id(v) in seen:
            v = b.copy(v)
        seen.add(id(v))
        outputs.append(v)
    prims = _live_prims(b.prims, outputs)
    groups = fuse(prims, outputs)
    position = {id(p): i for i, p in enumerate(prims)}
    groups.sort(key=lambda g: position[id(g.prims[-1])])

    nodes: list[dict[str, Any]] = []
    specs: list[tuple[tuple[int, ...], str]] = []
    entry: dict[int, int] = {}  # id(value) -> nid (one-output null nodes and group outputs)
    taken: set[str] = set()
    for v in lowered.inputs:
        entry[id(v)] = len(nodes)
        taken.add(v.name)
        nodes.append({"op": "null", "name": v.name, "inputs": []})
        specs.append((v.shape, v.dtype))
    params: dict[str, np.ndarray] = {}
    shared: dict[tuple, int] = {}

    def param_of(v: Value) -> int:
        assert v.const is not None
        array = np.array(v.const, order="C")  # ascontiguousarray would make a 0-d array 1-d
        key = None
        if array.size <= _SMALL:
            key = (array.dtype.str, array.shape, array.tobytes())
            if key in shared:
                entry[id(v)] = shared[key]
                return shared[key]
        name = _unique(_safe(v.name), taken)
        params[name] = array
        nid = len(nodes)
        nodes.append({"op": "null", "name": name, "inputs": []})
        specs.append((tuple(array.shape), str(array.dtype)))
        entry[id(v)] = nid
        if key is not None:
            shared[key] = nid
        return nid

    for g in groups:
        for v in g.inputs():
            if id(v) not in entry and v.const is not None:
                param_of(v)

    func_names: list[str] = []
    lib_functions: dict[str, Any] = {}
    by_key: dict[str, str] = {}
    counts: dict[str, int] = {}
    out_entry: dict[int, tuple[int, int]] = {v_id: (nid, 0) for v_id, nid in entry.items()}
    for g in groups:
        doc = to_json(function_doc(g))
        key = json.dumps(doc, sort_keys=True)
        name = by_key.get(key)
        if name is None:
            base = base_name(g)
            k = counts.get(base, 0)
            counts[base] = k + 1
            name = base if k == 0 else f"{base}_{k}"
            by_key[key] = name
            lib_functions[name] = doc
        func_names.append(name)
        ins = [list(out_entry[id(v)]) + [0] for v in g.inputs()]
        nid = len(nodes)
        nodes.append({"op": "tvm_op", "name": name, "inputs": ins,
                      "attrs": {"func_name": name, "num_inputs": str(len(ins)),
                                "num_outputs": str(len(g.outputs)), "flatten_data": "0"}})
        for k, v in enumerate(g.outputs):
            out_entry[id(v)] = (nid, k)
            specs.append((v.shape, v.dtype))
    heads = [list(out_entry[id(v)]) + [0] for v in outputs]

    symbolic = any(has_sym(shape) for shape, _ in specs)
    specs = [(tuple(dim_text(d) for d in shape), dtype) for shape, dtype in specs]
    graph = _graph(nodes, heads, specs, usable_output_names(lowered.output_names))
    graph_doc = graph.to_dict()
    lib_doc = {"format": "graph_runtime.lib", "version": 1, "description": description,
               "functions": lib_functions}
    if not symbolic:  # a symbolic graph's calls are checked per shape, when specialised
        _verify(graph, lib_functions)
    return Emitted(graph_doc, lib_doc, params, groups, func_names)


def _graph(nodes: list[dict[str, Any]], heads: list[list[int]],
           specs: list[tuple[tuple[int, ...], str]], output_names: list[str] | None) -> Graph:
    """The graph through Graph.build, with its storage planned by liveness on the CPU and the
    model's output names kept (metadata.output_names, docs/output_names.md)."""
    try:
        graph = Graph.build(nodes, heads, shapes=[shape for shape, _ in specs],
                            dtypes=[dtype for _, dtype in specs], output_names=output_names)
        # Symbolic entries count 0 B: storage is planned again per specialisation.
        sizes = [0 if shape_is_symbolic(shape) else entry_bytes(shape, dtype)
                 for shape, dtype in specs]
        plan = plan_storage(graph, sizes, [cpu(0)] * len(specs))
        return graph.with_columns(storage_id=plan.storage_ids)
    except GraphError as e:
        raise FrontendError(f"internal error: the emitted graph is not valid: {e}") from e


def _verify(graph: Graph, functions: dict[str, Any]) -> None:
    """Every call's chain, as lib.json will load it, gives the specs the graph declares."""
    chains = {name: function_from_json(name, doc) for name, doc in functions.items()}
    for node in graph.nodes:
        if node.is_arg:
            continue
        nid = node.nid
        name = node.func_name or ""
        inputs = [_spec(graph, graph.entry_id(ref[0], ref[1])) for ref in node.inputs]
        declared = [_spec(graph, eid) for eid in graph.node_entries(nid)]
        try:
            got = chains[name].infer(inputs)
        except LibraryError as e:
            raise FrontendError(f"internal error: function {name} (node {nid}) does not accept "
                                f"its inputs: {e}") from e
        if [(tuple(g.shape), g.dtype) for g in got] != \
                [(tuple(d.shape), d.dtype) for d in declared]:
            raise FrontendError(f"internal error: function {name} (node {nid}) gives {got}, "
                                f"the graph declares {declared}")


def _spec(graph: Graph, eid: int) -> TensorSpec:
    return TensorSpec(graph.shape(eid), graph.dtype(eid))
