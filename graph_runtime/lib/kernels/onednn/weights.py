"""A weight kept in the layout a oneDNN primitive chose (format `any`), reordered when written."""
from __future__ import annotations

from typing import Any

import numpy as np

from .abi import ARG_FROM, ARG_TO
from .binding import Memory, MemoryDesc, Primitive, reorder

ALIGN = 64  # bytes; oneDNN's JIT kernels load whole cache lines


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A zeroed float32 array of at least nbytes starting on an ALIGN-byte boundary."""
    raw = np.zeros(nbytes // 4 + 1 + ALIGN // 4, np.float32)
    skip = (-raw.ctypes.data % ALIGN) // 4
    return raw[skip:skip + nbytes // 4 + 1]


class PackedWeight:
    """The primitive's weights memory: the user's array itself when the chosen layout is the
    user's, else a buffer refilled by a reorder (refresh) whenever the caller finds it stale."""

    def __init__(self, user: MemoryDesc, chosen: MemoryDesc) -> None:
        self.direct = user == chosen
        self.memory = Memory(user if self.direct else chosen)
        self.buffer: np.ndarray | None = None
        self._reorder: Primitive | None = None
        self._user: Memory | None = None
        if not self.direct:
            self.buffer = aligned_buffer(chosen.size())
            self.memory.bind(self.buffer)
            self._user = Memory(user)
            self._reorder = Primitive(reorder(user, chosen),
                                      [(ARG_FROM, self._user), (ARG_TO, self.memory)])

    @property
    def nbytes(self) -> int:
        return 0 if self.buffer is None else int(self.buffer.nbytes)

    def refresh(self, weight: Any) -> None:
        """Bind (direct) or reorder (packed) this run's weight array."""
        if self._reorder is None:
            self.memory.bind(weight)
            return
        assert self._user is not None
        self._user.bind(weight)
        self._reorder.run()
