"""What GraphModule reports about itself: pool memory per device, and benchmark timings."""
from __future__ import annotations

from dataclasses import dataclass, field

from .._text import fmt_bytes
from .._timing import BenchmarkResult, time_runs
from ..device import Device

__all__ = ["BenchmarkResult", "MemoryReport", "time_runs"]


@dataclass(frozen=True)
class MemoryReport:
    """Memory per device, in bytes.

    pool: the storage pool as allocated (with sharing), plus buffers the executor added for
    copies it inserted. unshared: the same if no two entries shared a storage id. copies: bytes
    that copies write on the device (the `__copy` nodes' destinations, which live in the pool,
    and inserted copies' buffers). workspace: kernels' own memory outside the pool (chain
    intermediates, im2col buffers, padded weights). pool + workspace is what the memory cap
    limits.
    """

    pool: dict[Device, int]
    unshared: dict[Device, int]
    copies: dict[Device, int]
    workspace: dict[Device, int] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, int, int, int, int]]:
        """(device, pool, no sharing, copies, workspace) per device."""
        devs = sorted(set(self.pool) | set(self.unshared) | set(self.workspace))
        return [(str(d), self.pool.get(d, 0), self.unshared.get(d, 0), self.copies.get(d, 0),
                 self.workspace.get(d, 0)) for d in devs]

    def total(self, dev: Device) -> int:
        """Pool plus workspace on dev: what the memory cap limits."""
        return self.pool.get(dev, 0) + self.workspace.get(dev, 0)

    def __str__(self) -> str:
        lines = [f"{'device':<12} {'pool':>12} {'no sharing':>12} {'copies':>12} "
                 f"{'workspace':>12}"]
        for dev, pool, unshared, copies, workspace in self.rows():
            lines.append(f"{dev:<12} {fmt_bytes(pool):>12} {fmt_bytes(unshared):>12} "
                         f"{fmt_bytes(copies):>12} {fmt_bytes(workspace):>12}")
        return "\n".join(lines)
