"""How busy other processes keep this process's CPUs, from /proc/stat less this process's time."""
from __future__ import annotations

import os
import time
from typing import Callable

BUSY_SHARE = 0.5  # a CPU's worth busier than this with other processes' work counts as taken
WINDOW_S = 0.06  # /proc/stat counts in ticks (10 ms): a shorter window says little

Window = Callable[[], str]  # closes a window: why the machine was busy in it, "" when quiet


def cpu_jiffies() -> dict[int, tuple[int, int]]:
    """(busy, total) jiffies per CPU from /proc/stat; empty when unreadable."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or len(fields) < 5:
            continue
        values = [int(v) for v in fields[:8]]
        idle = values[3] + values[4]  # idle, iowait
        found[int(name[3:])] = (sum(values) - idle, sum(values))
    return found


def own_ticks() -> float:
    """This process's CPU time (every thread, user and system) in /proc/stat's ticks."""
    own = os.times()
    return (own.user + own.system) * os.sysconf("SC_CLK_TCK")


def my_cpus() -> list[int]:
    """The CPUs this process may run on (none known where the platform cannot say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return []


def open_window(min_s: float = WINDOW_S) -> Window:
    """Start watching this process's CPUs; the returned call ends the window (after min_s at
    least: it sleeps the rest) and says whether other processes used more than BUSY_SHARE of a
    CPU over it, e.g. "other processes used 1.3 of 2 CPUs" ("" when not, or unreadable)."""
    started = time.perf_counter()
    first, own = cpu_jiffies(), own_ticks()

    def close() -> str:
        left = min_s - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)
        second, own_after = cpu_jiffies(), own_ticks()
        others = others_between(first, second, own_after - own)
        if others is None or others <= BUSY_SHARE:
            return ""
        return f"other processes used {others:.1f} of {len(my_cpus())} CPUs"
    return close


def others_between(first: dict[int, tuple[int, int]], second: dict[int, tuple[int, int]],
                   own: float) -> float | None:
    """How many CPUs' worth other processes used on this process's CPUs between two readings
    of cpu_jiffies, this process's own ticks (own) taken off; None where unreadable.

    NOTE: summed over the CPUs, not per CPU: this process's own work may sit on any of them,
    and subtracting it from each CPU alone would hide a neighbour on another one."""
    cpus = [c for c in my_cpus() if c in first and c in second]
    busy = sum(second[c][0] - first[c][0] for c in cpus)
    total = sum(second[c][1] - first[c][1] for c in cpus)
    if not cpus or total <= 0:
        return None
    return max(0.0, busy - own) / (total / len(cpus))
