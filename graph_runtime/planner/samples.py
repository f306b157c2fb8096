"""Sample shapes of a graph with symbolic dims: the static graphs create() would make for them.

Planning a symbolic graph decides devices and copies once for every shape; what a plan costs
(bytes, kernel times) depends on the shape, so reports and measurements use samples the user
gives. Each sample is specialised exactly as create() does (runtime/specialize.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..device import Device
from ..errors import GraphRuntimeError, PlanError
from ..graph.model import COPY_OP, Graph, entry_bytes
from ..graph.symbolic import format_shape, shape_is_symbolic
from ..lib.library import Module

Sample = Mapping[str, Sequence[int]]  # input name -> its shape at this sample


@dataclass(frozen=True)
class Specialised:
    """One sample: its label (`x=(2, 3, 6, 6)`) and the static graph for it."""

    label: str
    graph: Graph

    def bytes_per_device(self, devices: Sequence[Device]) -> dict[Device, int]:
        """Pool bytes per device of the static graph (each storage id at its largest entry)."""
        from ..runtime.placement import resolve_entry_devices
        g = self.graph
        entry_device = resolve_entry_devices(g, list(devices), False)
        sids = g.attrs["storage_id"][1]
        largest: dict[int, int] = {}
        home: dict[int, Device] = {}
        for eid, sid in enumerate(sids):
            home.setdefault(sid, entry_device[eid])
            largest[sid] = max(largest.get(sid, 0), entry_bytes(g.shape(eid), g.dtype(eid)))
        totals: dict[Device, int] = {}
        for sid, nbytes in largest.items():
            totals[home[sid]] = totals.get(home[sid], 0) + nbytes
        return totals

    def copy_bytes(self) -> int:
        """Bytes the graph's `__copy` nodes move per run at this sample."""
        g = self.graph
        return sum(entry_bytes(g.shape(e), g.dtype(e)) for n in g.nodes
                   if n.func_name == COPY_OP for e in g.node_entries(n.nid))


def specialise_samples(g: Graph, lib: Module, devices: Sequence[Device],
                       samples: Sequence[Sample]) -> list[Specialised]:
    """The static graph of each sample (nodes as in g; shapes and storage ids for the sample).

    Raises:
        PlanError: no samples, a sample naming no input or missing a symbolic one, a graph whose
            shapes depend on input values or on data (cuts): sample shapes cannot decide those.
        GraphError: shapes the graph cannot take (naming the sample, input, dim and node).
    """
    from ..runtime.placement import resolve_entry_devices
    from ..runtime.segments import find_cuts
    from ..runtime.specialize import Specializer
    cuts = find_cuts(g, lib)
    if cuts:
        where = ", ".join(c.label for c in cuts[:3])
        raise PlanError(f"{g.source}: sizes decided by data ({where}) are known only when the "
                        "graph runs, so sample shapes cannot specialise what follows them; "
                        "place it with constraints (--default, --place) and no --shape")
    specializer = Specializer(g, lib, resolve_entry_devices(g, list(devices), False))
    if specializer.value_inputs:
        names = ", ".join(repr(n) for n in specializer.value_inputs)
        raise PlanError(f"{g.source}: the values of inputs {names} decide shapes, which sample "
                        "shapes do not give; place the graph with constraints (--default, "
                        "--place) and no --shape")
    if not samples:
        raise PlanError(f"{g.source}: the graph has symbolic dims ({signature(g)}); give one "
                        "or more sample shapes (--shape NAME=D0,D1,...)")
    found = []
    for k, sample in enumerate(samples):
        shapes = _checked(g, k, sample)
        label = ", ".join(f"{n}={tuple(s)}" for n, s in shapes.items())
        try:
            entry_shapes = specializer.infer_shapes(shapes)
        except GraphRuntimeError as e:
            raise type(e)(f"sample {label}: {e}") from e
        found.append(Specialised(label, specializer.static_graph(entry_shapes,
                                                                 specializer.last_env)))
    return found


def signature(g: Graph) -> str:
    """The inputs with symbolic dims, e.g. `x: (N, 3, 6, 6)`."""
    return "; ".join(f"{n}: {format_shape(g.shape(e))}" for n, e in g.input_entries.items()
                     if shape_is_symbolic(g.shape(e)))


def _checked(g: Graph, k: int, sample: Sample) -> dict[str, tuple[int, ...]]:
    """The sample's shapes by input; PlanError naming an unknown or missing input."""
    inputs = g.input_entries
    unknown = [n for n in sample if n not in inputs]
    if unknown:
        raise PlanError(f"sample {k}: the graph has no input {unknown[0]!r}; inputs are: "
                        + ", ".join(inputs))
    missing = [n for n, e in inputs.items() if shape_is_symbolic(g.shape(e)) and n not in sample]
    if missing:
        name = missing[0]
        raise PlanError(f"sample {k}: input {name!r} has symbolic dims "
                        f"{format_shape(g.shape(inputs[name]))}; give its shape in every sample "
                        f"(--shape {name}=D0,D1,...)")
    return {n: tuple(int(d) for d in s) for n, s in sample.items()}
