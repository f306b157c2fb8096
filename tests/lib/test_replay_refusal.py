"""Whether a step's recording may be replayed (lib/kernels/replay.py's refusal): a oneDNN memory
must lie in the step's arrays; a vouched team-only recording needs no bounds at all."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from graph_runtime.lib.kernels import replay
from graph_runtime.lib.kernels.onednn import abi, binding
from graph_runtime.lib.kernels.onednn.binding import Memory, MemoryDesc, Primitive

pytestmark = pytest.mark.skipif(not binding.available(),
                                reason=f"oneDNN not loaded: {binding.unavailable_reason()}")


class _Reorder:
    """A step whose whole work is one oneDNN reorder of src into dst, bound by address (its
    memories hold no array, as a kernel binding raw addresses)."""

    def __init__(self, src: np.ndarray, dst: np.ndarray) -> None:
        self.src = Memory(MemoryDesc.plain(src.shape))
        self.dst = Memory(MemoryDesc.plain(dst.shape))
        self.src.bind_address(src.ctypes.data)
        self.dst.bind_address(dst.ctypes.data)
        pd = binding.reorder(self.src.desc, self.dst.desc)
        self.primitive = Primitive(pd, [(abi.ARG_FROM, self.src), (abi.ARG_TO, self.dst)])

    def __call__(self, *arrays: Any) -> None:
        self.primitive.run()
        replay.whole_call(self)


def test_a_recording_inside_its_arrays_replays_the_new_values() -> None:
    src, dst = np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros((3, 4), np.float32)
    step = _Reorder(src, dst)
    recording, why = replay.record(step, (src, dst))
    assert recording is not None, why
    np.testing.assert_array_equal(dst, src)


def test_a_memory_outside_the_steps_arrays_is_refused_by_address() -> None:
    src, dst = np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros((3, 4), np.float32)
    step = _Reorder(src, dst)
    recording, why = replay.record(step, (src,))  # dst is not among the step's arrays
    assert recording is None
    assert f"a oneDNN memory at {dst.ctypes.data:#x} lies outside the step's arrays" in why


def test_a_strided_view_counts_its_whole_reach() -> None:
    """A transposed view's bytes run from its first element's address to its last's: the
    memory at the buffer's start lies inside it."""
    base = np.zeros((4, 3), np.float32)
    src = np.ones((4, 3), np.float32)
    step = _Reorder(src, base)
    recording, why = replay.record(step, (src, base.T))
    assert recording is not None, why
