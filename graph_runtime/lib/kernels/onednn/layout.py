"""NCHW <-> NHWC reorders between a user's array and a oneDNN buffer, cut into row bands.

Each band (an image, or a band of one image's rows) is its own reorder primitive on strided
descriptors (same speed as one whole reorder, measured), so the runtime's workers share a
reorder as they share a conv's bands.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import abi
from . import binding as dn
from .binding import Memory, MemoryDesc, Primitive

def bands(n: int, rows: int, workers: int) -> list[tuple[int, int, int]]:
    """(image, first row, end row) items: one for all images with one worker, whole images
    when there are enough for every worker twice, else bands of each image's rows.
    Image -1 is the whole batch."""
    if workers <= 1:
        return [(-1, 0, rows)]
    per_image = 1 if n >= 2 * workers else min(rows, -(-2 * workers // n))
    step = -(-rows // per_image)
    return [(i, r0, min(rows, r0 + step)) for i in range(n) for r0 in range(0, rows, step)]


class BandedReorder:
    """The reorder of an (N, C, H, W) tensor between a user's NCHW array and an NHWC buffer."""

    def __init__(self, shape: tuple[int, int, int, int], nhwc: np.ndarray, to_nhwc: bool,
                 pieces: list[tuple[int, int, int]]) -> None:
        """pieces: (image, first row, end row) items, as bands() gives."""
        n, c, h, w = shape
        self.pieces = pieces
        self.items: list[Primitive] = []
        self._user: list[tuple[Memory, int]] = []  # (memory, byte offset in the user's array)
        self._array: Any = None
        for image, r0, r1 in pieces:
            batch = n if image < 0 else 1
            first = max(image, 0)
            size = (batch, c, r1 - r0, w)
            user = Memory(MemoryDesc.strided(size, (c * h * w, h * w, w, 1)))
            inner = Memory(MemoryDesc.strided(size, (h * w * c, 1, w * c, c)))
            start = (first * h + r0) * w * c
            inner.bind(nhwc[start:start + batch * (r1 - r0) * w * c])
            self._user.append((user, 4 * (first * c * h * w + r0 * w)))
            src, dst = (user, inner) if to_nhwc else (inner, user)
            self.items.append(Primitive(dn.reorder(src.desc, dst.desc),
                                        [(abi.ARG_FROM, src), (abi.ARG_TO, dst)]))

    def bind(self, array: Any) -> None:
        """Point the bands at this run's NCHW array (C-contiguous float32)."""
        if array is self._array:
            return
        base = array.ctypes.data
        for memory, offset in self._user:
            memory.bind_address(base + offset)
        self._array = array
