"""NCHW and NHWC copies of one (N, C, H, W) tensor between two arrays, cut into row bands.

Each band (an image, or a band of one image's rows) is its own reorder primitive on strided
descriptors (same speed as one whole reorder, measured), so the runtime's workers share a
reorder as they share a conv's bands. Both sides are bound by address each run.
"""
from __future__ import annotations

from typing import Any

from . import abi
from . import binding as dn
from .binding import Memory, MemoryDesc, Primitive

NCHW = "nchw"
NHWC = "nhwc"


def bands(n: int, rows: int, workers: int) -> list[tuple[int, int, int]]:
    """(image, first row, end row) items: one for all images with one worker, whole images
    when there are enough for every worker twice, else bands of each image's rows.
    Image -1 is the whole batch."""
    if workers <= 1:
        return [(-1, 0, rows)]
    per_image = 1 if n >= 2 * workers else min(rows, -(-2 * workers // n))
    step = -(-rows // per_image)
    return [(i, r0, min(rows, r0 + step)) for i in range(n) for r0 in range(0, rows, step)]


def rows_read(p: Any, r0: int, rows: int) -> tuple[int, int, int, int]:
    """(first input row, input rows (0: padding only), top pad, bottom pad) that a conv's
    output rows r0.. read (p: its ConvParams).

    All output rows read all input rows with the op's own pads, even rows a stride skips at
    the bottom: a whole-batch piece's descriptor must keep the real image stride (trimmed
    to the rows read, images after the first were read from the wrong place).
    """
    if r0 == 0 and rows == p.oh:
        return 0, p.h, p.pad[0], p.pad[2]
    (sh, _), (dh, _) = p.strides, p.dilation
    a = r0 * sh - p.pad[0]
    b = (r0 + rows - 1) * sh - p.pad[0] + dh * (p.kh - 1)
    a_in, b_in = max(a, 0), min(b, p.h - 1)
    return a_in, max(b_in - a_in + 1, 0), a_in - a, b - b_in


def is_nhwc(array: Any) -> bool:
    """Whether a 4-D array's bytes are NHWC: the strided NCHW view of an NHWC buffer."""
    if array.ndim != 4:
        return False
    n, c, h, w = array.shape
    size = array.itemsize
    want = (h * w * c * size, size, w * c * size, c * size)
    return all(s == t for s, t, d in zip(array.strides, want, array.shape) if d > 1)


def band_offset(shape: tuple[int, ...], layout: str, image: int, row: int) -> int:
    """Element offset of (image, channel 0, row, column 0) in an array of this layout."""
    n, c, h, w = shape
    if layout == NHWC:
        return (image * h + row) * w * c
    return image * c * h * w + row * w


def band_desc(shape: tuple[int, ...], layout: str, batch: int, rows: int) -> MemoryDesc:
    """The (batch, C, rows, W) band of an array of shape and layout, by its strides."""
    n, c, h, w = shape
    strides = (h * w * c, 1, w * c, c) if layout == NHWC else (c * h * w, h * w, w, 1)
    return MemoryDesc.strided((batch, c, rows, w), strides)


class BandedReorder:
    """Copies of an (N, C, H, W) tensor from an array of one layout into one of another."""

    def __init__(self, shape: tuple[int, int, int, int], src_layout: str, dst_layout: str,
                 pieces: list[tuple[int, int, int]]) -> None:
        """pieces: (image, first row, end row) items, as bands() gives."""
        n = shape[0]
        self.pieces = pieces
        self.items: list[Primitive] = []
        # (source memory, its byte offset, destination memory, its byte offset) per band
        self._bands: list[tuple[Memory, int, Memory, int]] = []
        self._bound: tuple[int, int] = (0, 0)
        for image, r0, r1 in pieces:
            batch = n if image < 0 else 1
            first = max(image, 0)
            src = Memory(band_desc(shape, src_layout, batch, r1 - r0))
            dst = Memory(band_desc(shape, dst_layout, batch, r1 - r0))
            self._bands.append((src, 4 * band_offset(shape, src_layout, first, r0),
                                dst, 4 * band_offset(shape, dst_layout, first, r0)))
            self.items.append(Primitive(dn.reorder(src.desc, dst.desc),
                                        [(abi.ARG_FROM, src), (abi.ARG_TO, dst)]))

    def bind(self, src: int, dst: int) -> None:
        """Point the bands at this run's arrays (their first bytes' addresses)."""
        if (src, dst) == self._bound:
            return
        for src_mem, src_off, dst_mem, dst_off in self._bands:
            src_mem.bind_address(src + src_off)
            dst_mem.bind_address(dst + dst_off)
        self._bound = (src, dst)
