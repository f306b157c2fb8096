"""SegmentedGraphModule: create()'s module for a graph cut at data-dependent nodes (NonZero...).

It runs segment 0 (a static or symbolic module of its own), computes the cuts of level 0 on the
host, binds the sizes they produced and feeds their outputs to segment 1, specialised (and
cached, runtime/symbolic_module.py) for those sizes; and so on. What a run costs beyond the
nodes: one host copy of each cut's inputs, each cut on the host, one copy of each value that
crosses into a later segment (set_input), and a cache lookup per symbolic segment.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..device import Device, cpu
from ..errors import GraphError, GraphRuntimeError
from ..graph.model import Graph
from ..graph.symbolic import format_shape
from ..lib.library import Module
from ..lib.ops.data_dependent import HOST_FUNCTIONS
from ..nd import NDArray
from .graph_module import _copy_out
from .placement import resolve_entry_devices
from .segmented_diagnostics import SegmentedDiagnostics
from .segments import (CARRIER_PREFIX, Cut, Segment, bind_outputs, describe_cuts, plan_static,
                       split)
from .symbolic_module import HeldLock


class SegmentedGraphModule(SegmentedDiagnostics):
    """GraphModule's API over a graph with data-dependent nodes (see the module docstring)."""

    def __init__(self, graph: Graph, lib: Module, ctxs: Sequence[Device], cuts: Sequence[Cut], *,
                 strict: bool = False, memory_cap: Any = None, allow_uninitialized: bool = False,
                 cache_size: int | None = None, _from: SegmentedGraphModule | None = None
                 ) -> None:
        from .graph_module import create
        self.graph = graph
        self.lib = lib
        self.ctxs = list(ctxs)
        self.cuts = list(cuts)
        self.strict = strict
        self.memory_cap = memory_cap
        self.allow_uninitialized = allow_uninitialized
        self.cache_size = cache_size
        self.segments = _from.segments if _from is not None else split(graph, lib, self.cuts)
        self.modules: list[Any] = []
        for k, seg in enumerate(self.segments):
            if seg is None:
                self.modules.append(None)
            elif _from is not None:  # clone(): the same segment, params shared
                self.modules.append(_from.modules[k].clone())
            else:
                sub = plan_static(seg, resolve_entry_devices(seg.graph, self.ctxs, strict))
                self.modules.append(create(sub, lib, self.ctxs, strict=strict,
                                           memory_cap=memory_cap,
                                           allow_uninitialized=allow_uninitialized,
                                           cache_size=cache_size))
        self._entry_device = resolve_entry_devices(graph, self.ctxs, strict)
        self._inputs = dict(graph.input_entries)
        self._names = list(self._inputs)
        by_eid = {eid: name for name, eid in self._inputs.items()}
        arg_eids = set(by_eid)
        # Graph inputs by name -> (segment, its name there); the rest of a segment's inputs are
        # values crossing from an earlier segment or cut, fed on every run.
        self._routes: dict[str, list[tuple[int, str]]] = {n: [] for n in self._names}
        self._fed: list[list[tuple[str, int]]] = []
        for k, seg in enumerate(self.segments):
            fed = []
            for name, eid in (seg.inputs if seg is not None else ()):
                if eid in arg_eids:
                    self._routes[by_eid[eid]].append((k, name))
                else:
                    fed.append((name, eid))
            self._fed.append(fed)
        self._heads = [graph.entry_id(h[0], h[1]) for h in graph.heads]
        # Graph inputs a cut reads (or the graph returns as they are): kept as host copies.
        self._cut_inputs = {e for c in self.cuts for e in c.in_eids if e in arg_eids}
        self._cut_inputs.update(e for e in self._heads if e in arg_eids)
        self._held: dict[int, np.ndarray] = {}
        self._param_eids: set[int] = set()  # held values that are params (clone shares them)
        self._outputs: list[Any] | None = None
        self._cut_results: dict[int, list[np.ndarray]] = {}  # by cut nid, the last run's
        self.env: dict[str, int] = {}
        self._lock = threading.Lock()
        self._repeat = 1

    # ---- what the graph takes ------------------------------------------------------------------

    def describe_cuts(self) -> list[str]:
        """One line per cut: where the graph is cut and which sizes the data decides there."""
        return describe_cuts(self.graph, self.cuts)

    @property
    def signature(self) -> str:
        return "; ".join(f"{n}: {format_shape(self.graph.shape(e))} {self.graph.dtype(e)}"
                         for n, e in self._inputs.items())

    def get_num_inputs(self) -> int:
        return len(self._names)

    def get_num_outputs(self) -> int:
        return len(self._heads)

    def get_input_index(self, name: str) -> int:
        if name not in self._inputs:
            raise GraphError(f"graph has no input {name!r}; inputs are: {', '.join(self._names)}")
        return self._names.index(name)

    def get_input_info(self) -> tuple[dict[str, tuple[Any, ...]], dict[str, str]]:
        return ({n: tuple(self.graph.shape(e)) for n, e in self._inputs.items()},
                {n: self.graph.dtype(e) for n, e in self._inputs.items()})

    def get_output_info(self) -> tuple[list[tuple[Any, ...]], list[str]]:
        """(shape of each output, sizes the data decides as names; dtype of each output)."""
        return ([tuple(self.graph.shape(e)) for e in self._heads],
                [self.graph.dtype(e) for e in self._heads])

    # ---- inputs and params ---------------------------------------------------------------------

    def set_input(self, key: int | str | Mapping[str, Any] | None = None, value: Any = None,
                  **params: Any) -> None:
        """Set inputs by name or index; each goes to every segment (and cut) that reads it."""
        items: dict[str, Any] = dict(key) if isinstance(key, Mapping) else {}
        if key is not None and not isinstance(key, Mapping):
            name = self._names[key] if isinstance(key, int) and 0 <= key < len(self._names) \
                else key
            items[str(name)] = value
        items.update(params)
        for name, val in items.items():
            self.get_input_index(name)
            for k, there in self._routes[name]:
                self.modules[k].set_input(there, val)
            if self._inputs[name] in self._cut_inputs:
                self._held[self._inputs[name]] = _host(val)

    def get_input(self, key: int | str, out: Any = None) -> Any:
        """The value an input holds (from a segment that reads it, or the host copy a cut reads)."""
        name = self._names[key] if isinstance(key, int) and 0 <= key < len(self._names) else key
        self.get_input_index(str(name))
        for k, there in self._routes[str(name)]:
            return self.modules[k].get_input(there, out)
        held = self._held.get(self._inputs[str(name)])
        if held is None:
            raise GraphError(f"input {name!r} was never set")
        return NDArray(held.copy(), cpu(0)) if out is None else _copy_out(NDArray(held, cpu(0)),
                                                                          out)

    def load_params(self, params: bytes | bytearray | str | os.PathLike | Mapping[str, Any],
                    source: str | None = None) -> None:
        """Params (TVM blob, file or dict): each segment gets the ones it reads."""
        from ..params import load_param_arrays, load_params_file
        if isinstance(params, (bytes, bytearray, memoryview)):
            values: Mapping[str, Any] = load_param_arrays(bytes(params), source or "<params>")
        elif isinstance(params, (str, os.PathLike)):
            values = load_params_file(params)
        else:
            values = params
        mine: dict[int, dict[str, Any]] = {}
        for name, val in values.items():
            for k, there in self._routes.get(name, ()):
                mine.setdefault(k, {})[there] = val
        for k, params_k in mine.items():
            self.modules[k].load_params(params_k, source=source)
        for name, val in values.items():
            if self._inputs.get(name) in self._cut_inputs:
                self._held[self._inputs[name]] = _host(val)
                self._param_eids.add(self._inputs[name])

    def clone(self) -> SegmentedGraphModule:
        """A new module on the same graph, lib and devices with its own inputs, intermediates
        and outputs (each segment cloned), sharing this module's params zero copy."""
        other = SegmentedGraphModule(self.graph, self.lib, self.ctxs, self.cuts,
                                     strict=self.strict, memory_cap=self.memory_cap,
                                     allow_uninitialized=self.allow_uninitialized,
                                     cache_size=self.cache_size, _from=self)
        for eid in self._param_eids:
            other._held[eid] = self._held[eid]
        other._param_eids = set(self._param_eids)
        return other

    def share_params(self, other: SegmentedGraphModule, params_bytes: bytes) -> None:
        """Use other's param arrays (zero copy) for every name in params_bytes: each segment
        shares with the same segment of other (other: a module of the same graph)."""
        from ..params import load_param_arrays
        if not isinstance(other, SegmentedGraphModule) or other.segments is not self.segments \
                and other.graph.to_json() != self.graph.to_json():
            raise GraphError(f"share_params needs a SegmentedGraphModule of the same graph, got "
                             f"{type(other).__name__}")
        if not isinstance(params_bytes, (bytes, bytearray, memoryview)):
            raise GraphError(f"share_params needs the params as bytes (save_param_dict's "
                             f"output), got {type(params_bytes).__name__}")
        for name in load_param_arrays(bytes(params_bytes)):
            self.get_input_index(name)
            for k, there in self._routes[name]:
                self.modules[k]._share_input(other.modules[k], there)
            eid = self._inputs[name]
            if eid in other._param_eids:
                self._held[eid] = other._held[eid]
                self._param_eids.add(eid)

    # ---- running -------------------------------------------------------------------------------

    def run(self, **inputs: Any) -> None:
        """Run segment by segment; each cut's results bind the sizes of the next segment."""
        if inputs:
            self.set_input(inputs)
        with self._owned("run"):
            self._run()

    def _owned(self, what: str) -> Any:
        if not self._lock.acquire(False):
            raise GraphRuntimeError(f"SegmentedGraphModule.{what}() called while another thread "
                                    "is in it; use run_with(**inputs) or one module per thread "
                                    "(clone())")
        return HeldLock(self._lock)

    def _run(self, timer: Callable[[Cut, float], None] | None = None,
             runner: Callable[[int, Any], None] | None = None) -> None:
        """One run. runner(k, module) runs segment k's module in place of module.run() (a
        profile, a debug run); timer(cut, seconds) gets each cut's median of _repeat runs."""
        env: dict[str, int] = {}
        self.env = env
        values: dict[int, Any] = dict(self._held)
        for k, seg in enumerate(self.segments):
            if seg is not None:
                self._run_segment(k, seg, values, env, runner)
            for cut in self.cuts:
                if cut.level != k:
                    continue
                times = []
                for _ in range(self._repeat if timer is not None else 1):
                    start = time.perf_counter()
                    results = self._cut(cut, values)
                    times.append(time.perf_counter() - start)
                bind_outputs(cut, self.graph, results, env)
                values.update(zip(cut.out_eids, results))
                self._cut_results[cut.nid] = results
                if timer is not None:
                    timer(cut, sorted(times)[len(times) // 2])
        self._outputs = [values[e] for e in self._heads]

    def _cut(self, cut: Cut, values: Mapping[int, Any]) -> list[np.ndarray]:
        """The cut's outputs, computed on the host from its inputs' host copies."""
        missing = [e for e in cut.in_eids if e not in values]
        if missing:
            g = self.graph
            names = ", ".join(f"{g.nodes[g.entry_node(e)[0]].name!r} (eid {e})" for e in missing)
            raise GraphError(f"{g.source}: {cut.label} ({cut.op}) reads input {names}, never "
                             "set; set it with set_input/load_params (or run(name=value))")
        arrays = [_host(values[e]) for e in cut.in_eids]
        try:
            return [np.ascontiguousarray(r) for r in HOST_FUNCTIONS[cut.op](arrays, cut.attrs)]
        except GraphRuntimeError as e:
            raise GraphError(f"{cut.label} ({cut.op}): {e}") from e

    def _run_segment(self, k: int, seg: Segment, values: dict[int, Any], env: Mapping[str, int],
                     runner: Callable[[int, Any], None] | None) -> None:
        module = self.modules[k]
        for name, eid in self._fed[k]:
            module.set_input(name, values[eid])
        for name in seg.carriers:
            if name not in env:
                raise GraphError(f"{self.graph.source}: segment {k} needs the size {name!r}, "
                                 "which no cut before it binds")
            module.set_input(CARRIER_PREFIX + name, np.empty((env[name], 0), np.int8))
        if runner is None:
            module.run()
        else:
            runner(k, module)
        for i, eid in enumerate(seg.outputs):
            values[eid] = module.get_output(i)

    def run_with(self, **inputs: Any) -> list[np.ndarray]:
        """set_input + run + host copies of every output, atomically (callers wait their turn)."""
        with self._lock:
            if inputs:
                self.set_input(inputs)
            self._run()
            return [self._output(i).numpy() for i in range(len(self._heads))]

    def get_output(self, index: int | str, out: Any = None) -> Any:
        """Output index (or name) of the last run."""
        value = self._output(index)
        return _copy_out(value, out) if out is not None else value

    def get_output_index(self, name: str) -> int:
        """Index of the output called name (declared, else its head node's name)."""
        if not isinstance(name, str):
            raise GraphError(f"get_output_index needs an output name (a str), got "
                             f"{type(name).__name__} {name!r}")
        return self.graph.output_index(name)

    def _output(self, key: int | str) -> NDArray:
        index = self.graph.output_index(key)
        if self._outputs is None:
            raise GraphError("get_output: nothing has run yet (a graph cut at data-dependent "
                             "nodes learns its output sizes by running)")
        value = self._outputs[index]
        return value if isinstance(value, NDArray) else NDArray(value, cpu(0))


def _host(value: Any) -> np.ndarray:
    if isinstance(value, NDArray):
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        from ..nd import from_dlpack
        return from_dlpack(value).numpy()
    return np.asarray(value)
