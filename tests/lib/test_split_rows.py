"""The CPU split kernel (lib/kernels/cpu/split_rows.py): NumPy's copies of each output's slice,
and, while a replay records, the same copies as one team function the replay runs again."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.lib.kernels import replay
from graph_runtime.lib.kernels.cpu.split_rows import HostSplit
from graph_runtime.lib.kernels.onednn import binding

CASES = [((3, 5, 7), 0, [(0, 1), (1, 2)]), ((3, 5, 7), 1, [(0, 2), (2, 1), (3, 2)]),
         ((3, 5, 7), 2, [(0, 3), (3, 4)]), ((2, 96), 1, [(0, 32), (32, 32), (64, 32)]),
         ((4,), 0, [(0, 1), (1, 3)])]


def _outs(shape: tuple[int, ...], axis: int, pieces: list[tuple[int, int]],
          dtype: str) -> list[np.ndarray]:
    return [np.full(shape[:axis] + (count,) + shape[axis + 1:], 7, dtype)
            for _, count in pieces]


def _check(x: np.ndarray, outs: list[np.ndarray], axis: int,
           pieces: list[tuple[int, int]]) -> None:
    for out, (start, count) in zip(outs, pieces):
        np.testing.assert_array_equal(out, np.take(x, range(start, start + count), axis=axis))


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8"])
@pytest.mark.parametrize("shape,axis,pieces", CASES)
def test_split_copies_each_slice(shape, axis, pieces, dtype) -> None:
    x = np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)
    outs = _outs(shape, axis, pieces, dtype)
    HostSplit(np, axis, pieces)(x, *outs)
    _check(x, outs, axis, pieces)


@pytest.mark.skipif(not binding.available(),
                    reason=f"oneDNN not loaded: {binding.unavailable_reason()}")
@pytest.mark.parametrize("dtype", ["float32", "int64"])
@pytest.mark.parametrize("shape,axis,pieces", CASES)
def test_a_recorded_split_vouches_and_its_replay_copies_the_new_values(shape, axis, pieces,
                                                                       dtype) -> None:
    """Recorded, the split vouches for its call (one team function); its replay copies what x
    holds when it runs, into the same outputs."""
    kernel = HostSplit(np, axis, pieces)
    x = np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)
    outs = _outs(shape, axis, pieces, dtype)
    recording, why = replay.record(kernel, (x, *outs))
    assert recording is not None, why
    _check(x, outs, axis, pieces)
    again = replay.replayed_call(kernel, (x, *outs))
    assert again is not None
    x[...] = (np.arange(x.size)[::-1] % 100).reshape(shape)  # new values, where they were
    for out in outs:
        out[...] = 0
    again()
    _check(x, outs, axis, pieces)


def test_a_strided_input_is_copied_by_numpy_and_not_vouched() -> None:
    """An input that is not C-contiguous (a transposed view) is copied by NumPy, its call
    not vouched for."""
    x = np.arange(24, dtype=np.float32).reshape(4, 6).T  # (6, 4), strided
    pieces = [(0, 2), (2, 4)]
    outs = _outs(x.shape, 0, pieces, "float32")
    recording, why = replay.record(HostSplit(np, 0, pieces), (x, *outs))
    assert recording is None and why == replay.NOT_VOUCHED
    _check(x, outs, 0, pieces)
