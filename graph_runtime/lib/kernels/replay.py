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

import ctypes
import threading
import weakref
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from ... import settings
from ...errors import LibraryError
from .address import address_of

TEAM = 0  # ops table kinds: a team kernel (GOMP_parallel), ...
ONEDNN = 1  # ... a oneDNN primitive executed (dnnl_primitive_execute) ...
COPY = 2  # ... or bytes copied (a kernel's staged output into its array)
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


class CopyCall(NamedTuple):
    """nbytes copied from the address src to the address dst (C-contiguous buffers)."""

    dst: int
    src: int
    nbytes: int


class Recording:
    """What one step's call did by foreign calls, on the thread recording it."""

    def __init__(self) -> None:
        self.calls: list[PrimitiveCall | TeamCall | CopyCall] = []
        self.arrays: list[Any] = []  # what the blocks point into (block()): kept by the replay
        self.threads: set[int | None] = set()  # OpenMP team sizes the calls ran with
        self.declared: Any = None  # the kernel that said the calls were its whole work

    def primitive(self, primitive: Any) -> None:
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
        from .onednn import binding
        self.calls.append(TeamCall(int(address), block, int(counter), threads))
        self.threads.add(binding.threads_in_use())

    def copy(self, dst: np.ndarray, src: np.ndarray) -> bool:
        """src's bytes copied into dst, recorded where both are C-contiguous arrays of the same
        size (kept by the replay); False where they are not (the caller copies itself)."""
        if not (dst.flags.c_contiguous and src.flags.c_contiguous and dst.nbytes == src.nbytes
                and dst.dtype == src.dtype):
            return False
        self.calls.append(CopyCall(dst.ctypes.data, src.ctypes.data, dst.nbytes))
        self.arrays.extend((dst, src))
        return True


class _Recordings:
    """The recordings in progress, one per recording thread: a foreign call made on another
    thread (a runtime worker's, another module's) is not its step's."""

    def __init__(self) -> None:
        self.by_thread: dict[int, Recording] = {}

    def here(self) -> Recording | None:
        return self.by_thread.get(threading.get_ident())

    def primitive(self, primitive: Any) -> None:
        recording = self.here()
        if recording is not None:
            recording.primitive(primitive)

    def team(self, address: int, block: np.ndarray, counter: int = 0, threads: int = 0) -> None:
        recording = self.here()
        if recording is not None:
            recording.team(address, block, counter, threads)


_recordings = _Recordings()
# _recordings while any thread records, else None: the one check the per-call paths make
active: _Recordings | None = None
_lock = threading.Lock()


def recording_here() -> Recording | None:
    """The calling thread's recording in progress, if any."""
    return None if active is None else active.here()


def start() -> Recording | None:
    """A recording of the next call on this thread; None while this thread records already
    (a sub-module run from inside a recorded step)."""
    global active
    with _lock:
        thread = threading.get_ident()
        if thread in _recordings.by_thread:
            return None
        recording = _recordings.by_thread[thread] = Recording()
        active = _recordings
        return recording


def stop(recording: Recording) -> None:
    global active
    with _lock:
        thread = threading.get_ident()
        if _recordings.by_thread.get(thread) is recording:
            del _recordings.by_thread[thread]
        if not _recordings.by_thread:
            active = None


def whole_call(kernel: Any) -> None:
    """Said by kernel, a step's function, on a path where its call was nothing but the foreign
    calls recorded (primitive runs, team kernels) on arrays that stay where they are while the
    step's arguments and its inputs' write counters do not change."""
    recording = recording_here()
    if recording is not None:
        recording.declared = kernel


def vouched(fn: Callable[..., Any], *args: Any) -> bool:
    """fn(*args), a kernel called by another on the recording thread: whether fn vouched for
    its call (its word taken back after: the caller gives its own, for its whole call)."""
    recording = recording_here()
    assert recording is not None
    recording.declared = None
    fn(*args)
    said = recording.declared is fn
    recording.declared = None
    return said


def same_objects(before: Sequence[Any], now: Sequence[Any]) -> bool:
    """Whether a call's arguments are the very objects they were (a recording, or a block,
    holds the arguments it was made for)."""
    return len(before) == len(now) and all(a is b for a, b in zip(before, now))


