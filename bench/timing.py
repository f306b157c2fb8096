"""Timing helper shared by the benchmarks: samples of back-to-back calls."""
from __future__ import annotations

import time
from typing import Any, Callable


def seconds_per_call(fn: Callable[[], Any], repeat: int, number: int) -> list[float]:
    """repeat samples, each the mean of number back-to-back calls."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return samples
