"""What GraphModule reports about itself: pool memory per device, and benchmark timings."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .._text import fmt_bytes
from .._timing import BenchmarkResult, time_runs
from ..device import Device

__all__ = ["BenchmarkResult", "MemoryReport", "add_bytes", "time_runs"]


@dataclass(frozen=True)
class MemoryReport:
    """Memory per device, in bytes.

    pool: the storage pool as allocated (with sharing), plus buffers the executor added for
    copies it inserted. unshared: the same if no two entries shared a storage id. copies: bytes
    that copies write on the device (the `__copy` nodes' destinations, which live in the pool,
    and inserted copies' buffers). workspace: kernels' own memory outside the pool (chain
    intermediates, im2col buffers, padded weights). pool + workspace is what the memory cap
    limits. bodies: what the modules of control-flow kernels' sub-graphs hold (If branches,
    Loop and Scan bodies: their pool, workspace and own bodies; every specialisation a
    symbolic body keeps, its params once); made while preparing or running, outside the cap.
    """

    pool: dict[Device, int]
    unshared: dict[Device, int]
    copies: dict[Device, int]
    workspace: dict[Device, int] = field(default_factory=dict)
    bodies: dict[Device, int] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, int, int, int, int, int]]:
        """(device, pool, no sharing, copies, workspace, bodies) per device."""
        devs = sorted(set(self.pool) | set(self.unshared) | set(self.workspace)
                      | set(self.bodies))
        return [(str(d), self.pool.get(d, 0), self.unshared.get(d, 0), self.copies.get(d, 0),
                 self.workspace.get(d, 0), self.bodies.get(d, 0)) for d in devs]

    def total(self, dev: Device) -> int:
        """Pool plus workspace on dev: what the memory cap limits."""
        return self.pool.get(dev, 0) + self.workspace.get(dev, 0)

    def held(self) -> dict[Device, int]:
        """Everything the module holds per device: pool, workspace and bodies."""
        return add_bytes([self.pool, self.workspace, self.bodies])

    def __add__(self, other: MemoryReport) -> MemoryReport:
        """Two modules' reports as one (a segmented graph's segments)."""
        return MemoryReport(*(add_bytes([getattr(self, f), getattr(other, f)])
                              for f in ("pool", "unshared", "copies", "workspace", "bodies")))

    def __str__(self) -> str:
        """A table; the bodies column only when some control-flow body holds memory."""
        bodies = any(self.bodies.values())
        lines = [f"{'device':<12} {'pool':>12} {'no sharing':>12} {'copies':>12} "
                 f"{'workspace':>12}" + (f" {'bodies':>12}" if bodies else "")]
        for dev, pool, unshared, copies, workspace, body in self.rows():
            lines.append(f"{dev:<12} {fmt_bytes(pool):>12} {fmt_bytes(unshared):>12} "
                         f"{fmt_bytes(copies):>12} {fmt_bytes(workspace):>12}"
                         + (f" {fmt_bytes(body):>12}" if bodies else ""))
        return "\n".join(lines)


def add_bytes(parts: Iterable[Mapping[Device, int]]) -> dict[Device, int]:
    """Bytes per device summed over parts."""
    total: dict[Device, int] = {}
    for part in parts:
        for dev, n in part.items():
            total[dev] = total.get(dev, 0) + n
    return total