def contiguous(arrays: Sequence[Any]) -> bool:
    """Whether every array is C-contiguous: a kernel's reshapes of them are views, never
    copies (a copy made at the recorded call would be read again, stale, by every replay)."""
    return all(a.flags.c_contiguous for a in arrays)


def note_arrays(arrays: list[Any]) -> None:
    """Arrays the recorded calls reach by address (a team kernel's block's: omp_team.block),
    kept by a replay."""
    recording = recording_here()
    if recording is not None:
        recording.arrays.extend(arrays)


def _bounds(arrays: Sequence[Any]) -> list[tuple[int, int]]:
    """[low, high) byte ranges of the NumPy arrays among arrays (views, any strides)."""
    found = []
    for a in arrays:
        if isinstance(a, np.ndarray) and a.size:
            low = high = address_of(a)
            for size, stride in zip(a.shape, a.strides):
                reach = (size - 1) * stride
                low, high = (low + reach, high) if reach < 0 else (low, high + reach)
            found.append((low, high + a.itemsize))
    return found


NOT_VOUCHED = "its kernel did not vouch for the calls recorded"


def refusal(fn: Any, args: Sequence[Any], recording: Recording) -> str:
    """Why the recording of fn(*args) cannot be replayed, or "" when it can: fn vouched for
    it, its calls ran with one OpenMP thread count, and every oneDNN memory's first byte lies
    in one of args or in the array the memory held (a strided descriptor's size counts from
    its buffer's start: a head's view of fused q, k, v reaches past its own offset)."""
    if recording.declared is not fn:
        return NOT_VOUCHED
    if not recording.calls:
        return "no foreign call recorded"
    if len(recording.threads) != 1 or None in recording.threads:
        return "its calls ran with different or unset OpenMP thread counts"
    primitives = [call for call in recording.calls if isinstance(call, PrimitiveCall)]
    if not primitives:  # (a team kernel's block is kept with the arrays it reads: note_arrays)
        return ""
    # NOTE: worked out only for primitives: every array's bounds cost a decode step's
    # recording ~25 us a team kernel, ~1 ms a run
    bounds = _bounds(list(args) + recording.arrays)
    for call in primitives:
        for _, _, address, held in call.memories:
            if not any(low <= address < high for low, high in bounds + _bounds([held])):
                return (f"a oneDNN memory at {address:#x} lies outside the step's arrays "
                        f"and the array its memory held")
    return ""


