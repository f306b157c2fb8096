"""run() on the CPU with the steps' foreign calls replayed from one compiled loop.

The kernels of a small model match ONNX Runtime's node for node, and the run still loses: the
interpreter between the steps runs on caches the kernel before filled with its own data
(lib/kernels/replay.py). Here, as a CUDA graph does on a GPU (cuda_graph.py), the first run()
runs plainly (kernels compile, buffers are made), the second records what each step called,
and later runs replay: each stretch of two or more consecutive steps whose kernels vouched for
their recording (replay.whole_call) runs as one call of the compiled loop (cpu/replay_loop.py),
the other steps are called as before, in order.

A replay holds what its calls reach: oneDNN memories of its own at the addresses the steps
used (each inside one of the step's arrays or an array the memory held), one scratchpad, the
blocks and arrays of the team kernels. It records again after anything that could move what
the calls read: the executor's arguments changed (rebind, a new plan: invalidate), any input's
write counter counted or made volatile (InputVersion.changes), or the OpenMP thread count the
steps ran with changed. A run on another thread than the recording one runs plainly (a oneDNN
stream and an OpenMP team belong to a thread). GRAPH_RUNTIME_REPLAY=off turns it off.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any, Callable, Sequence

import numpy as np

from .. import settings
from ..errors import LibraryError
from ..lib.kernels import replay
from ..lib.library import InputVersion
from .steps import PreparedCall

log = logging.getLogger("graph_runtime")
Call = tuple[Callable[..., Any], Sequence[Any]]


def _bounds(arrays: Sequence[Any]) -> list[tuple[int, int]]:
    """[low, high) byte ranges of the NumPy arrays among arrays (views, any strides)."""
    found = []
    for a in arrays:
        if isinstance(a, np.ndarray) and a.size:
            low = high = a.__array_interface__["data"][0]
            for size, stride in zip(a.shape, a.strides):
                reach = (size - 1) * stride
                low, high = (low + reach, high) if reach < 0 else (low, high + reach)
            found.append((low, high + a.itemsize))
    return found


def _inside(address: int, nbytes: int, bounds: list[tuple[int, int]]) -> bool:
    return any(low <= address and address + nbytes <= high for low, high in bounds)


def replayable(step: PreparedCall, fn: Callable[..., Any], args: Sequence[Any],
               recording: replay.Recording) -> str:
    """Why this step's recording cannot be replayed, or "" when it can."""
    if recording.refused:
        return recording.refused
    if recording.declared is not fn:
        return "its kernel did not vouch for the calls recorded"
    if not recording.calls:
        return "no foreign call recorded"
    if len(recording.threads) != 1 or None in recording.threads:
        return "its calls ran with different or unset OpenMP thread counts"
    bounds = _bounds(list(args) + recording.arrays)
    for call in recording.calls:
        if isinstance(call, replay.PrimitiveCall):
            for _, desc, address, held in call.memories:
                if not _inside(address, desc.size(), bounds + _bounds([held])):
                    return (f"a oneDNN memory at {address:#x} lies outside the step's arrays "
                            f"and the array its memory holds")
    return ""


class Replay:
    """Consecutive steps' recorded calls, run by one call of the compiled loop."""

    def __init__(self, steps: list[PreparedCall], recordings: list[replay.Recording],
                 threads: int) -> None:
        from ..lib.kernels.cpu.replay_loop import replay_loop
        from ..lib.kernels.onednn import binding
        self.steps = steps
        self.threads = threads
        self.loop = replay_loop()
        self.thread = threading.get_ident()
        calls = [call for r in recordings for call in r.calls]
        self.kept: list[Any] = [r.arrays for r in recordings] + [calls]
        rows = []
        self.step_of_row: list[int] = []
        scratch_bytes = max((c.scratch_bytes for c in calls
                             if isinstance(c, replay.PrimitiveCall)), default=0)
        self.scratch = binding.aligned_scratch(scratch_bytes) if scratch_bytes else None
        for index, recording in enumerate(recordings):
            for call in recording.calls:
                self.step_of_row.append(index)
                if isinstance(call, replay.TeamCall):
                    rows.append((replay.TEAM, call.address, call.block.ctypes.data,
                                 call.counter, call.threads))
                    continue
                args, address = self._arguments(call)
                rows.append((replay.ONEDNN, call.primitive.handle.value, len(args), address, 0))
        self.table = np.array(rows, np.int64).reshape(-1, replay.COLUMNS)
        self.status = np.zeros(1, np.int64)
        self.stream = binding.thread_stream()
        self._call = (self.table.ctypes.data, len(rows), self.stream,
                      self.status.ctypes.data)

    def _arguments(self, call: replay.PrimitiveCall) -> tuple[Any, int]:
        """The execute arguments of memories of this replay's own, at the recorded addresses."""
        from ..lib.kernels.onednn import binding
        from ..lib.kernels.onednn.abi import ARG_SCRATCHPAD, ExecArg
        memories = []
        for arg, desc, address, _ in call.memories:
            memory = binding.Memory(desc)
            memory.bind_address(address)
            memories.append((arg, memory))
        if call.scratch_desc is not None:
            memory = binding.Memory(call.scratch_desc)
            memory.bind_address(self.scratch.ctypes.data)
            memories.append((ARG_SCRATCHPAD, memory))
        args = (ExecArg * len(memories))(*[ExecArg(arg, m.handle) for arg, m in memories])
        self.kept.append((memories, args))
        return args, ctypes.addressof(args)

    def __call__(self) -> None:
        failed = self.loop(*self._call)
        if failed >= 0:
            from ..lib.kernels.onednn.abi import STATUS_NAMES
            step = self.steps[self.step_of_row[failed]]
            status = int(self.status[0])
            raise LibraryError(f"{step.label} ({step.func_name} on {step.device}) failed: "
                               f"oneDNN dnnl_primitive_execute (replayed) failed: "
                               f"{STATUS_NAMES.get(status, status)}")


