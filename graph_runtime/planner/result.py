"""PlanResult: the planned graph and what planning did (fallbacks, copies, pool bytes)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .._text import count_of, fmt_bytes
from ..device import Device
from ..graph.model import Graph


@dataclass(frozen=True)
class Fallback:
    """A node moved to the default device: the lib lacks its function where it was planned."""

    nid: int
    name: str
    func_name: str
    planned: Device
    device: Device


@dataclass(frozen=True)
class CopyReport:
    """An inserted `__copy` node, the entry it reads ("nid:index", planned graph), its bytes."""

    nid: int
    name: str
    src_entry: str
    src: Device
    dst: Device
    nbytes: int


@dataclass(frozen=True)
class PoolReport:
    """Pool bytes on one device: as given, with no sharing, as planned, and the lower bound."""

    device: Device
    before: int
    no_sharing: int
    after: int
    lower_bound: int  # peak bytes live at once; no storage plan can go below it


@dataclass(frozen=True)
class PlanResult:
    """The planned graph, each of its nodes' device, and the report of the plan."""

    graph: Graph
    node_devices: list[Device]
    fallbacks: list[Fallback]
    copies: list[CopyReport]
    pools: dict[Device, PoolReport]
    seconds: float
    stage_seconds: dict[str, float] = field(default_factory=dict)  # solve, copies, storage, build

    @property
    def copy_bytes(self) -> int:
        return sum(c.nbytes for c in self.copies)

    def summary(self) -> str:
        """A few lines for people: devices, fallbacks, copies, pool bytes per device."""
        devices = ", ".join(dev.spec for dev in sorted(set(self.node_devices)))
        originals = len(self.node_devices) - len(self.copies)
        lines = [f"planned {count_of(originals, 'node')} on {devices or 'no device'}; "
                 f"{count_of(len(self.copies), 'copy', 'copies')} "
                 f"({fmt_bytes(self.copy_bytes)} per run), "
                 f"{len(self.fallbacks)} fallbacks, {self.seconds * 1e3:.1f} ms"]
        for f in self.fallbacks:
            lines.append(f"  fallback: node {f.nid} {f.name!r} ({f.func_name}) has no kernel "
                         f"for {f.planned.spec}; runs on {f.device.spec}")
        for c in self.copies:
            lines.append(f"  copy: node {c.nid} {c.name!r} reads entry {c.src_entry}, "
                         f"{c.src.spec} -> {c.dst.spec}, {fmt_bytes(c.nbytes)}")
        if self.pools:
            lines.append(f"  {'pool bytes':<12}{'before':>12}{'no sharing':>12}"
                         f"{'after':>12}{'lower bound':>13}")
            for pool in self.pools.values():
                lines.append(f"  {pool.device.spec:<12}{pool.before:>12}{pool.no_sharing:>12}"
                             f"{pool.after:>12}{pool.lower_bound:>13}")
        return "\n".join(lines)

