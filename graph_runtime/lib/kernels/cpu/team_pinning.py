"""oneDNN's OpenMP team threads each kept on a CPU of its own (GRAPH_RUNTIME_ONEDNN_PIN).

libgomp's team threads sleep after a pause between runs. Woken by the next primitive, Linux
may place a team thread on the calling thread's CPU (on VMs it often takes the idle vCPU for
busy), where the caller spins at the team's barrier waiting for it: the thread runs only when
the next timer tick preempts the caller, 4-11 ms later. GPT-2-tiny's run() after 100 ms idle
took 6.8 ms on a 2-vCPU VM (warm: 0.44 ms; ONNX Runtime 1.0 ms); with its team threads pinned,
1.3 ms (docs/measurements.md). Only the team's threads (thread numbers 1 and up) are pinned,
each to the CPU it runs on when the team is made (where the scheduler spread the new threads:
two processes on one machine keep apart), or, where that CPU is the caller's or another team
thread's, to the first CPU of the process's allowed set none of them holds. The calling thread
is left alone, so threads it starts later inherit its affinity unchanged (OMP_PROC_BIND=true
pins the caller too).

Nothing is pinned where the user binds OpenMP threads (OMP_PROC_BIND, OMP_PLACES,
GOMP_CPU_AFFINITY), where the team has more threads than the process has CPUs, or where the
system refuses (a container without the right): the team then runs as libgomp places it.
"""
from __future__ import annotations

import ctypes
import logging
import os
from typing import Any

import numpy as np
from llvmlite import binding as llvm
from numba import carray, types

from .... import settings
from ..onednn import binding
from .omp_team import _thread_num, gomp_loaded, run_on_team, team_kernel

log = logging.getLogger(__name__)

MAX_TEAM = 1024  # thread ids a team reports (its block's length)


def _glibc_symbols() -> bool:
    """glibc's gettid and sched_getcpu made known to the JIT (the team kernel calls them);
    False without them."""
    try:
        libc = ctypes.CDLL(None)
        addresses = {name: ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
                     for name in ("gettid", "sched_getcpu")}
    except (AttributeError, OSError):
        return False
    for name, address in addresses.items():
        llvm.add_symbol(name, address)
    return True


_HAS_SYMBOLS = _glibc_symbols()
_gettid: Any = types.ExternalFunction("gettid", types.int32())
_getcpu: Any = types.ExternalFunction("sched_getcpu", types.int32())


@team_kernel
def _record_threads(data: Any) -> None:
    """Each team thread writes its kernel thread id and its CPU at its thread number."""
    found = carray(data, (MAX_TEAM, 2), np.int64)
    t = _thread_num()
    if t < MAX_TEAM:
        found[t, 0] = _gettid()
        found[t, 1] = _getcpu()


def team_threads() -> list[tuple[int, int]]:
    """(kernel thread id, CPU it runs on) of the calling thread's OpenMP team, by thread number
    (0: the caller); [] where libgomp or glibc's functions are missing."""
    if not _HAS_SYMBOLS or not gomp_loaded():
        return []
    found = np.zeros((MAX_TEAM, 2), np.int64)
    run_on_team(_record_threads(), found)
    count = int(np.count_nonzero(found[:, 0]))
    return [(int(tid), int(cpu)) for tid, cpu in found[:count]]


def team_tids() -> list[int]:
    """The kernel thread ids of the calling thread's OpenMP team, by thread number."""
    return [tid for tid, _ in team_threads()]


def wanted() -> bool:
    """Whether the team is pinned: the setting on and no OpenMP binding of the user's."""
    return settings.word(settings.ONEDNN_PIN) == "on" and not settings.openmp_bound_by_user()


def pin_team(threads: int) -> list[tuple[int, int]]:
    """Pin the calling thread's team (of `threads`, as omp_set_num_threads set it), each thread
    but the caller to a CPU of its own (see the module's docstring). Returns the (thread id,
    CPU) pairs pinned; [] where nothing is."""
    cpus = sorted(os.sched_getaffinity(0))
    if threads < 2 or threads > len(cpus) or not wanted():
        return []
    team = team_threads()[:threads]
    if len(team) < 2:
        return []
    held = {team[0][1]}  # the caller's CPU, left to it
    pinned: list[tuple[int, int]] = []
    for tid, cpu in team[1:]:
        if cpu in held or cpu not in cpus:
            cpu = next(c for c in cpus if c not in held)
        try:
            os.sched_setaffinity(tid, {cpu})
        except OSError as e:  # a container may refuse: the team runs unpinned
            log.info("oneDNN's team thread %d not pinned to CPU %d: %s", tid, cpu, e)
            return pinned
        held.add(cpu)
        pinned.append((tid, cpu))
    return pinned


binding.on_team_sized(pin_team)  # every team oneDNN's binding sizes, from now on
