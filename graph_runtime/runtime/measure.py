"""What GraphModule reports about itself: pool memory per device, and benchmark timings."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Mapping

from .._text import count_of, fmt_bytes
from .._timing import BenchmarkResult, time_runs
from ..device import Device

__all__ = ["BenchmarkResult", "MemoryReport", "ShapeCost", "SharedBytes", "add_bytes",
           "time_runs"]


@dataclass(frozen=True)
class ShapeCost:
    """A symbolic module's shape as its last run met it: new (specialised by that run) or kept
    from an earlier run; what specialising it cost in seconds (shape inference, storage plan,
    kernels prepared: the static module made) and how many tuning choices took the default for
    want of an entry for their size class; what the module keeps across shapes against its
    bound (GRAPH_RUNTIME_SHAPE_CACHE_BYTES)."""

    shape: str  # the bound dims, e.g. "batch=2, seq=37"
    new: bool
    infer_s: float
    plan_s: float
    prepare_s: float
    defaults: int
    kept_shapes: int
    kept_bytes: int
    bound_bytes: int
    derived: bool = False  # made from the shape run before, only what the sizes change redone
    # the module of the shape run before made over this one in place (Executor.retarget)
    retargeted: bool = False

    @property
    def seconds(self) -> float:
        return self.infer_s + self.plan_s + self.prepare_s

    def __str__(self) -> str:
        cost = ("the shape before's module re-pointed in place, " if self.retargeted else
                "derived from the shape before, " if self.derived else "") + (
            f"specialised in {self.seconds * 1e3:.1f} ms (infer {self.infer_s * 1e3:.1f}, "
            f"plan {self.plan_s * 1e3:.1f}, prepare {self.prepare_s * 1e3:.1f} ms"
            + (f"; {count_of(self.defaults, 'tuning choice')} at the default"
               if self.defaults else "") + ")")
        return (f"shape {self.shape or 'static'}: "
                + (f"new, {cost}" if self.new else f"kept from an earlier run ({cost})")
                + f"; {count_of(self.kept_shapes, 'shape')} kept in "
                f"{fmt_bytes(self.kept_bytes)} (bound {fmt_bytes(self.bound_bytes)})")


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
    shape: ShapeCost | None = None  # a symbolic module's: the shape of the last run

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
        pool, unshared, copies, workspace, bodies = (
            add_bytes([getattr(self, f), getattr(other, f)])
            for f in ("pool", "unshared", "copies", "workspace", "bodies"))
        return MemoryReport(pool, unshared, copies, workspace, bodies)

    def __str__(self) -> str:
        """A table; the bodies column only when some control-flow body holds memory."""
        bodies = any(self.bodies.values())
        lines = [f"{'device':<12} {'pool':>12} {'no sharing':>12} {'copies':>12} "
                 f"{'workspace':>12}" + (f" {'bodies':>12}" if bodies else "")]
        for dev, pool, unshared, copies, workspace, body in self.rows():
            lines.append(f"{dev:<12} {fmt_bytes(pool):>12} {fmt_bytes(unshared):>12} "
                         f"{fmt_bytes(copies):>12} {fmt_bytes(workspace):>12}"
                         + (f" {fmt_bytes(body):>12}" if bodies else ""))
        if self.shape is not None:
            lines.append(str(self.shape))
        return "\n".join(lines)


def add_bytes(parts: Iterable[Mapping[Device, int]]) -> dict[Device, int]:
    """Bytes per device summed over parts."""
    total: dict[Device, int] = {}
    for part in parts:
        for dev, n in part.items():
            total[dev] = total.get(dev, 0) + n
    return total


class SharedBytes:
    """Memory held by objects that several holders share, each object counted once while any
    holder of it is counted: a symbolic module's kept shapes, whose pools share buffers with the
    shape each was derived from and whose steps share prepared kernels (their workspace and
    control-flow bodies) through one KernelCache."""

    def __init__(self) -> None:
        # id -> [object, its bytes per device, holders]
        self._held: dict[int, list[Any]] = {}
        self._by_holder: dict[Hashable, list[int]] = {}
        self.total = 0

    def add(self, holder: Hashable, items: Iterable[tuple[Any, Mapping[Device, int]]]) -> None:
        """Count holder's (object, bytes per device) items; an object counted already adds
        none, but is counted at its bytes now (a kernel of any shape grows its workspace as
        it meets shapes)."""
        ids = []
        for obj, nbytes in items:
            held = self._held.get(id(obj))
            if held is None:
                held = self._held[id(obj)] = [obj, nbytes, 0]  # kept: its id stays its own
                self.total += sum(nbytes.values())
            elif held[1] != nbytes:
                self.total += sum(nbytes.values()) - sum(held[1].values())
                held[1] = nbytes
            held[2] += 1
            ids.append(id(obj))
        self._by_holder[holder] = ids

    def rename(self, old: Hashable, new: Hashable) -> None:
        """holder old's items counted as new's from now on."""
        self._by_holder[new] = self._by_holder.pop(old)

    def drop(self, holder: Hashable) -> None:
        """Stop counting holder's items: those no other holder counts are let go."""
        for ident in self._by_holder.pop(holder, ()):
            held = self._held[ident]
            held[2] -= 1
            if held[2] == 0:
                self.total -= sum(held[1].values())
                del self._held[ident]

    def clear(self) -> None:
        self._held.clear()
        self._by_holder.clear()
        self.total = 0

    def bytes_per_device(self) -> dict[Device, int]:
        return add_bytes(nbytes for _, nbytes, _ in self._held.values())
