"""How oneDNN's kernels use the cores: OpenMP threads inside each primitive, or the runtime's
workers pulling single-threaded pieces of it (GRAPH_RUNTIME_ONEDNN_THREADS).

OpenMP splits a primitive statically, the way oneDNN plans it (over output-channel blocks as
well as rows), and its threads hand off in microseconds: on two idle cores ResNet-50 ran at
batch 1 in 21 ms against 28 ms with the workers (ONNX Runtime: 21-24 ms). But when another
process holds one of the cores, every primitive waits for its descheduled half (7-11 ms for a
0.5 ms conv). The workers pull row bands dynamically and survive that. `auto` looks once per
process, when the first oneDNN kernel is made, whether another process keeps one of this
process's CPUs busy, and takes OpenMP only if none does. oneDNN plans a primitive for the thread
count of its creation, and a thread whose OpenMP count changes pays 6-7 ms on its next call, so a
kernel keeps the mode it was made in.

A neighbour that arrives later is not missed: recheck() (asked by every module's runs, at
most every RECHECK_S) looks at the load since its last look, without sleeping; auto then turns
OpenMP into the workers when another process keeps one of the CPUs busy (a LLaMA prompt's warm
run took 220 ms instead of 8.8 ms in OpenMP beside a test run), and back after QUIET_S quiet.
The workers are the cores the neighbours leave (_beside): on two CPUs beside one busy process,
the calling thread alone, as ONNX Runtime's one-thread setting; every parallel loop of the
runtime follows (threads.num_threads asks cpus_left).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from .... import settings
from ...._load import (BUSY_SHARE, WINDOW_S, cpu_jiffies, my_cpus, others_between,
                       own_ticks)
from ..threads import cpu_threads


@dataclass(frozen=True)
class Threads:
    """OpenMP threads inside each primitive, runtime workers over its pieces, and why."""

    openmp: int
    workers: int
    why: str


_decided: dict[tuple[str, int], Threads] = {}
_lock = threading.Lock()
RECHECK_S = 2.0  # recheck() looks at the load at most this often
OTHERS_SHARE = 0.25  # other processes' CPUs that make it a busy machine then (its own running)
QUIET_S = 30.0  # and gives OpenMP back only after the CPUs stayed free of others this long
_look: tuple[float, dict[int, tuple[int, int]], float] | None = None  # when, jiffies, own ticks
_quiet_since: float | None = None
_generation = 0  # how many times recheck() changed the mode in this process


def policy() -> Threads:
    """The mode for this process (the setting's, or auto's, decided once)."""
    mode, cores = settings.word(settings.ONEDNN_THREADS), max(1, cpu_threads())
    with _lock:
        if (mode, cores) not in _decided:
            _decided[(mode, cores)] = _decide(mode, cores)
        return _decided[(mode, cores)]


def recheck() -> bool:
    """auto, once decided: another look at the load since the last one (at most every
    RECHECK_S; no sleep): OpenMP becomes the workers when other processes used more than
    OTHERS_SHARE of a CPU, the workers OpenMP again after QUIET_S without. True when the mode
    changed (kernels made before keep theirs: make them again to follow)."""
    global _quiet_since, _generation
    now = time.monotonic()
    look = _look
    if look is not None and now - look[0] < RECHECK_S:
        return False  # the common case, first: a symbolic module asks on every run
    mode, cores = settings.word(settings.ONEDNN_THREADS), max(1, cpu_threads())
    with _lock:
        current = _decided.get((mode, cores))
        if mode != "auto" or cores == 1 or current is None or (
                _look is not None and now - _look[0] < RECHECK_S):
            return False
        others = _others_since_look(now)
        if others is None:
            return False
        if others > OTHERS_SHARE:
            _quiet_since = None
            if current.openmp > 1:
                _decided[(mode, cores)] = _beside(
                    cores, max(1, round(others)),
                    f"auto, looked again: other processes used {others:.1f} CPUs")
                _generation += 1
                return True
            return False
        if _quiet_since is None:
            _quiet_since = now
        if current.openmp == 1 and now - _quiet_since >= QUIET_S:
            _decided[(mode, cores)] = Threads(
                cores, 1, f"OpenMP, {cores} threads (auto, looked again: no other process busy "
                f"for {QUIET_S:.0f} s)")
            _generation += 1
            return True
        return False


def generation() -> int:
    """recheck(), then how many times the mode changed in this process: a module remembers the
    generation its kernels were made in and makes them again once it moved on (each module
    sees the change, not only the first to ask)."""
    recheck()
    return _generation


def _others_since_look(now: float) -> float | None:
    """How many CPUs' worth other processes used on this process's CPUs since the last look
    (None at the first: it only starts the count).

    NOTE: summed over the CPUs (_load.others_between): running, this process is busy on every
    CPU (its OpenMP threads spin between primitives), and taking its time off each CPU alone
    (as busy_cpus does for an idle process) hid a neighbour spinning on one of them."""
    global _look
    first, second, own = _look, cpu_jiffies(), own_ticks()
    _look = (now, second, own)
    return None if first is None else others_between(first[1], second, own - first[2])


def mode_word() -> str:
    """openmp or workers: part of the tuning keys of oneDNN's timings (they differ by mode)."""
    return "openmp" if policy().openmp > 1 else "workers"


