"""Interleaved timing rounds shared by the benchmarks: every contender sampled in every round."""
from __future__ import annotations

import random
import time
from typing import Any, Callable

from graph_runtime._timing import time_runs

SETTLE_S = 0.5  # pause before each contender's samples (see interleaved_samples)


def _no_sync() -> None:
    """CPU contenders: nothing to wait for."""


def seconds_per_call(call: Callable[[], Any], repeat: int, number: int) -> list[float]:
    """repeat samples, each the mean of number back-to-back calls (after one warm-up call)."""
    return list(time_runs(call, _no_sync, repeat, number).results)


def interleaved_samples(calls: dict[str, Callable[[], Any]], rounds: int, repeat: int,
                        number: int, warmup: int = 2) -> dict[str, list[float]]:
    """name -> seconds per call of every sample of every round (repeat samples a round)."""
    for call in calls.values():  # warm-up: first calls compile, fault pages in, start pools
        for _ in range(warmup):
            call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)  # no contender always follows the same neighbour's leftover threads
        for name in order:
            # NOTE: idle threads spin after a threaded call (OpenBLAS's ~0.1 s, behind
            # graph_runtime's GEMMs and NumPy; ONNX Runtime's, spinning as its defaults allow):
            # the pause lets them sleep so they do not steal the core the next contender needs.
            time.sleep(SETTLE_S)
            samples[name] += seconds_per_call(calls[name], repeat, number)
    return samples
