"""float32_dims: the block's view of a site's arrays, each read once while it is handed again."""
from __future__ import annotations

import ctypes

import numpy as np

from graph_runtime.lib.kernels.cpu.block_site import DimsMemo, float32_dims


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
