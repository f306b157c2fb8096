"""When a kernel must redo data it derives once from an input (transformed or transposed weights).

A kernel lists the input positions it derives from in `derived`; the executor binds one
InputVersion per position (prepared.PreparedKernel.cached_inputs). The kernel redoes the
derivation when their counts moved, every run when one is volatile, and every run when nothing
was bound (then correct, only slower).

An array frozen (freeze: a symbolic module's param, never written again) has a list of what
kernels derived from it (derived_of), so that the kernels of every specialisation share one
packed weight instead of each making its own, and the write counters that count it as written
once (watch); thaw (a view of it handed out) makes those counters volatile again.
"""
from __future__ import annotations

import weakref
from typing import Any, Mapping

from ..library import InputVersion
from ..prepared import PreparedKernel


class DerivesFromInputs(PreparedKernel):
    """A prepared kernel caching data derived from its inputs `derived`, and its freshness."""

    derived: tuple[int, ...] = ()

    def __init__(self) -> None:
        self._cells: list[InputVersion] = [InputVersion(volatile=True) for _ in self.derived]
        self._seen: tuple[int, ...] | None = None

    def cached_inputs(self) -> tuple[int, ...]:
        return self.derived

    def bind_versions(self, versions: Mapping[int, InputVersion] | Any) -> None:
        self._cells = [versions[pos] for pos in self.derived]

    def _volatile(self) -> bool:
        """True when an input derived from may change without a count (derived every run)."""
        return any(c.volatile for c in self._cells)

    def _stale(self) -> bool:
        """True when the derived data must be (re)made from this run's inputs."""
        stamp = tuple(-1 if c.volatile else c.value for c in self._cells)
        if -1 in stamp or stamp != self._seen:
            self._seen = None if -1 in stamp else stamp
            return True
        return False


# id(array) -> (the array, weakly; what kernels derived from it; the counters that watch it)
_frozen: dict[int, tuple[weakref.ref, list[Any], weakref.WeakSet[InputVersion]]] = {}


def freeze(array: Any) -> None:
    """Promise that array is never written again: data derived from it may be shared."""
    key = id(array)
    entry = _frozen.get(key)
    if entry is None or entry[0]() is not array:
        def forget(_: weakref.ref) -> None:  # array gone: its id may be reused
            _frozen.pop(key, None)
        _frozen[key] = (weakref.ref(array, forget), [], weakref.WeakSet())


def _entry(array: Any) -> tuple[weakref.ref, list[Any], weakref.WeakSet[InputVersion]] | None:
    entry = _frozen.get(id(array))
    return entry if entry is not None and entry[0]() is array else None


def derived_of(array: Any) -> list[Any] | None:
    """The data kernels derived from array, shared (a kernel appends what it derives), or
    None when array is not frozen."""
    entry = _entry(array)
    return None if entry is None else entry[1]


def watch(array: Any, version: InputVersion) -> bool:
    """Whether array is frozen; if so version may count it as written once (thaw makes it
    volatile again)."""
    entry = _entry(array)
    if entry is not None:
        entry[2].add(version)
    return entry is not None


def shared_list_watched_by(version: InputVersion) -> list[Any] | None:
    """derived_of of the frozen array whose writes version counts (watch), or None: the one
    object standing for what kernels derive from that array."""
    for ref, shared, versions in _frozen.values():
        if version in versions and ref() is not None:
            return shared
    return None


def thaw(array: Any) -> None:
    """array may be written after all (a view of it handed out): every counter watching it
    turns volatile and nothing more is shared from it."""
    entry = _entry(array)
    if entry is not None:
        for version in entry[2]:
            version.set_volatile(True)
        del _frozen[id(array)]
