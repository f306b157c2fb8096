"""SymbolicGraphModule's timing and introspection: benchmark, profile, memory, placement, debug
outputs, answered by the specialisation for the inputs set (or the one the last run used)."""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ..device import Device
from ..graph.model import Graph
from .graph_module import GraphModule
from .measure import add_bytes
from .specialize import Specializer


class SymbolicDiagnostics:
    """The measuring half of SymbolicGraphModule: a mixin whose methods use its state."""

    graph: Graph
    ctxs: list[Device]
    specializer: Specializer
    specializations: int
    specialize_seconds: float
    _cache: OrderedDict[tuple, GraphModule]
    _current: GraphModule | None
    _params: dict[str, tuple[Device, Any]]

    if TYPE_CHECKING:  # SymbolicGraphModule's, declared for mypy only
        def specialised(self) -> GraphModule: ...

        def _specialised(self) -> GraphModule: ...

        def _owned(self, what: str) -> Any: ...

        def _module(self, what: str) -> GraphModule: ...

    def benchmark(self, *args: Any, **kwargs: Any) -> Any:
        """benchmark() of the specialisation for the inputs set (built if needed)."""
        return self.specialised().benchmark(*args, **kwargs)

    def profile(self, *args: Any, **kwargs: Any) -> Any:
        """profile() of the specialisation for the inputs set; when that specialisation is built
        by this call, a first row `specialise` (nid -1) holds the time it took (shape inference,
        planning, kernels); a cached shape has no such row."""
        with self._owned("profile"):
            built = self.specializations
            spent = self.specialize_seconds
            module = self._specialised()
            built = self.specializations - built
            spent = self.specialize_seconds - spent
        times = module.profile(*args, **kwargs)
        if not built:
            return times
        from .executor import NodeTime
        bound = ", ".join(f"{k}={v}" for k, v in self.specializer.last_env.items())
        row = NodeTime(-1, f"specialise ({bound or 'static'})", "__specialise", self.ctxs[0],
                       False, spent)
        return [row, *times]

    def memory_report(self) -> Any:
        """memory_report() of the specialisation the last run used."""
        return self._module("memory_report").memory_report()

    def held_bytes(self) -> dict[Device, int]:
        """What the module holds per device: every specialisation it keeps (pool, workspace,
        control-flow bodies) and the params once (each specialisation binds them zero copy)."""
        modules = list(self._cache.values())
        if self._current is not None and self._current not in modules:
            modules.append(self._current)  # evicted from the cache but still in use
        params: dict[Device, int] = {}
        for dev, array in self._params.values():
            params[dev] = params.get(dev, 0) + int(array.nbytes)
        parts = [params]
        for module in modules:
            parts.append(module.held_bytes())
            parts.append({dev: -n for dev, n in params.items()})  # counted in its pool too
        return add_bytes(parts)

    def debug_get_outputs(self, *args: Any, **kwargs: Any) -> Any:
        return self.specialised().debug_get_outputs(*args, **kwargs)

    def placement(self) -> Any:
        return self.specialised().placement()

    def copies(self) -> Any:
        return self.specialised().copies()

    @property
    def executor(self) -> Any:
        """The executor of the specialisation the last run used (for reports)."""
        return self._module("executor").executor
