"""A small thread-safe least-recently-used cache of built things (imported sub-models, concrete
chains, per-shape kernels)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class LruCache(Generic[T]):
    """At most `size` entries; the least recently used goes first. A value is built outside
    the lock, so two threads missing the same key may both build it (the later one is kept)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_build(self, key: Hashable, build: Callable[[], T]) -> T:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        built = build()
        with self._lock:
            self._entries[key] = built
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return built

    def keys(self) -> list[Hashable]:
        """The keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def values(self) -> list[T]:
        """The entries, least recently used first."""
        with self._lock:
            return list(self._entries.values())
