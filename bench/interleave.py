"""Interleaved timing rounds shared by the benchmarks: every contender sampled in every round."""
from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Any, Callable

from graph_runtime._timing import time_runs

SETTLE_S = 0.5  # pause before each contender's samples (see interleaved_samples)


def settle() -> None:
    """Before a contender's timed pass: the garbage of what the bench dropped (a round's fresh
    module, whose kernels hold oneDNN objects in reference cycles) collected now, not by a
    collection that a later timed call sets off (one took 25 ms of a 5 ms request, destroying
    4,363 oneDNN objects), then the pause (SETTLE_S) that lets spinning threads sleep."""
    gc.collect()
    time.sleep(SETTLE_S)


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


def paired_ratio(samples: dict[str, list[float]], ours: str, peers: list[str],
                 repeat: int) -> float:
    """The median over rounds of ours' median in a round over the faster peer's in the same
    round (samples as interleaved_samples returns them, repeat a round).

    Paired by round, not a ratio of whole medians: a cloud VM's two vCPUs are near or far apart
    on the host in spells of a second to half a minute (docs/measurements.md: every contender
    1.3-1.7x slower in the far ones), and a ratio of medians compared one contender's far-spell
    rounds with another's near ones (the same architecture read 0.71 and 1.39 from its two
    exports); the contenders of one round are a second apart, mostly in the same spell."""
    return statistics.median(round_ratios(samples, ours, peers, repeat))


def round_ratios(samples: dict[str, list[float]], ours: str, peers: list[str],
                 repeat: int) -> list[float]:
    """Each round's ratio (paired_ratio's median is of these): their spread says how far one
    run's ratio may be trusted on the machine it ran on."""
    rounds = len(samples[ours]) // repeat

    def in_round(name: str, r: int) -> float:
        return statistics.median(samples[name][r * repeat:(r + 1) * repeat])
    return [in_round(ours, r) / min(in_round(p, r) for p in peers) for r in range(rounds)]
