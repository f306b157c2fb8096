"""Timing shared by GraphModule.benchmark, kernels that calibrate themselves, and bench/."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping


@dataclass(frozen=True)
class BenchmarkResult:
    """Seconds per run over repeats (each the mean of `number` runs), as TVM's BenchmarkResult."""

    results: tuple[float, ...]
    mean: float = field(init=False)
    median: float = field(init=False)
    std: float = field(init=False)
    min: float = field(init=False)
    max: float = field(init=False)

    def __post_init__(self) -> None:
        r = self.results
        object.__setattr__(self, "mean", statistics.fmean(r))
        object.__setattr__(self, "median", statistics.median(r))
        object.__setattr__(self, "std", statistics.pstdev(r) if len(r) > 1 else 0.0)
        object.__setattr__(self, "min", min(r))
        object.__setattr__(self, "max", max(r))

    def __str__(self) -> str:
        ms = 1e3
        return (f"Execution time summary:\n {'mean (ms)':>10} {'median (ms)':>12} {'max (ms)':>10}"
                f" {'min (ms)':>10} {'std (ms)':>10}\n {self.mean * ms:10.4f} "
                f"{self.median * ms:12.4f} {self.max * ms:10.4f} {self.min * ms:10.4f} "
                f"{self.std * ms:10.4f}")


def time_runs(once: Callable[[], None], sync: Callable[[], None], repeat: int, number: int,
              min_repeat_ms: float | None = None,
              progress: Callable[[int], None] | None = None) -> BenchmarkResult:
    """Warm up, then take repeat samples, each the mean of number device-synchronised runs.

    With min_repeat_ms, number doubles until one sample lasts at least that long (as TVM does).
    """
    once()
    sync()
    results = []
    for r in range(repeat):
        n = number
        while True:
            start = time.perf_counter()
            for _ in range(n):
                once()
            sync()
            elapsed = time.perf_counter() - start
            if min_repeat_ms is None or elapsed * 1e3 >= min_repeat_ms or n > 1 << 20:
                break
            n *= 2
        results.append(elapsed / n)
        if progress is not None:
            progress(r + 1)
    return BenchmarkResult(tuple(results))


def best_seconds(calls: Mapping[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    """Each call's best time over interleaved rounds (machine noise hits all alike); each sample
    is the mean of 8 calls after a warm-up call (wakes BLAS threads, fills caches)."""
    best = {name: float("inf") for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            best[name] = min(best[name], time_runs(call, lambda: None, repeat=1, number=8).min)
    return best


def median_seconds(calls: Mapping[str, Callable[[], None]], rounds: int,
                   sync: Callable[[], None] = lambda: None,
                   pause_s: float = 0.0) -> dict[str, float]:
    """Each call's median time over interleaved rounds (machine noise hits all alike), each
    call timed through sync and after pause_s of sleep."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            if pause_s:
                time.sleep(pause_s)
            start = time.perf_counter()
            call()
            sync()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def fastest(seconds: Mapping[str, float], base: str, min_speedup: float) -> str:
    """The name with the least time; base stays unless the fastest beats it by min_speedup (a
    lucky sample must not pick another)."""
    best = min(seconds, key=lambda name: seconds[name])
    return best if seconds[best] * min_speedup < seconds[base] else base
