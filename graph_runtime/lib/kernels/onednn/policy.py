"""How oneDNN's kernels use the cores: OpenMP threads inside each primitive, or the runtime's
workers pulling single-threaded pieces of it (GRAPH_RUNTIME_ONEDNN_THREADS).

OpenMP splits a primitive statically, the way oneDNN plans it (over output-channel blocks as
well as rows), and its threads hand off in microseconds: on two idle cores ResNet-50 ran at
batch 1 in 21 ms against 28 ms with the workers (ONNX Runtime: 21-24 ms). But when another
process holds one of the cores, every primitive waits for its descheduled half (7-11 ms for a
0.5 ms conv). The workers pull row bands dynamically and survive that. `auto` looks once per
process, when the first oneDNN kernel is made, whether another process keeps one of this
process's CPUs busy, and takes OpenMP only if none does. One mode per process: oneDNN plans a
primitive for the thread count of its creation, and a thread whose OpenMP count changes pays
6-7 ms on its next call.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from .... import settings
from ...._load import BUSY_SHARE, WINDOW_S, cpu_jiffies, my_cpus, own_ticks
from ..threads import num_threads


@dataclass(frozen=True)
class Threads:
    """OpenMP threads inside each primitive, runtime workers over its pieces, and why."""

    openmp: int
    workers: int
    why: str


_decided: dict[tuple[str, int], Threads] = {}
_lock = threading.Lock()


def policy() -> Threads:
    """The mode for this process (the setting's, or auto's, decided once)."""
    mode, cores = settings.word(settings.ONEDNN_THREADS), max(1, num_threads())
    with _lock:
        if (mode, cores) not in _decided:
            _decided[(mode, cores)] = _decide(mode, cores)
        return _decided[(mode, cores)]


def mode_word() -> str:
    """openmp or workers: part of the tuning keys of oneDNN's timings (they differ by mode)."""
    return "openmp" if policy().openmp > 1 else "workers"


def _decide(mode: str, cores: int) -> Threads:
    if cores == 1:
        return Threads(1, 1, "one thread (one CPU)")
    if mode == "auto":
        busy = busy_cpus()
        if busy:
            return Threads(1, cores, f"runtime workers over {cores} CPUs (auto: CPU "
                                     f"{', '.join(map(str, busy))} busy with another process)")
        return Threads(cores, 1, f"OpenMP, {cores} threads (auto: no other process busy)")
    if mode == "openmp":
        return Threads(cores, 1, f"OpenMP, {cores} threads (GRAPH_RUNTIME_ONEDNN_THREADS)")
    return Threads(1, cores, f"runtime workers over {cores} CPUs (GRAPH_RUNTIME_ONEDNN_THREADS)")


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
