"""float32_dims: the block's view of a site's arrays, each read once while it is handed again;
BlockSite.follow: the blocks of arrays handed back taken back."""
from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np

from graph_runtime.lib.kernels.cpu import block_site
from graph_runtime.lib.kernels.cpu.block_site import BlockSite, DimsMemo, float32_dims


def _address(a: np.ndarray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(a))


def test_an_array_handed_again_keeps_its_entries_and_a_new_one_is_read() -> None:
    """A decode step's next length: the cache views are new arrays (read: their new dims), the
    token's arrays the same objects (their entries kept); every entry is what a fresh read
    gives, and a strided or float64 array among kept ones is still refused."""
    buf = np.zeros(4096, np.float32)
    q, out = np.zeros((1, 1, 64), np.float32), np.zeros((1, 1, 64), np.float32)
    ranks = (3, 4, 3)
    memo = DimsMemo()
    k = np.ndarray((1, 2, 5, 64), np.float32, buf)
    first = float32_dims((q, k, out), ranks, memo)
    assert first == float32_dims((q, k, out), ranks)
    assert first == [_address(q), 1, 1, 64, _address(buf), 1, 2, 5, 64, _address(out), 1, 1, 64]
    longer = np.ndarray((1, 2, 6, 64), np.float32, buf)
    second = float32_dims((q, longer, out), ranks, memo)
    assert second == float32_dims((q, longer, out), ranks)
    assert second[4:9] == [_address(buf), 1, 2, 6, 64] and memo.arrays[1] is longer
    assert float32_dims((q, longer[:, :, ::2], out), ranks, memo) is None  # strided
    assert float32_dims((q, longer.astype(np.float64), out), ranks, memo) is None
    assert float32_dims((q, longer), ranks, memo) is None  # one array short


class _Site(BlockSite):
    """A site whose block is each array's address and dims (float32_dims), counting reads."""

    def __init__(self) -> None:
        super().__init__(2 * 4)
        self.reads = 0

    def function(self) -> Any:
        raise AssertionError("not run here")

    def values(self, args: Any) -> list[int] | None:
        self.reads += 1
        return float32_dims(args, (3, 3))

    def plain(self, *args: Any) -> None:
        raise AssertionError("not run here")


def test_arrays_handed_back_take_their_block_back_unread(monkeypatch) -> None:
    """follow: the very arrays a block was written for, handed back after others (a server's
    next generation: Executor.restore gives each length the views it ran with), take that
    block back without reading an array; arrays whose ids match an entry kept for others
    (ids are reused once an array is gone) are read."""
    monkeypatch.setattr(block_site, "gomp_loaded", lambda: True)
    buf = np.zeros(4096, np.float32)
    short = (np.ndarray((1, 5, 64), np.float32, buf), np.zeros((1, 1, 64), np.float32))
    long = (np.ndarray((1, 6, 64), np.float32, buf), short[1])
    site = _Site()
    assert site.follow(*short) and site.reads == 1
    first = site.block.copy()
    assert site.follow(*long) and site.reads == 2
    assert site.block.tolist() == float32_dims(long, (3, 3))
    assert site.follow(*short) and site.reads == 2  # taken back, unread
    assert np.array_equal(site.block, first) and site.args == short
    # an entry whose arrays are gone (here: held for others) is not taken for new ones
    ids = tuple(map(id, short))
    refs, kept = site._written[ids]
    others = (np.zeros((1, 5, 64), np.float32), np.zeros((1, 1, 64), np.float32))
    site._written[ids] = (tuple(map(weakref.ref, others)), kept)
    assert site.follow(*short) and site.reads == 3
    assert np.array_equal(site.block, first)
    # bounded: the oldest goes first
    monkeypatch.setattr(block_site, "WRITTEN_KEPT", 2)
    views = [(np.ndarray((1, n, 64), np.float32, buf), short[1]) for n in (2, 3, 4)]
    for args in views:
        assert site.follow(*args)
    assert len(site._written) == 2 and tuple(map(id, views[0])) not in site._written