class NativeRuns:
    """run() for one executor: plain, then recorded, then replayed where the steps allow."""

    def __init__(self, calls: list[Call], steps: list[PreparedCall],
                 run_calls: Callable[[list[Call], list[PreparedCall]], None],
                 source: str) -> None:
        self.calls, self.steps = calls, steps
        self.run_calls = run_calls
        self.source = source
        self.state = "warming"  # -> recording -> replaying (or plain: nothing to replay)
        self.plan: list[Call] = []
        self.plan_steps: list[PreparedCall] = []
        self.replays: list[Replay] = []
        self.reasons: dict[int, str] = {}  # step index: why it is not replayed
        self._changes = -1
        self._thread = 0

    def invalidate(self) -> None:
        """What the steps read moved (a rebind, a new plan): record again after a plain run."""
        self.state, self.plan, self.plan_steps, self.replays = "warming", [], [], []

    def run(self) -> None:
        if self.state == "replaying":
            if InputVersion.changes == self._changes and threading.get_ident() == self._thread \
                    and all(_threads_now() == r.threads for r in self.replays[:1]):
                self.run_calls(self.plan, self.plan_steps)
                return
            if threading.get_ident() != self._thread:
                self.run_calls(self.calls, self.steps)
                return
            self.invalidate()
        if self.state == "warming" or replay.active is not None:
            self.run_calls(self.calls, self.steps)
            if self.state == "warming":
                self.state = "recording"
            return
        if self.state == "recording":
            self._record()
            return
        self.run_calls(self.calls, self.steps)

    def _record(self) -> None:
        """Run each step with its foreign calls recorded, then make the replays."""
        recordings: list[replay.Recording | None] = []
        changes = InputVersion.changes

        def recorded(index: int, fn: Callable[..., Any]) -> Callable[..., None]:
            def call(*args: Any) -> None:
                recording = replay.start()
                try:
                    fn(*args)
                finally:
                    if recording is not None:
                        replay.stop(recording)
                recordings[index] = recording
            return call
        recordings.extend([None] * len(self.calls))
        self.run_calls([(recorded(i, fn), args) for i, (fn, args) in enumerate(self.calls)],
                       self.steps)
        if InputVersion.changes != changes:  # a kernel derived data while recorded: again
            return
        self._plan(recordings)

    def _plan(self, recordings: list[replay.Recording | None]) -> None:
        self.reasons = {}
        ok: list[int | None] = []  # per step: its calls' thread count where replayable
        for index, ((fn, args), step, recording) in enumerate(zip(self.calls, self.steps,
                                                                  recordings)):
            why = "recorded inside another recording" if recording is None else \
                replayable(step, fn, args, recording)
            if why:
                self.reasons[index] = why
                ok.append(None)
            else:
                assert recording is not None
                ok.append(next(iter(recording.threads)))
        plan: list[Call] = []
        plan_steps: list[PreparedCall] = []
        replays = []
        index = 0
        while index < len(self.calls):
            end = index
            while end < len(self.calls) and ok[end] is not None and ok[end] == ok[index]:
                end += 1
            if end - index >= 2:
                threads = ok[index]
                assert threads is not None
                made = Replay(self.steps[index:end], [r for r in recordings[index:end]
                                                      if r is not None], threads)
                replays.append(made)
                plan.append((_with_threads(made, threads), ()))
                plan_steps.append(self.steps[index])
                index = end
                continue
            plan.append(self.calls[index])
            plan_steps.append(self.steps[index])
            index += 1
        self.replays = replays
        if not replays:
            self.state = "plain"
            return
        self.plan, self.plan_steps = plan, plan_steps
        self._changes = InputVersion.changes
        self._thread = threading.get_ident()
        self.state = "replaying"
        log.debug("%s: %d of %d steps replayed in %d calls", self.source,
                  sum(len(r.steps) for r in replays), len(self.calls), len(replays))

    def replayed_steps(self) -> int:
        """How many steps the replays run (0 before the recording run)."""
        return sum(len(r.steps) for r in self.replays)


def _threads_now() -> int | None:
    from ..lib.kernels.onednn import binding
    return binding.threads_in_use()


def _with_threads(made: Replay, threads: int) -> Callable[[], None]:
    """made, run after giving oneDNN's team its recorded thread count on this thread."""
    from ..lib.kernels.onednn import binding
    use = binding.use_threads

    def run() -> None:
        use(threads)
        made()
    return run


def native_runs(steps: list[PreparedCall], calls: list[Call],
                run_calls: Callable[[list[Call], list[PreparedCall]], None], source: str
                ) -> tuple[NativeRuns | None, str]:
    """The recording runner for an executor's calls, or None and why not."""
    if settings.word(settings.REPLAY) == "off":
        return None, "GRAPH_RUNTIME_REPLAY=off"
    if not any(step.device.kind == "cpu" for step in steps):
        return None, "no step on the CPU"
    from ..lib.kernels.onednn import binding
    if not binding.available():
        return None, "oneDNN is not loaded (" + binding.unavailable_reason() + ")"
    return NativeRuns(calls, steps, run_calls, source), ""
