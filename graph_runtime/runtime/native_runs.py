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
the calls read: the executor's arguments changed (rebind, a new plan or shape: invalidate), or
any input's write counter was counted or made volatile (InputVersion.changes); and after a run
on another thread than the recording one (a oneDNN stream and an OpenMP team belong to a
thread), which runs plainly. GRAPH_RUNTIME_REPLAY=off turns it off.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

from .. import settings
from ..lib.kernels import replay
from ..lib.library import InputVersion
from .steps import PreparedCall

log = logging.getLogger("graph_runtime")
Call = tuple[Callable[..., Any], Any]  # a function and its argument list


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
        self.replays: list[replay.Replay] = []
        self.replayed = 0  # steps the replays run
        self.reasons: dict[int, str] = {}  # step index: why it is not replayed
        self._changes = -1
        self._thread = 0

    def invalidate(self) -> None:
        """What the steps read moved (a rebind, a new plan): record again after a plain run."""
        self.state, self.plan, self.plan_steps, self.replays = "warming", [], [], []
        self.replayed = 0

    def run(self) -> None:
        if self.state == "replaying":
            if InputVersion.changes == self._changes and threading.get_ident() == self._thread:
                self.run_calls(self.plan, self.plan_steps)
                return
            # a write counter moved (derived data may be made again), or another thread runs
            # (a stream and a team of its own): recorded again, there
            self.invalidate()
        if self.state == "recording" and replay.recording_here() is None:
            self._record()
            return
        self.run_calls(self.calls, self.steps)
        if self.state == "warming":
            self.state = "recording"

    def _record(self) -> None:
        """Run each step with its foreign calls recorded, then plan the replays."""
        found: list[tuple[replay.Recording | None, str]] = []
        changes = InputVersion.changes

        def recorded(fn: Callable[..., Any]) -> Callable[..., None]:
            def call(*args: Any) -> None:
                found.append(replay.record(fn, args))
            return call
        self.run_calls([(recorded(fn), args) for fn, args in self.calls], self.steps)
        if InputVersion.changes == changes:  # else a counter moved meanwhile: record again
            self._plan(found)

    def _plan(self, found: list[tuple[replay.Recording | None, str]]) -> None:
        """Stretches of two or more replayable steps of one thread count become replays."""
        if not replay.loop_ready():
            self.reasons = {i: replay.LOOP_NOT_READY for i in range(len(self.calls))}
            self.state = "plain"
            return
        self.reasons = {i: why for i, (recording, why) in enumerate(found) if recording is None}

        def threads(index: int) -> int | None:
            recording = found[index][0]
            return None if recording is None else next(iter(recording.threads))
        plan: list[Call] = []
        plan_steps: list[PreparedCall] = []
        replays = []
        index = 0
        while index < len(self.calls):
            end = index
            while end < len(self.calls) and threads(end) is not None and \
                    threads(end) == threads(index):
                end += 1
            if end - index < 2:
                plan.append(self.calls[index])
                plan_steps.append(self.steps[index])
                index += 1
                continue
            steps = self.steps[index:end]
            made = replay.Replay([r for r, _ in found[index:end] if r is not None],
                                 [f"{s.label} ({s.func_name} on {s.device})" for s in steps])
            replays.append(made)
            plan.append((made, ()))
            plan_steps.append(steps[0])
            self.replayed += len(steps)
            index = end
        if not replays:
            self.state = "plain"
            return

        self.plan, self.plan_steps, self.replays = plan, plan_steps, replays
        self._changes = InputVersion.changes
        self._thread = threading.get_ident()
        self.state = "replaying"
        log.debug("%s: %d of %d steps replayed in %d calls", self.source, self.replayed,
                  len(self.calls), len(replays))


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
