"""SegmentedGraphModule: create()'s module for a graph cut at data-dependent nodes (NonZero...).

It runs segment 0 (a static or symbolic module of its own), computes the cuts of level 0 on the
host, binds the sizes they produced and feeds their outputs to segment 1, specialised (and
cached, runtime/symbolic_module.py) for those sizes; and so on. What a run costs beyond the
nodes: one host copy of each cut's inputs, each cut on the host, one copy of each value that
crosses into a later segment (set_input), and a cache lookup per symbolic segment.
Its diagnostics speak of whole-graph node ids, for the segments the last run used.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..device import Device, cpu
from ..errors import GraphError, GraphRuntimeError
from ..graph.model import Graph
from ..graph.symbolic import format_shape
from ..lib.library import Module
from ..lib.registry import HostFn, get_op
from ..nd import NDArray
from .executor import NodeTime
from .graph_module import GraphModule
from .measure import add_bytes
from .module_base import ModuleBase, copy_out
from .placement import resolve_entry_devices
from .segments import (CARRIER_PREFIX, Cut, Segment, bind_outputs, describe_cuts, plan_static,
                       split)


class SegmentedGraphModule(ModuleBase):
    """ModuleBase's API over a graph with data-dependent nodes (see the module docstring)."""

    _share_peer = "of the same graph"

    def __init__(self, graph: Graph, lib: Module, ctxs: Sequence[Device], cuts: Sequence[Cut], *,
                 strict: bool = False, memory_cap: Any = None, allow_uninitialized: bool = False,
                 cache_size: int | None = None, _from: SegmentedGraphModule | None = None
                 ) -> None:
        from .graph_module import create
        super().__init__(graph, lib, ctxs, strict=strict, memory_cap=memory_cap,
                         allow_uninitialized=allow_uninitialized)
        self.cuts = list(cuts)
        self.cache_size = cache_size
        self.segments: list[Segment | None] = (
            _from.segments if _from is not None else split(graph, lib, self.cuts))
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
        # Graph inputs a cut reads (or the graph returns as they are): kept as host copies.
        self._cut_inputs = {e for c in self.cuts for e in c.in_eids if e in arg_eids}
        self._cut_inputs.update(e for e in self._output_eids if e in arg_eids)
        self._held: dict[int, np.ndarray] = {}
        self._param_eids: set[int] = set()  # held values that are params (clone shares them)
        self._outputs: list[Any] | None = None
        self._cut_results: dict[int, list[np.ndarray]] = {}  # by cut nid, the last run's
        self.env: dict[str, int] = {}
        self._repeat = 1

    def describe_cuts(self) -> list[str]:
        """One line per cut: where the graph is cut and which sizes the data decides there."""
        return describe_cuts(self.graph, self.cuts)

    @property
    def signature(self) -> str:
        return "; ".join(f"{n}: {format_shape(self.graph.shape(e))} {self.graph.dtype(e)}"
                         for n, e in self._inputs.items())

    def _clone(self) -> SegmentedGraphModule:
        """Each segment cloned."""
        other = SegmentedGraphModule(self.graph, self.lib, self.ctxs, self.cuts,
                                     strict=self.strict, memory_cap=self.memory_cap,
                                     allow_uninitialized=self.allow_uninitialized,
                                     cache_size=self.cache_size, _from=self)
        for eid in self._param_eids:
            other._held[eid] = self._held[eid]
        other._param_eids = set(self._param_eids)
        return other

    # ---- inputs and params ---------------------------------------------------------------------

    def _set_one(self, index: int, value: Any) -> None:
        """Each input goes to every segment (and cut) that reads it."""
        name = self._names[index]
        for k, there in self._routes[name]:
            self.modules[k].set_input(there, value)
        if self._inputs[name] in self._cut_inputs:
            self._held[self._inputs[name]] = _host(value)

    def _get_input_at(self, index: int, out: Any) -> Any:
        """The value from a segment that reads the input, or the host copy a cut reads."""
        name = self._names[index]
        for k, there in self._routes[name]:
            return self.modules[k].get_input(there, out)
        held = self._held.get(self._inputs[name])
        if held is None:
            raise GraphError(f"input {name!r} was never set")
        return NDArray(held.copy(), cpu(0)) if out is None else copy_out(NDArray(held, cpu(0)),
                                                                         out)

    def _load_values(self, values: Mapping[str, Any], source: str) -> None:
        """Each segment gets the params it reads."""
        mine: dict[int, dict[str, Any]] = {}
        for name, val in values.items():
            for k, there in self._routes.get(name, ()):
                mine.setdefault(k, {})[there] = val
        for k, params_k in mine.items():
            self.modules[k].load_params(params_k, source=source)
        for name, val in values.items():
            if self._inputs.get(name) in self._cut_inputs:
                # a copy: a params file's arrays are views of the file (load_params_file)
                self._held[self._inputs[name]] = np.array(_host(val))
                self._param_eids.add(self._inputs[name])

    def _can_share_with(self, other: SegmentedGraphModule) -> bool:
        return other.segments is self.segments or other.graph.to_json() == self.graph.to_json()

    def _share_input(self, other: SegmentedGraphModule, name: str) -> None:
        """Each segment shares with the same segment of other."""
        self.get_input_index(name)
        for k, there in self._routes[name]:
            self.modules[k]._share_input(other.modules[k], there)
        eid = self._inputs[name]
        if eid in other._param_eids:
            self._held[eid] = other._held[eid]
            self._param_eids.add(eid)

    # ---- running -------------------------------------------------------------------------------

    def _run_unlocked(self) -> None:
        self._run()

    def _run(self, timer: Callable[[Cut, float], None] | None = None,
             runner: Callable[[int, Segment, Any], None] | None = None) -> None:
        """Run segment by segment; each cut's results bind the sizes of the next segment.
        runner(k, segment, module) runs segment k's module in place of module.run() (a profile,
        a debug run); timer(cut, seconds) gets each cut's median of _repeat runs."""
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
        self._outputs = [values[e] for e in self._output_eids]

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
            return [np.ascontiguousarray(r) for r in _host_function(cut.op)(arrays, cut.attrs)]
        except GraphRuntimeError as e:
            raise GraphError(f"{cut.label} ({cut.op}): {e}") from e

    def _run_segment(self, k: int, seg: Segment, values: dict[int, Any], env: Mapping[str, int],
                     runner: Callable[[int, Segment, Any], None] | None) -> None:
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
            runner(k, seg, module)
        for i, eid in enumerate(seg.outputs):
            values[eid] = module.get_output(i)

    def _output_at(self, index: int, out: Any) -> Any:
        if self._outputs is None:
            raise GraphError("get_output: nothing has run yet (a graph cut at data-dependent "
                             "nodes learns its output sizes by running)")
        value = self._outputs[index]
        value = value if isinstance(value, NDArray) else NDArray(value, cpu(0))
        return copy_out(value, out) if out is not None else value

    # ---- diagnostics ---------------------------------------------------------------------------

    def _bench_target(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """Whole segmented runs (cuts, specialisation lookups and boundary copies included)."""
        return self._run, lambda: None

    def _profile_unlocked(self, repeat: int, progress: Callable[[int], None] | None
                          ) -> list[NodeTime]:
        """Each segment's own profile (a `specialise` row when it was specialised by this call),
        and one row per cut (its host time with the copies of its inputs to the host, median of
        repeat; nid of the cut node)."""
        rows: list[NodeTime] = []

        def timer(cut: Cut, seconds: float) -> None:
            bound = ", ".join(f"{n}={self.env.get(n)}" for n in cut.binds(self.graph))
            node = self.graph.nodes[cut.nid]
            rows.append(NodeTime(cut.nid, f"{node.label} [cut: {bound}]",
                                 node.func_name or cut.op, cpu(0), False, seconds))

        def runner(k: int, seg: Segment, module: Any) -> None:
            for t in module.profile(repeat):
                nid = seg.nids[t.nid] if t.nid >= 0 else -1
                label = self.graph.nodes[nid].label if nid >= 0 else f"segment {k}: {t.label}"
                rows.append(NodeTime(nid, label, t.func_name, t.device, t.is_copy, t.seconds))
        self._repeat = repeat
        self._run(timer, runner)
        return rows

    def _capture(self, names: set[str] | None) -> dict[str, list[np.ndarray]]:
        """Each segment's kernels captured right after they run (its debug_get_outputs), each
        cut's results."""
        g = self.graph
        captured: dict[str, list[np.ndarray]] = {}

        def runner(k: int, seg: Segment, module: Any) -> None:
            mine = {g.nodes[nid].name for nid in seg.nids if nid >= 0 and not g.nodes[nid].is_arg}
            wanted = sorted(mine if names is None else mine & names)
            if wanted:
                captured.update(module.debug_get_outputs(wanted))
            else:
                module.run()
        self._run(runner=runner)
        for cut in self.cuts:
            name = g.nodes[cut.nid].name
            if names is None or name in names:
                captured[name] = [np.array(r) for r in self._cut_results[cut.nid]]
        return captured

    def _report_executor(self, what: str) -> Any:
        """The segments' executors as one whole-graph view (placement, copies, pool, steps); the
        specialisations the last run used. Cuts run on the host."""
        from .segment_report import segments_view
        self._ran(what)
        return segments_view(self.graph, self._entry_device, self.segments, self.modules,
                             self.cuts)

    def _static_modules(self, what: str) -> list[GraphModule]:
        self._ran(what)
        return [s for m in self.modules if m is not None for s in m._static_modules(what)]

    def held_bytes(self) -> dict[Device, int]:
        """What the segments hold per device (every specialisation they keep)."""
        return add_bytes(m.held_bytes() for m in self.modules if m is not None)

    @property
    def executor(self) -> Any:
        """The segments' executors as one whole-graph view, for reports."""
        return self._report_executor("executor")

    def specialised(self) -> Any:
        raise GraphError("a graph cut at data-dependent nodes has no single static module; "
                         "its segments are in .modules")

    def _ran(self, what: str) -> None:
        if self._outputs is None:
            raise GraphError(f"{what}: nothing has run yet (a graph cut at data-dependent "
                             "nodes is specialised by running)")


def _host_function(op: str) -> HostFn:
    """The op's host function (segments.py cuts only at ops that have one)."""
    fn = get_op(op).host
    assert fn is not None  # cannot happen: a cut is made only where the op has one
    return fn


def _host(value: Any) -> np.ndarray:
    if isinstance(value, NDArray):
        return value.numpy()
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        from ..nd import from_dlpack
        return from_dlpack(value).numpy()
    return np.asarray(value)
