"""One node's calls of a team function on a block of its own, which follows the node's arrays.

A decoder's attention and KV append take new arrays at every new past length (runtime/
specialize.py's retarget makes new views). Called from Python they cost 20-35 us a layer in a
decode step, against 5-14 us of work: the interpreter runs on caches the dense products before
filled. Replayed (kernels/replay.py) a step's recorded call reads its block by address; here
that block is the site's own, rewritten in place when the step is handed new arrays
(`follow`, which runtime/native_runs.py asks before recording the step again), so the replay
stretch the step sits in is kept as recorded, with no Python for the step at all.

The block holds the arrays the site was last recorded or followed with (`args`): a call with
those very arrays runs the team function on it; a call with others (a plain run at a new shape
before any recording) runs the subclass's plain path and leaves the block alone, which a
replay may still read; a call while a replay records takes the block over for its arrays.
"""
from __future__ import annotations

import ctypes
import struct
import weakref
from abc import ABC, abstractmethod
from typing import Any, Sequence

import numpy as np

from ....errors import GraphRuntimeError
from .. import replay
from .omp_team import gomp_loaded, recording_here, run_here


# the blocks a site keeps for arrays it may be handed again (as many as a symbolic module keeps
# shapes: symbolic_module.DEFAULT_CACHE_SIZE)
WRITTEN_KEPT = 512


class BlockSite(ABC):
    """A node's call site (PreparedKernel.call_site) running a team function on its block."""

    def __init__(self, size: int) -> None:
        self.block = np.zeros(size, np.int64)
        self.args: tuple[Any, ...] | None = None  # the arrays the block holds
        # written in one call (a NumPy assignment from a list of 40 ints took ~8 us)
        self._bytes = self.block.data.cast("B")
        self._pack = struct.Struct(f"={size}q").pack_into
        # the blocks written (recorded or followed), by their arrays' ids, with weak references
        # to those arrays (an id is another array's once its own is gone): the very arrays
        # handed back (Executor.restore gives a length met before the views it ran with: a
        # server's next generation) take their block back instead of reading each one again
        self._written: dict[tuple[int, ...], tuple[tuple[Any, ...], bytes]] = {}

    @abstractmethod
    def function(self) -> Any:
        """The team kernel (a cfunc reading the block)."""

    @abstractmethod
    def values(self, args: Sequence[Any]) -> list[int] | None:
        """The block's entries for args (ints: arrays by address, floats by their bits),
        as many as the block holds; None where the team function does not take them (not
        C-contiguous float32, say)."""

    @abstractmethod
    def plain(self, *args: Any) -> None:
        """The call without the block (a plain run before any recording)."""

    def __call__(self, *args: Any) -> None:
        held = self.args
        if held is None or not replay.same_objects(held, args):
            if not recording_here() or not self._fill(args):
                self.plain(*args)
                return
        run_here(self.function(), self.block)
        if replay.active is not None:
            replay.whole_call(self)

    def follow(self, *args: Any) -> bool:
        """The block rewritten for args (the step's new arrays), so that a replay of its
        recorded call runs on them; False, the block unchanged, where the team function does
        not take them (the step is then recorded again or called plainly, and a shape the
        kernel refuses is refused there, the node named)."""
        if not gomp_loaded():  # (a recording ran the team function: it loaded)
            return False
        ids = tuple(map(id, args))
        written = self._written.get(ids)
        if written is not None and all(ref() is a for ref, a in zip(written[0], args)):
            self._bytes[:] = written[1]
            self.args = args
            return True
        try:
            return self._fill(args)
        except GraphRuntimeError:
            return False

    def _fill(self, args: Sequence[Any]) -> bool:
        values = self.values(args)
        if values is None or len(values) != len(self.block):
            return False
        self._pack(self._bytes, 0, *values)
        self.args = tuple(args)
        try:
            refs = tuple(map(weakref.ref, args))
        except TypeError:  # (an argument no weak reference can hold: not kept)
            return True
        if len(self._written) >= WRITTEN_KEPT:
            del self._written[next(iter(self._written))]  # the oldest
        self._written[tuple(map(id, args))] = (refs, bytes(self._bytes))
        return True


class DimsMemo:
    """The arrays float32_dims read last for one site, and what it made of them: an array
    handed again (the same object, whose address and dims a NumPy array keeps) is not read
    again. A decode step's new length moves 3 of an attention's 5 arrays and 4 of a KV
    append's 8, and each read took ~0.6 us (~2 after the weights' stream)."""

    __slots__ = ("arrays", "values")

    def __init__(self) -> None:
        self.arrays: tuple[Any, ...] = ()
        self.values: list[int] = []


def float32_dims(arrays: Sequence[Any], ranks: Sequence[int],
                 memo: DimsMemo | None = None) -> list[int] | None:
    """Each array's address, then its dims (the block's view of it), where every array is a
    C-contiguous float32 NumPy array of the rank in ranks, which float32_at reads; else None.
    (ctypes' view of the buffer refuses a strided or read-only one: the check and the address
    in one call.) memo: the site's last answer, whose arrays are not read again (kept there
    with this answer)."""
    if len(arrays) != len(ranks):
        return None
    before = memo.arrays if memo is not None and len(memo.arrays) == len(arrays) else ()
    values: list[int] = []
    at = 0
    for i, (a, rank) in enumerate(zip(arrays, ranks)):
        if before and a is before[i]:
            values.extend(memo.values[at:at + 1 + rank])  # type: ignore[union-attr]
            at += 1 + rank
            continue
        at += 1 + rank
        if type(a) is not np.ndarray or (a.dtype is not _FLOAT32 and a.dtype != _FLOAT32) \
                or len(a.shape) != rank:
            return None
        try:
            values.append(_addressof(_view(a)))
        except (TypeError, ValueError, BufferError):
            if a.size or not a.flags.c_contiguous:  # (an empty one: read nowhere)
                return None
            values.append(0)
        values.extend(a.shape)
    if memo is not None:
        memo.arrays, memo.values = tuple(arrays), values
    return values


_FLOAT32 = np.dtype(np.float32)
_addressof = ctypes.addressof
_view: Any = ctypes.c_char.from_buffer  # (address.py's way, fused with the checks)