def _decide(mode: str, cores: int) -> Threads:
    if cores == 1:
        return Threads(1, 1, "one thread (one CPU)")
    if mode == "auto":
        busy = busy_cpus()
        if busy:
            return _beside(cores, len(busy), f"auto: CPU {', '.join(map(str, busy))} busy with "
                                             "another process")
        return Threads(cores, 1, f"OpenMP, {cores} threads (auto: no other process busy)")
    if mode == "openmp":
        return Threads(cores, 1, f"OpenMP, {cores} threads (GRAPH_RUNTIME_ONEDNN_THREADS)")
    return Threads(1, cores, f"runtime workers over {cores} CPUs (GRAPH_RUNTIME_ONEDNN_THREADS)")


def _beside(cores: int, taken: int, why: str) -> Threads:
    """The workers' mode beside other processes keeping `taken` of the cores busy: a worker
    for each core left, one (the calling thread alone) where one is left; as many as
    GRAPH_RUNTIME_NUM_THREADS says where it is set. A second worker on the busy core was
    descheduled holding its item while the caller waited for it: beside one spinning process
    on two CPUs, MobileViT, Phi-3, Qwen2, a T5 encoder and CLIP's vision tower ran 1.07x ONNX
    Runtime's one thread (geomean) on one thread, 1.27x on two workers (docs/measurements.md)."""
    if settings.num_threads() is not None:  # the user's count of workers is kept
        return Threads(1, cores, f"runtime workers over {cores} CPUs ({why})")
    left = max(1, cores - taken)
    if left == 1:
        return Threads(1, 1, f"one thread ({why})")
    return Threads(1, left, f"runtime workers over {left} of {cores} CPUs ({why})")


def cpus_left(cpus: int) -> int:
    """The CPUs parallel loops may use (threads.num_threads, GRAPH_RUNTIME_NUM_THREADS unset):
    every one, but under auto with oneDNN here those its mode leaves beside busy neighbours
    (decided at the first ask: the load sampled once per process, then recheck())."""
    from .binding import available
    if settings.word(settings.ONEDNN_THREADS) != "auto" or not available():
        return cpus
    threads = policy()
    return cpus if threads.openmp > 1 else threads.workers


def busy_cpus(window_s: float = WINDOW_S) -> list[int]:
    """This process's CPUs that other processes kept more than BUSY_SHARE busy over a short
    window (this thread sleeps meanwhile); none where /proc/stat cannot be read."""
    mine = my_cpus()
    first = cpu_jiffies()
    own = own_ticks()
    time.sleep(window_s)
    second = cpu_jiffies()
    own_busy = own_ticks() - own
    if not first or not second:
        return []
    busy = []
    for cpu in mine:
        if cpu not in first or cpu not in second:
            continue
        (b0, t0), (b1, t1) = first[cpu], second[cpu]
        if t1 > t0 and (b1 - b0 - own_busy) / (t1 - t0) > BUSY_SHARE:
            busy.append(cpu)
    return busy
