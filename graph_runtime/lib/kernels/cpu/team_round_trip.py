"""How far apart the OpenMP team's first two CPUs are: a cache line's round trip between them.

Every kernel split over oneDNN's team hands its output to the next kernel across CPUs, and a
team's start and end are such hand-offs too. On a 2-vCPU cloud VM the round trip measured 50-95
ns at some times and 320-370 ns at others (the host had placed the two vCPUs on far-apart cores),
in spells of a second to half a minute, and small transformers ran 30-40% slower in the far
ones: DistilBERT-tiny's run() 440 against 600-630 us, its layer norms reading a team dense's
output 10 against 24 us (docs/measurements.md). The number says which spell a measurement was
taken in; `graphrun devices` and the benches print it.

Threads 0 and 1 of the team pass a counter back and forth (atomic add, acquire loads) in
batches, each spin bounded so that a team thread the scheduler never runs (a neighbour holding
its core) ends the probe instead of hanging it.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time
from typing import Any, Iterator

import numpy as np
from llvmlite import ir
from numba import carray, types
from numba.extending import intrinsic

from ..onednn import binding
from ..onednn.policy import policy
from .omp_team import _fetch_add, _team_size, _thread_num, available, run_on_team, team_kernel
from .team_pinning import team_threads

ROUNDS = 2_000  # a batch: about 0.1-0.7 ms at 50-350 ns
BATCHES = 9
SPIN_LIMIT = 50_000_000  # loads a thread waits for its turn before it gives up (~50-250 ms)


@intrinsic
def _load_acquire(typingctx: Any, address: Any) -> Any:
    """The int64 at address, read with acquire ordering (never hoisted out of a spin)."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.load_atomic(pointer, "acquire", 8)
    return types.int64(address), codegen


@team_kernel
def _ping_pong(data: Any) -> None:
    """Thread t (0 or 1) waits for the counter to reach 2 i + t and adds one, rounds times."""
    b = carray(data, (2,), np.int64)
    t = _thread_num()
    if t > 1 or _team_size() < 2:
        return
    counter, rounds = b[0], b[1]
    for i in range(rounds):
        want = 2 * i + t
        spins = 0
        while _load_acquire(counter) != want:  # type: ignore[call-arg]
            spins += 1
            if spins > SPIN_LIMIT:
                return
        _fetch_add(counter, 1)  # type: ignore[call-arg]


def round_trip_ns(rounds: int = ROUNDS) -> float | None:
    """Nanoseconds for a cache line to go from the calling thread's CPU to the team's second
    thread's and back, over one batch of rounds; None where the team is not available (oneDNN
    not in OpenMP mode), has one thread, or a thread did not get its turn within the spin
    limit (a core another thread held: a spinning thread pool's, a neighbour's)."""
    if not available():
        return None
    binding.use_threads(policy().openmp)  # the team the kernels get, sized and pinned so
    counter = np.zeros(8, np.int64)  # one cache line's worth, the counter first
    block = np.array([counter.ctypes.data, rounds], np.int64)
    kernel = _ping_pong()  # (compiled at its first use: not timed)
    with _apart_from_the_team():
        start = time.perf_counter()
        run_on_team(kernel, block)
        elapsed = time.perf_counter() - start
    if counter[0] != 2 * rounds:
        return None
    return elapsed / rounds * 1e9


@contextlib.contextmanager
def _apart_from_the_team() -> Iterator[None]:
    """The calling thread kept off the CPU the team's second thread is on meanwhile (both spin:
    on one CPU each would wait for the other's preemption), its affinity as it was after."""
    team = team_threads()
    allowed = os.sched_getaffinity(0)
    mine = allowed - {cpu for _, cpu in team[1:2]}
    if len(team) < 2 or not mine or mine == allowed:
        yield
        return
    os.sched_setaffinity(0, mine)
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def round_trip_text() -> str:
    """'CPU round trip 62 ns', the median of batches (a batch in which a thread lost its core
    for a while counts high, or not at all), or why there is none."""
    probes = [p for p in (round_trip_ns() for _ in range(BATCHES)) if p is not None]
    if len(probes) <= BATCHES // 2:
        return "CPU round trip: not measured (no OpenMP team of two threads, or a busy core)"
    return f"CPU round trip {statistics.median(probes):.0f} ns"