def record(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[Recording | None, str]:
    """fn(*args) called once with its foreign calls recorded: the recording, or None and why
    it cannot be replayed."""
    recording = start()
    if recording is None:
        fn(*args)
        return None, "recorded inside another recording"
    try:
        fn(*args)
    finally:
        stop(recording)
    why = refusal(fn, args, recording)
    return (None, why) if why else (recording, "")


class Scratchpad:
    """The scratchpad buffer of the replays of one runner (one thread's runs), grown where a
    recording needs more, the memories bound to it rebound then."""

    def __init__(self) -> None:
        self.buffer: Any = None
        self._memories: weakref.WeakSet[Any] = weakref.WeakSet()

    def bind(self, memory: Any, nbytes: int) -> None:
        from .onednn import binding
        if self.buffer is None or self.buffer.nbytes < nbytes:
            self.buffer = binding.aligned_scratch(nbytes)
            for held in self._memories:
                held.bind_address(self.buffer.ctypes.data)
        memory.bind_address(self.buffer.ctypes.data)
        self._memories.add(memory)


class Rows:
    """One replayable recording's calls as rows of the loop's table, made once: a primitive's
    execute arguments are memories of its own at the recorded addresses (the primitive's
    own memories stay as its kernel binds them), its scratchpad the runner's."""

    def __init__(self, recording: Recording, scratchpad: Scratchpad) -> None:
        threads = next(iter(recording.threads))
        assert threads is not None  # (refusal: one count, set)
        self.threads = threads
        self.recording = recording  # holds the blocks, the arrays and the primitives
        self.scratchpad = scratchpad  # held: its buffer is what the memories point at
        self._kept: list[Any] = []
        rows = []
        for call in recording.calls:
            if isinstance(call, TeamCall):
                rows.append((TEAM, call.address, call.block.ctypes.data, call.counter,
                             call.threads))
            elif isinstance(call, CopyCall):
                rows.append((COPY, call.dst, call.src, call.nbytes, 0))
            else:
                count, address = self._arguments(call, scratchpad)
                rows.append((ONEDNN, call.primitive.handle.value, count, address, 0))
        self.table = np.array(rows, np.int64).reshape(-1, COLUMNS)

    def _arguments(self, call: PrimitiveCall, scratchpad: Scratchpad) -> tuple[int, int]:
        from .onednn import binding
        from .onednn.abi import ARG_SCRATCHPAD, ExecArg
        memories = []
        for arg, desc, address, _ in call.memories:
            memory = binding.Memory(desc)
            memory.bind_address(address)
            memories.append((arg, memory))
        if call.scratch_desc is not None:
            memory = binding.Memory(call.scratch_desc)
            scratchpad.bind(memory, call.scratch_bytes)
            memories.append((ARG_SCRATCHPAD, memory))
        args = (ExecArg * len(memories))(*[ExecArg(arg, m.handle) for arg, m in memories])
        self._kept.append((memories, args))
        return len(memories), ctypes.addressof(args)


class Replay:
    """Consecutive recordings' rows (one OpenMP thread count), run by one call of the compiled
    loop on the recording thread. names: what each recording's call was, for the error of a
    primitive that fails."""

    def __init__(self, rows: Sequence[Rows], names: Sequence[str],
                 steps: Sequence[Any] = ()) -> None:
        from .cpu.replay_loop import replay_loop
        from .onednn import binding
        self.rows = list(rows)
        self.names = list(names)
        self.steps = list(steps)  # what the rows stand for (a runner's steps)
        self.threads = rows[0].threads
        self.loop = replay_loop()
        self.table = np.concatenate([r.table for r in rows]) if len(rows) > 1 else rows[0].table
        self.call_of_row = [i for i, r in enumerate(rows) for _ in range(len(r.table))]
        self.status = np.zeros(1, np.int64)
        self._use_threads = binding.use_threads
        self._call = (self.table.ctypes.data, len(self.table), binding.thread_stream(),
                      self.status.ctypes.data)

    def __call__(self) -> None:
        self._use_threads(self.threads)  # as each recorded call had it (one check when set)
        failed = self.loop(*self._call)
        if failed >= 0:
            from .onednn.abi import STATUS_NAMES
            status = int(self.status[0])
            raise LibraryError(f"{self.names[self.call_of_row[failed]]}: oneDNN "
                               f"dnnl_primitive_execute (replayed) failed: "
                               f"{STATUS_NAMES.get(status, status)}")


def timing_word() -> str:
    """", replayed warm" where the tuning service times kernels as replays recorded at their
    second call (replayed_call), for its keys: a choice timed with each call made from Python,
    or as a replay of its first call (", replayed", to 2026-12-07), is not taken for one timed
    so."""
    return ", replayed warm" if settings.word(settings.REPLAY) == "on" else ""


LOOP_NOT_READY = ("the replay loop would set numba up, which nothing else in this process "
                  "needed so far")


def loop_ready() -> bool:
    """Whether the replay loop may be compiled (or loaded) now: numba is set up, or being set
    up, for this process's other kernels. Not for oneDNN primitives alone in a process that
    never set numba up: the set-up costs 0.2-0.4 s (cpu/jit_setup.py) for microseconds a run."""
    from .cpu import jit_setup
    return jit_setup.in_use()


def replayed_call(fn: Callable[..., Any], args: Sequence[Any]) -> Callable[[], None] | None:
    """fn(*args) as a one-call replay (a kernel timed as it will run in a replayed module:
    the tuning service's races), or None where it cannot be (called twice meanwhile).

    Recorded at its second call, as a module records at its second run: a first call makes
    what a kernel derives once (a packed or reordered weight, by a oneDNN reorder), which a
    recording of it would replay at every call (a RegNet squeeze-excite conv's oneDNN replay
    timed 27.8 us so against 14.0, and lost its race to OpenBLAS's 26)."""
    from .onednn import binding
    if settings.word(settings.REPLAY) == "off" or not binding.available() or not loop_ready():
        return None
    fn(*args)
    recording, _ = record(fn, args)
    if recording is None:
        return None
    return Replay([Rows(recording, Scratchpad())], [getattr(fn, "__name__", type(fn).__name__)])
