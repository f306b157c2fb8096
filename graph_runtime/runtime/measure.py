"""What GraphModule reports about itself: pool memory per device, and benchmark timings."""
from __future__ import annotations

from dataclasses import dataclass

from .._text import fmt_bytes
from .._timing import BenchmarkResult, time_runs
from ..device import Device

__all__ = ["BenchmarkResult", "MemoryReport", "time_runs"]


@dataclass(frozen=True)
class MemoryReport:
    """Pool bytes per device: as allocated (with sharing), without sharing, and inserted copies."""

    pool: dict[Device, int]
    unshared: dict[Device, int]
    copies: dict[Device, int]

    def rows(self) -> list[tuple[str, int, int, int]]:
        devs = sorted(set(self.pool) | set(self.unshared))
        return [(str(d), self.pool.get(d, 0), self.unshared.get(d, 0), self.copies.get(d, 0))
                for d in devs]

    def __str__(self) -> str:
        lines = [f"{'device':<12} {'pool':>12} {'no sharing':>12} {'copies':>12}"]
        for dev, pool, unshared, copies in self.rows():
            lines.append(f"{dev:<12} {fmt_bytes(pool):>12} {fmt_bytes(unshared):>12} "
                         f"{fmt_bytes(copies):>12}")
        return "\n".join(lines)
