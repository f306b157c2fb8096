"""A weight kept in the layout a oneDNN primitive chose (format `any`), reordered when written."""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..derived import derived_of
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
    user's, else a buffer refilled by a reorder (refresh) whenever the caller finds it stale.
    A frozen weight's packed buffer (derived.freeze: a symbolic module's param) is shared by
    every PackedWeight of the same layouts, made by the first to need it."""

    def __init__(self, user: MemoryDesc, chosen: MemoryDesc) -> None:
        self.direct = user == chosen
        self.memory = Memory(user if self.direct else chosen)
        self.buffer: np.ndarray | None = None  # the buffer bound: its own, or a shared one
        self.shared = False  # buffer is a frozen weight's copy, offered to other kernels
        self._own: np.ndarray | None = None  # made on the first refresh that needs it
        self._size = 0 if self.direct else chosen.size()
        self._reorder: Primitive | None = None
        self._user: Memory | None = None
        if not self.direct:
            self._user = Memory(user)
            self._reorder = Primitive(reorder(user, chosen),
                                      [(ARG_FROM, self._user), (ARG_TO, self.memory)])

    @property
    def nbytes(self) -> int:
        return self._size

    def refresh(self, weight: Any) -> None:
        """Bind (direct) or reorder (packed) this run's weight array."""
        if self._reorder is None:
            self.memory.bind(weight)
            return
        assert self._user is not None
        shared = derived_of(weight)
        if shared is not None:
            for user, chosen, ref in shared:
                buffer = ref()
                if buffer is not None and user == self._user.desc \
                        and chosen == self.memory.desc:
                    self.buffer, self.shared = buffer, True
                    self.memory.bind(buffer)
                    return
        if self._own is None:
            self._own = aligned_buffer(self._size)
        self.buffer = self._own
        self.memory.bind(self._own)
        self._user.bind(weight)
        self._reorder.run()
        if shared is not None:
            shared[:] = [item for item in shared if item[2]() is not None]
            shared.append((self._user.desc, self.memory.desc, weakref.ref(self._own)))
            self.shared = True

    def owner(self, kernel: Any) -> Any:
        """What its bytes are counted by (PreparedKernel.workspace_owner): a frozen weight's
        shared copy itself, which every kernel reading it names (oneDNN's products at each
        size class, the team GEMV: _onednn_copy), else kernel."""
        return self.buffer if self.shared and self.buffer is not None else kernel
