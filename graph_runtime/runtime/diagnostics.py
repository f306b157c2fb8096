"""Every module's timing and introspection: benchmark, profile, placement, memory, debug outputs."""
from __future__ import annotations

import dataclasses
import functools
import operator
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from .._timing import BenchmarkResult, time_runs
from ..device import Device, DeviceLike
from ..errors import GraphError, GraphRuntimeError
from ..graph.model import COPY_OP, Graph
from .executor import Executor, NodeTime
from .measure import MemoryReport, ShapeCost
from .placement import InsertedCopy

if TYPE_CHECKING:
    from .graph_module import GraphModule


class Diagnostics(ABC):
    """The measuring half of a module (runtime/module_base.py): methods written once over a few
    primitives each module kind provides (the static module itself, a symbolic module's
    specialisation, a segmented module's segments)."""

    graph: Graph

    if TYPE_CHECKING:  # ModuleBase's, declared for mypy only
        def _acquire(self, what: str) -> None: ...

        def _release(self) -> None: ...

        def set_input(self, key: int | str | Mapping[str, Any] | None = None, value: Any = None,
                      **params: Any) -> None: ...

        def _set_input_unlocked(self, key: Any, value: Any, params: Mapping[str, Any]
                                ) -> None: ...

        def _get_output_unlocked(self, key: int | str, out: Any) -> Any: ...

        def get_num_outputs(self) -> int: ...

    # ---- what each module kind provides --------------------------------------------------------

    @abstractmethod
    def _bench_target(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """(run once without the never-set check, wait for the devices) for the inputs set now;
        called holding the module."""

    @abstractmethod
    def _profile_unlocked(self, repeat: int, progress: Callable[[int], None] | None
                          ) -> list[NodeTime]:
        """profile()'s rows; called holding the module."""

    @abstractmethod
    def _capture(self, names: set[str] | None) -> dict[str, list[np.ndarray]]:
        """Run once, returning host copies of the outputs of the nodes called names (None: all);
        called holding the module."""

    @abstractmethod
    def _report_executor(self, what: str) -> Any:
        """The executor (or a whole-graph view of several) that placement() and copies() read."""

    @abstractmethod
    def _static_modules(self, what: str) -> list[GraphModule]:
        """The static modules the last run used, whose memory memory_report() sums."""

    @abstractmethod
    def held_bytes(self) -> dict[Device, int]:
        """What this module holds per device: pool, workspace, control-flow bodies."""

    def _shape_cost(self) -> ShapeCost | None:
        """A symbolic module's last shape (new or kept, its cost); None for a static one."""
        return None

    # ---- the diagnostics -----------------------------------------------------------------------

    def benchmark(self, device: DeviceLike | None = None, func_name: str = "run",
                  repeat: int = 5, number: int = 5, min_repeat_ms: float | None = None,
                  end_to_end: bool = False, progress: Callable[[int], None] | None = None,
                  **kwargs: Any) -> BenchmarkResult:
        """Time run() (device-synchronised): repeat samples, each the mean of number runs.

        kwargs are inputs, set first; end_to_end times setting them, the run and host copies of
        every output.
        """
        if func_name != "run":
            raise GraphRuntimeError(f"benchmark can time 'run' only, got {func_name!r}")
        if repeat < 1 or number < 1:
            raise GraphRuntimeError(f"benchmark needs repeat >= 1 and number >= 1, got "
                                    f"repeat={repeat} number={number}")
        host_inputs = {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v)
                       for k, v in kwargs.items()}
        outputs = range(self.get_num_outputs())
        # NOTE: benchmark runs on whatever inputs hold (timing does not depend on values), so
        # it skips the never-set check; it holds the module for its whole duration.
        self._acquire("benchmark")
        try:
            if host_inputs:
                self._set_input_unlocked(None, None, host_inputs)
            run, sync = self._bench_target()

            def once() -> None:
                if end_to_end:
                    self._set_input_unlocked(None, None, host_inputs)
                    run()
                    for i in outputs:
                        self._get_output_unlocked(i, None).numpy()
                else:
                    run()
            return time_runs(once, sync, repeat, number, min_repeat_ms, progress)
        finally:
            self._release()

    def profile(self, repeat: int = 1, progress: Callable[[int], None] | None = None
                ) -> list[NodeTime]:
        """Per-node device-synchronised times (median of repeat runs), in execution order.

        Like benchmark(), runs on whatever the inputs hold. A symbolic module's first row
        `specialise` (nid -1) holds the time this call spent specialising, when it did; a
        segmented module adds one row per cut (its host time, with the copies of its inputs).
        """
        self._acquire("profile")
        try:
            return self._profile_unlocked(repeat, progress)
        finally:
            self._release()

    def placement(self) -> list[tuple[int, str, str, Device]]:
        """(node id, name, func_name, device) for every node, in node order."""
        node_device = self._report_executor("placement").node_device
        return [(n.nid, n.name, n.func_name or ("input" if n.is_arg else ""),
                 node_device[n.nid]) for n in self.graph.nodes]

    def copies(self) -> list[InsertedCopy]:
        """Copies the executor inserted where the graph had none (none for a well-planned graph)."""
        return list(self._report_executor("copies").copies)

    def memory_report(self) -> MemoryReport:
        """Bytes per device: pool, pool without sharing, copy destinations, kernel workspace
        (summed over a segmented module's segments; a cut's results are made per run, not held);
        a symbolic module's also says whether its last run's shape was new and what it cost.

        See MemoryReport for what each column counts; print it for a table.
        """
        reports = [_memory_of(m.graph, m.executor)
                   for m in self._static_modules("memory_report")]
        report: MemoryReport = functools.reduce(operator.add, reports)
        shape = self._shape_cost()
        return report if shape is None else dataclasses.replace(report, shape=shape)

    def debug_get_outputs(self, nodes: Sequence[str | int] | None = None
                          ) -> dict[str, list[np.ndarray]]:
        """Run once node by node and return host copies of each (selected) node's outputs.

        Outputs are captured right after their node runs, before storage sharing reuses them.
        """
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
        self._acquire("debug_get_outputs")
        try:
            return self._capture(wanted)
        finally:
            self._release()


def _memory_of(g: Graph, ex: Executor) -> MemoryReport:
    """One static module's MemoryReport, from its executor's plan."""
    plan = ex.plan
    copies = dict(plan.extra_bytes)
    for node in g.nodes:
        if node.func_name == COPY_OP and node.nid not in ex.dropped_copies:
            for eid in g.node_entries(node.nid):
                dev = ex.entry_device[eid]
                copies[dev] = copies.get(dev, 0) + plan.entry_bytes[eid]
    return MemoryReport(plan.bytes_per_device(), plan.unshared_bytes_per_device(), copies,
                        dict(plan.workspace_bytes), ex.bodies_bytes())
