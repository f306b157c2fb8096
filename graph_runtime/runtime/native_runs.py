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
the calls read: a step whose arguments changed (rebind, a new shape: invalidate) is recorded
again; any input's write counter counted or made volatile (InputVersion.changes), or a run on
another thread than the recording one (a oneDNN stream and an OpenMP team belong to a thread),
records every step again. GRAPH_RUNTIME_REPLAY=off turns it off.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable, NamedTuple

from .. import settings
from ..lib.kernels import replay
from ..lib.library import InputVersion
from .steps import PreparedCall

log = logging.getLogger("graph_runtime")
Call = tuple[Callable[..., Any], Any]  # a function and its argument list


class _Known(NamedTuple):
    """What one step's last recording found: its arguments then (held, so that their ids stay
    theirs), and its rows where it can be replayed, else why not."""

    args: tuple[Any, ...]
    rows: replay.Rows | None
    why: str


class NativeRuns:
    """run() for one executor: plain, then recorded, then replayed where the steps allow.

    A step is recorded again only where its arguments moved (a symbolic module's next length
    moves a decoder's KV cache and attention, not its products and norms): those runs replay
    the stretches whose steps kept theirs and record the rest as they run. A step whose
    kernel did not vouch for its calls is not recorded again until everything is."""

    def __init__(self, calls: list[Call], steps: list[PreparedCall],
                 run_calls: Callable[[list[Call], list[PreparedCall]], None],
                 source: str) -> None:
        self.calls, self.steps = calls, steps
        self.run_calls = run_calls
        self.source = source
        # warming -> recording -> replaying (-> recording where arguments moved); plain: the
        # replay loop is not to be compiled in this process (replay.loop_ready); seeded: some
        # steps' recordings taken from the runner of the executor derived from (adopt)
        self.state = "warming"
        self.known: list[_Known | None] = [None] * len(calls)
        self.plan: list[Call] = []
        self.plan_steps: list[PreparedCall] = []
        self.replays: list[replay.Replay] = []
        self.replayed = 0  # steps the replays run
        self._scratchpad = replay.Scratchpad()
        self._plan_index: list[int] = []  # per call of the last plan made: its first step
        self._singles: dict[int, int] = {}  # step index: its call's place there, called alone
        # the replays of the last plan, by their rows: kept for the next plan's same stretches
        self._made: dict[tuple[replay.Rows, ...], replay.Replay] = {}
        self._changes = InputVersion.changes
        self._thread = threading.get_ident()
        # the steps whose arguments may have moved since _drop_moved last looked (invalidate's
        # word); None: any of them
        self._suspects: set[int] | None = None

    @property
    def reasons(self) -> dict[int, str]:
        """Per step index not replayed: why (as its last recording found)."""
        return {i: "not recorded yet" if k is None else k.why or "no replayable neighbour"
                for i, k in enumerate(self.known)
                if k is None or k.rows is None or not self._in_replay(i)}

    def _in_replay(self, index: int) -> bool:
        return any(step is self.steps[index] for r in self.replays for step in r.steps)

    def adopt(self, base: NativeRuns) -> None:
        """Start from base's recordings of the steps this runner shares with base's runner (an
        executor derived from base's: a step kept as it was is the same call on the same
        arrays): its first run replays their stretches and calls every other step plainly (a
        new kernel's first call may derive what a recording would replay at every call), the
        next records those. A decoder's new past-length band changes its ~10 attention, mask
        and KV steps; its other ~50 were recorded again in full (4 ms, against the 1.6 ms
        step). Nothing is taken from a base recorded on another thread or before a write
        counter moved."""
        if (base.state not in ("recording", "replaying") or len(base.calls) != len(self.calls)
                or base._thread != self._thread or base._changes != InputVersion.changes):
            return
        taken = [known if mine is theirs else None
                 for known, mine, theirs in zip(base.known, self.steps, base.steps)]
        if not any(k is not None and k.rows is not None for k in taken):
            return
        self.known = taken
        self._suspects = None
        self._scratchpad = base._scratchpad  # (the rows taken bound their memories to it)
        self._made = dict(base._made)
        self.state = "seeded"

    def invalidate(self, steps: Iterable[int] | None = None) -> None:
        """Arguments moved (a rebind, a new shape): the steps whose arguments changed are
        recorded again at the next run. steps: the indices of the only ones that may have
        (retarget's re-pointed steps: the others are not compared); None: any."""
        if self.state == "replaying":
            self.state = "recording"
        if steps is None:
            self._suspects = None
        elif self._suspects is not None:
            self._suspects.update(steps)

    def _forget(self) -> None:
        """Everything recorded again: a write counter moved (derived data may be made again),
        or another thread runs (a oneDNN stream and an OpenMP team of its own)."""
        self.known = [None] * len(self.calls)
        self._suspects = None
        self.plan, self.plan_steps, self._made = [], [], {}
        self._scratchpad = replay.Scratchpad()
        self._changes = InputVersion.changes
        self._thread = threading.get_ident()

    def run(self) -> None:
        if self.state in ("warming", "plain") or replay.recording_here() is not None:
            self.run_calls(self.calls, self.steps)
            if self.state in ("warming", "seeded"):
                self.state = "recording"
            return
        if self.state == "seeded":  # (adopt) the taken stretches replayed, the rest plain
            self.state = "recording"
            if InputVersion.changes != self._changes or threading.get_ident() != self._thread:
                self._forget()
                self.run_calls(self.calls, self.steps)
                return
            self._drop_moved()  # (a step re-pointed since adopt: called plainly)
            self.plan, self.plan_steps = self._plan({})
            self.run_calls(self.plan, self.plan_steps)
            return
        if InputVersion.changes != self._changes or threading.get_ident() != self._thread:
            self._forget()
            self.state = "recording"
        if self.state == "replaying":
            self.run_calls(self.plan, self.plan_steps)
            return
        if not replay.loop_ready():
            self.state = "plain"
            self.run_calls(self.calls, self.steps)
            return
        self._record()

    def _record(self) -> None:
        """One run replaying the stretches whose steps kept their arguments and recording the
        steps whose arguments moved, then the plan of the next runs."""
        moved = self._drop_moved()
        if not moved:  # (every moved step followed its arguments: a decode step's new length)
            self.run_calls(self.plan, self.plan_steps)
            self.state = "replaying"
            return
        for i in sorted(moved):
            if self._alone(i):  # its rows could join no stretch: not recorded
                self.known[i] = _Known((), None, ALONE)
        moved = {i for i in moved if self.known[i] is None}

        def recording(index: int, fn: Callable[..., Any]) -> Callable[..., None]:
            def call(*args: Any) -> None:
                found, why = replay.record(fn, args)
                rows = None if found is None else replay.Rows(found, self._scratchpad)
                # a kernel that did not vouch is not asked again: its arguments not held
                held = () if why == replay.NOT_VOUCHED else tuple(args)
                self.known[index] = _Known(held, rows, why)
            return call
        changes = InputVersion.changes
        singles = self._singles
        if self.plan and all(i in singles for i in moved):
            # each moved step called alone in the last plan (a decoder's mask and KV steps):
            # that plan, those calls recorded, no stretch made again
            plan, steps = list(self.plan), self.plan_steps
            for i in moved:
                fn, args = self.calls[i]
                plan[singles[i]] = (recording(i, fn), args)
        else:
            plan, steps = self._plan({i: recording for i in moved})
        self.run_calls(plan, steps)
        if InputVersion.changes != changes:  # a kernel derived data as it was recorded
            self._forget()
            return
        if any(self._joins(i) for i in moved):
            plan, steps = self._plan({})
        else:  # no stretch changed: the same calls, each moved step called plainly
            plan = self._plain_for(plan, moved)
        self.plan, self.plan_steps = plan, steps
        self.state = "replaying"

    def _drop_moved(self) -> set[int]:
        """The steps not recorded, or whose arguments moved since their recording (a settled
        refusal aside), their recordings dropped; a step whose function follows its new
        arguments (cpu/block_site.py: its block rewritten for them) keeps its recording."""
        suspects, self._suspects = self._suspects, set()
        known_now = self.known
        moved = {i for i, known in enumerate(known_now) if known is None}
        for i in range(len(known_now)) if suspects is None else suspects:
            known = known_now[i]
            if known is None or known.why in _SETTLED:
                continue
            fn, args = self.calls[i]
            if replay.same_objects(known.args, args):
                continue
            follow = getattr(fn, "follow", None)
            if known.rows is not None and follow is not None and follow(*args):
                self.known[i] = _Known(tuple(args), known.rows, known.why)
                continue
            moved.add(i)
            self.known[i] = None
        return moved

    def _alone(self, index: int) -> bool:
        """Whether no neighbour of step index can ever be replayed (each is out of range or
        its kernel did not vouch, which holds until everything is recorded again): its rows
        would make no stretch. A decoder's rotary chain between two mask steps moved at every
        new length, and its recording cost 105 us a token against its 6 us call."""
        for other in (index - 1, index + 1):
            near = self.known[other] if 0 <= other < len(self.known) else _OUTSIDE
            if near is None or near.why not in _SETTLED:
                return False
        return True

    def _joins(self, index: int) -> bool:
        """Whether step index has rows of a thread count a neighbour's rows have (it would
        make or lengthen a stretch); a lone one is called plainly, the plan kept."""
        known = self.known[index]
        if known is None or known.rows is None:
            return False
        for other in (index - 1, index + 1):
            near = self.known[other] if 0 <= other < len(self.known) else None
            if near is not None and near.rows is not None and \
                    near.rows.threads == known.rows.threads:
                return True
        return False

    def _plain_for(self, plan: list[Call], moved: set[int]) -> list[Call]:
        """plan with each moved step's recording call made its plain call again."""
        return [self.calls[index] if index in moved else call
                for call, index in zip(plan, self._plan_index)]

    def _plan(self, recording: dict[int, Callable[[int, Callable[..., Any]],
                                                  Callable[..., None]]]
              ) -> tuple[list[Call], list[PreparedCall]]:
        """The calls of a run: each stretch of two or more steps with rows of one thread count
        as one replay, steps in recording by the wrapper it gives, the others plainly."""
        def rows(index: int) -> replay.Rows | None:
            known = self.known[index]
            return None if index in recording or known is None else known.rows
        plan: list[Call] = []
        steps: list[PreparedCall] = []
        self._plan_index = []
        self._singles = {}
        replays = []
        made_now: dict[tuple[replay.Rows, ...], replay.Replay] = {}
        index = 0
        while index < len(self.calls):
            first = rows(index)
            end = index
            while first is not None and end < len(self.calls):
                found = rows(end)
                if found is None or found.threads != first.threads:
                    break
                end += 1
            if end - index >= 2:
                key = tuple(r for r in map(rows, range(index, end)) if r is not None)
                made = self._made.get(key)
                if made is None:  # (a decoder's next length keeps most stretches)
                    stretch = self.steps[index:end]
                    made = replay.Replay(key, [f"{s.label} ({s.func_name} on {s.device})"
                                               for s in stretch], stretch)
                made_now[key] = made
                replays.append(made)
                plan.append((made, ()))
                steps.append(self.steps[index])
                self._plan_index.append(index)
                index = end
                continue
            fn, args = self.calls[index]
            self._singles[index] = len(plan)
            plan.append((recording[index](index, fn), args) if index in recording
                        else (fn, args))
            steps.append(self.steps[index])
            self._plan_index.append(index)
            index += 1
        self.replays = replays
        self.replayed = sum(len(r.steps) for r in replays)
        self._made = made_now
        return plan, steps


# A step whose recording is not asked again until everything is (_forget): its kernel did not
# vouch, or it was alone between such steps (ALONE)
ALONE = "no neighbour can be replayed"
_SETTLED = (replay.NOT_VOUCHED, ALONE)
_OUTSIDE = _Known((), None, ALONE)  # (a neighbour past either end)


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
