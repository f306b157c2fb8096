"""SegmentedGraphModule's timing and introspection: benchmark, profile, placement, copies,
memory, debug outputs, in whole-graph node ids, for the segments the last run used."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .._timing import BenchmarkResult, time_runs
from ..device import Device, cpu
from ..errors import GraphError
from .executor import NodeTime
from .measure import MemoryReport, add_bytes
from .placement import InsertedCopy
from .segments import Cut


class SegmentedDiagnostics:
    """The measuring half of SegmentedGraphModule: a mixin whose methods use its state."""

    graph: Any
    cuts: list[Cut]
    segments: list[Any]
    modules: list[Any]
    env: dict[str, int]
    _outputs: list[Any] | None
    _cut_results: dict[int, list[np.ndarray]]
    _entry_device: list[Device]
    _repeat: int

    if TYPE_CHECKING:  # SegmentedGraphModule's, declared for mypy only
        def set_input(self, key: Any = None, value: Any = None, **params: Any) -> None: ...

        def _owned(self, what: str) -> Any: ...

        def _run(self, timer: Callable[[Cut, float], None] | None = None,
                 runner: Callable[[int, Any], None] | None = None) -> None: ...

    def benchmark(self, repeat: int = 5, number: int = 5, min_repeat_ms: float | None = None,
                  **kwargs: Any) -> BenchmarkResult:
        """Time whole segmented runs (cuts, specialisation lookups and boundary copies included)."""
        if kwargs:
            self.set_input(kwargs)
        with self._owned("benchmark"):
            return time_runs(self._run, lambda: None, repeat, number, min_repeat_ms)

    def profile(self, repeat: int = 1, progress: Any = None) -> list[NodeTime]:
        """Per-node times in run order: each segment's own profile (a `specialise` row when it
        was specialised by this call), and one row per cut (its host time with the copies of its
        inputs to the host, median of repeat; nid of the cut node)."""
        rows: list[NodeTime] = []

        def timer(cut: Cut, seconds: float) -> None:
            bound = ", ".join(f"{n}={self.env.get(n)}" for n in cut.binds(self.graph))
            node = self.graph.nodes[cut.nid]
            rows.append(NodeTime(cut.nid, f"{node.label} [cut: {bound}]",
                                 node.func_name or cut.op, cpu(0), False, seconds))

        def runner(k: int, module: Any) -> None:
            seg = self.segments[k]
            for t in module.profile(repeat):
                nid = seg.nids[t.nid] if t.nid >= 0 else -1
                label = self.graph.nodes[nid].label if nid >= 0 else f"segment {k}: {t.label}"
                rows.append(NodeTime(nid, label, t.func_name, t.device, t.is_copy, t.seconds))
        with self._owned("profile"):
            self._repeat = repeat
            self._run(timer, runner)
        return rows

    def debug_get_outputs(self, nodes: Sequence[str | int] | None = None
                          ) -> dict[str, list[np.ndarray]]:
        """Run once and return host copies of each (selected) node's outputs: each segment's
        kernels captured right after they run (its debug_get_outputs), each cut's results."""
        g = self.graph
        wanted: set[str] | None = None
        if nodes is not None:
            by_name = {n.name for n in g.nodes}
            wanted = set()
            for key in nodes:
                if isinstance(key, str):
                    if key not in by_name:
                        raise GraphError(f"graph has no node named {key!r}")
                    wanted.add(key)
                elif 0 <= int(key) < g.num_nodes:
                    wanted.add(g.nodes[int(key)].name)
                else:
                    raise GraphError(f"node id {key} is out of range: the graph has "
                                     f"{g.num_nodes} nodes")
        captured: dict[str, list[np.ndarray]] = {}

        def runner(k: int, module: Any) -> None:
            seg = self.segments[k]
            names = {g.nodes[nid].name for nid in seg.nids if nid >= 0 and not g.nodes[nid].is_arg}
            mine = sorted(names if wanted is None else names & wanted)
            if mine:
                captured.update(module.debug_get_outputs(mine))
            else:
                module.run()
        with self._owned("debug_get_outputs"):
            self._run(runner=runner)
        for cut in self.cuts:
            name = g.nodes[cut.nid].name
            if wanted is None or name in wanted:
                captured[name] = [np.array(r) for r in self._cut_results[cut.nid]]
        return captured

    def memory_report(self) -> MemoryReport:
        """The segments' reports summed (the specialisations the last run used); the cuts'
        results are host arrays made per run, not held."""
        self._ran("memory_report")
        report = MemoryReport({}, {}, {})
        for module in self.modules:
            if module is not None:
                report = report + module.memory_report()
        return report

    def held_bytes(self) -> dict[Device, int]:
        """What the segments hold per device (every specialisation they keep)."""
        return add_bytes(m.held_bytes() for m in self.modules if m is not None)

    def placement(self) -> list[tuple[int, str, str, Device]]:
        """(node id, name, func_name, device) for every node; cuts run on the host."""
        view = self.executor
        return [(n.nid, n.name, n.func_name or ("input" if n.is_arg else ""),
                 view.node_device[n.nid]) for n in self.graph.nodes]

    def copies(self) -> list[InsertedCopy]:
        """Copies the segments' executors inserted, with whole-graph entry ids."""
        return list(self.executor.copies)

    @property
    def executor(self) -> Any:
        """The segments' executors as one whole-graph view (placement, copies, pool, steps) for
        reports; the specialisations the last run used."""
        from .segment_report import segments_view
        self._ran("executor")
        return segments_view(self.graph, self._entry_device, self.segments, self.modules,
                             self.cuts)

    def specialised(self) -> Any:
        raise GraphError("a graph cut at data-dependent nodes has no single static module; "
                         "its segments are in .modules")

    def _ran(self, what: str) -> None:
        if self._outputs is None:
            raise GraphError(f"{what}: nothing has run yet (a graph cut at data-dependent "
                             "nodes is specialised by running)")
