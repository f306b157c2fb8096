"""GraphModule's timing and introspection: benchmark, profile, placement, memory, debug outputs."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from .._timing import BenchmarkResult, time_runs
from ..backends import check_device
from ..device import Device, DeviceLike
from ..errors import GraphError, GraphRuntimeError
from ..graph.model import COPY_OP, Graph
from .executor import Executor, NodeTime
from .measure import MemoryReport, add_bytes
from .placement import InsertedCopy


class _ModuleState(Protocol):
    """What Diagnostics' methods use of the GraphModule they are part of."""

    graph: Graph
    executor: Executor
    _output_eids: list[int]
    _unset: set[int]

    def _acquire(self, what: str) -> None: ...

    def _release(self) -> None: ...

    def _refuse_unset(self) -> None: ...

    def set_input(self, key: int | str | Mapping[str, Any] | None = None, value: Any = None,
                  **params: Any) -> None: ...

    def _set_input_unlocked(self, key: Any, value: Any, params: Mapping[str, Any]) -> None: ...

    def _get_output_unlocked(self, index: int, out: Any) -> Any: ...


class Diagnostics:
    """The measuring half of GraphModule: a mixin whose methods run on GraphModule's state."""

    def benchmark(self: _ModuleState, device: DeviceLike | None = None, func_name: str = "run",
                  repeat: int = 5, number: int = 5, min_repeat_ms: float | None = None,
                  end_to_end: bool = False, progress: Callable[[int], None] | None = None,
                  **kwargs: Any) -> BenchmarkResult:
        """Time run() (device-synchronised): repeat samples, each the mean of number runs."""
        if func_name != "run":
            raise GraphRuntimeError(f"benchmark can time 'run' only, got {func_name!r}")
        if repeat < 1 or number < 1:
            raise GraphRuntimeError(f"benchmark needs repeat >= 1 and number >= 1, got "
                                    f"repeat={repeat} number={number}")
        host_inputs = {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v)
                       for k, v in kwargs.items()}
        if host_inputs and not end_to_end:
            self.set_input(host_inputs)

        # NOTE: benchmark runs on whatever inputs hold (timing does not depend on values), so
        # it skips the never-set check; it holds the module for its whole duration.
        def once() -> None:
            if end_to_end:
                self._set_input_unlocked(None, None, host_inputs)
                self.executor.run()
                for i in range(len(self._output_eids)):
                    self._get_output_unlocked(i, None).numpy()
            else:
                self.executor.run()

        self._acquire("benchmark")
        try:
            return time_runs(once, self.executor.sync, repeat, number, min_repeat_ms, progress)
        finally:
            self._release()

    def placement(self: _ModuleState) -> list[tuple[int, str, str, Device]]:
        """(node id, name, func_name, device) for every node, in node order."""
        g = self.graph
        return [(n.nid, n.name, n.func_name or ("input" if n.is_arg else ""),
                 self.executor.node_device[n.nid]) for n in g.nodes]

    def copies(self: _ModuleState) -> list[InsertedCopy]:
        """Copies the executor inserted where the graph had none (none for a well-planned graph)."""
        return list(self.executor.copies)

    def memory_report(self: _ModuleState) -> MemoryReport:
        """Bytes per device: pool, pool without sharing, copy destinations, kernel workspace.

        See MemoryReport for what each column counts; print it for a table.
        """
        ex = self.executor
        plan = ex.plan
        copies = dict(plan.extra_bytes)
        g = self.graph
        for node in g.nodes:
            if node.func_name == COPY_OP and node.nid not in ex.dropped_copies:
                for eid in g.node_entries(node.nid):
                    dev = ex.entry_device[eid]
                    copies[dev] = copies.get(dev, 0) + plan.entry_bytes[eid]
        bodies = add_bytes(module.held_bytes() for step in ex.steps
                           for module in step.kernel.sub_modules())
        return MemoryReport(plan.bytes_per_device(), plan.unshared_bytes_per_device(), copies,
                            dict(plan.workspace_bytes), bodies)

    def held_bytes(self: _ModuleState) -> dict[Device, int]:
        """What this module holds per device: pool, workspace, control-flow bodies."""
        return Diagnostics.memory_report(self).held()  # type: ignore[arg-type]

    def profile(self: _ModuleState, repeat: int = 1, progress: Callable[[int], None] | None = None
                ) -> list[NodeTime]:
        """Per-node device-synchronised times (median of repeat runs), in execution order.

        Like benchmark(), runs on whatever the inputs hold.
        """
        self._acquire("profile")
        try:
            return self.executor.profile(repeat, progress)
        finally:
            self._release()

    def debug_get_outputs(self: _ModuleState, nodes: Sequence[str | int] | None = None
                          ) -> dict[str, list[np.ndarray]]:
        """Run once node by node and return host copies of each (selected) node's outputs.

        Outputs are captured right after their node runs, before storage sharing reuses them.
        """
        g = self.graph
        wanted = None
        if nodes is not None:
            wanted = set()
            by_name = {n.name: n.nid for n in g.nodes}
            for key in nodes:
                if isinstance(key, str):
                    if key not in by_name:
                        raise GraphError(f"graph has no node named {key!r}")
                    wanted.add(by_name[key])
                else:
                    wanted.add(int(key))
        captured: dict[str, list[np.ndarray]] = {}

        def grab(step: Any) -> None:
            if step.nid < 0 or (wanted is not None and step.nid not in wanted):
                return
            dev = self.executor.node_device[step.nid]
            backend = check_device(dev)
            captured[g.nodes[step.nid].name] = [
                backend.to_host(self.executor.arrays[(e, dev)]) for e in g.node_entries(step.nid)]

        self._acquire("debug_get_outputs")
        try:
            if self._unset:
                self._refuse_unset()
            self.executor.run_steps(each=grab)
        finally:
            self._release()
        return captured
