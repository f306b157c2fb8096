"""A step's foreign calls recorded while it runs, and replayed by one compiled loop.

A small model's kernels match ONNX Runtime's node for node, yet its run is slower: the steps
lose their time between them, in the interpreter, whose objects the kernel before pushed out
of the cores' caches (GPT-2-tiny's 29 steps took 530 us in the run against 363 alone;
docs/measurements.md). Most steps end in one or a few foreign calls with arguments that do not
change from run to run: a oneDNN primitive executed on memories at fixed addresses, or a cfunc
run by every thread of oneDNN's OpenMP team on a block of addresses and sizes. Those calls are
recorded here once and replayed every later run from one compiled loop, with no Python between
them (runtime/native_runs.py decides when, and for which steps).

A recording is safe to replay only when the recorded calls were the whole of the step's work
on its arrays. The step's own kernel says so by calling `whole_call(itself)` on such a path
(a kernel that wraps another never inherits the inner kernel's word: the executor takes the
word of the step's function alone). Every address a replay touches is kept alive by it:
oneDNN memories get memories of the replay's own, at the addresses the step used, which must
lie inside the step's arrays or an array a memory holds; a team kernel's block is kept with
the arrays block() read.
"""
from __future__ import annotations

import threading
from typing import Any, NamedTuple

import numpy as np

TEAM = 0  # ops table kinds: a team kernel (GOMP_parallel) ...
ONEDNN = 1  # ... or a oneDNN primitive executed (dnnl_primitive_execute)
COLUMNS = 5  # (kind, a, b, c, d) per recorded call


class PrimitiveCall(NamedTuple):
    """A primitive executed: its memories' (argument kind, descriptor, address, the array the
    memory holds or None), and its scratchpad's descriptor and size (None, 0 without one)."""

    primitive: Any
    memories: list[tuple[int, Any, int, Any]]
    scratch_desc: Any
    scratch_bytes: int


class TeamCall(NamedTuple):
    """A cfunc run by the OpenMP team on a block (an int64 array); counter: the address of an
    entry set to 0 before each run (a kernel's row counter), or 0; threads: the team's size
    asked of GOMP_parallel (0: the thread's OpenMP default; 1: the calling thread alone)."""

    address: int
    block: np.ndarray
    counter: int
    threads: int


class Recording:
    """What one step's call did by foreign calls, on the thread recording it."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.calls: list[PrimitiveCall | TeamCall] = []
        self.arrays: list[Any] = []  # what the blocks point into (block()): kept by the replay
        self.threads: set[int | None] = set()  # OpenMP team sizes the calls ran with
        self.declared: Any = None  # the kernel that said the calls were its whole work
        self.refused = ""  # why the step cannot be replayed, when a call said so

    def _here(self) -> bool:
        if threading.get_ident() == self.thread:
            return True
        self.refused = "a foreign call ran on another thread"
        return False

    def primitive(self, primitive: Any) -> None:
        if not self._here():
            return
        from .onednn import binding
        memories = []
        scratch = primitive._scratch
        for arg, memory in zip(primitive.args, primitive.memories):
            if memory is not scratch:
                memories.append((int(arg.arg), memory.desc, int(memory._address),
                                 memory._array))
        self.calls.append(PrimitiveCall(
            primitive, memories, None if scratch is None else scratch.desc,
            primitive.pd.scratchpad_bytes if scratch is not None else 0))
        self.threads.add(binding.threads_in_use())

    def team(self, address: int, block: np.ndarray, counter: int = 0, threads: int = 0) -> None:
        if not self._here():
            return
        from .onednn import binding
        self.calls.append(TeamCall(int(address), block, int(counter), threads))
        self.threads.add(binding.threads_in_use())


active: Recording | None = None  # the recording in progress, on its thread (one at a time)
_lock = threading.Lock()


def start() -> Recording | None:
    """A recording of the next call on this thread; None while another one is in progress
    (a sub-module run from inside a recorded step)."""
    global active
    with _lock:
        if active is not None:
            return None
        active = Recording()
        return active


def stop(recording: Recording) -> None:
    global active
    with _lock:
        if active is recording:
            active = None


def whole_call(kernel: Any) -> None:
    """Said by kernel, a step's function, on a path where its call was nothing but the foreign
    calls recorded (primitive runs, team kernels) on arrays that stay where they are while the
    step's arguments and its inputs' write counters do not change."""
    recording = active
    if recording is not None and recording.thread == threading.get_ident():
        recording.declared = kernel


def note_arrays(arrays: list[Any]) -> None:
    """The arrays a team kernel's block points into (omp_team.block), kept by a replay."""
    recording = active
    if recording is not None and recording.thread == threading.get_ident():
        recording.arrays.extend(arrays)
