"""Timing shared by GraphModule.benchmark, the choices measured among candidates (kernels, the
auto planner's placement), and bench/."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence, Union

from . import _load


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


Source = Callable[[], float]  # one timing sample: seconds per call


def sampler(call: Callable[[], None], sync: Callable[[], None] = lambda: None,
            number: int = 1, pause_s: float = 0.0,
            wake: Callable[[], None] | None = None) -> Source:
    """A timing source: after pause_s of sleep (helper threads go to sleep between a graph's
    nodes too), number calls then sync, seconds per call. wake, called before the pause: the
    helper threads idle for the pause alone, not for every sample taken since they last ran
    (a race's slower candidates, run between two of this one's samples, left oneDNN's OpenMP
    threads asleep long enough that waking them cost 6.9-14.7 ms a call on a 2-vCPU VM: its
    0.3 ms product stored as 7.4 ms and lost to OpenBLAS's 0.73)."""
    def sample() -> float:
        if wake is not None:
            wake()
        if pause_s:
            time.sleep(pause_s)
        start = time.perf_counter()
        for _ in range(number):
            call()
        sync()
        return (time.perf_counter() - start) / number
    return sample


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
            seconds = sampler(once, sync, n)()
            if min_repeat_ms is None or seconds * n * 1e3 >= min_repeat_ms or n > 1 << 20:
                break
            n *= 2
        results.append(seconds)
        if progress is not None:
            progress(r + 1)
    return BenchmarkResult(tuple(results))


# What a challenger must gain over the base: one figure for all, or one per challenger (a set
# whose candidates are of several kinds, lib/tunable.py).
Speedup = Union[float, Mapping[str, float]]


def needs(min_speedup: Speedup, name: str) -> float:
    """What challenger name must gain under min_speedup."""
    return min_speedup[name] if isinstance(min_speedup, Mapping) else min_speedup


def fastest(seconds: Mapping[str, float], base: str, min_speedup: Speedup) -> str:
    """The name with the least time; base stays unless the fastest beats it by what it must gain
    (min_speedup: a lucky sample must not pick another)."""
    best = min(seconds, key=lambda name: seconds[name])
    if best == base:
        return base
    return best if seconds[best] * needs(min_speedup, best) < seconds[base] else base


# ---- comparing candidates until the difference is clear ----------------------------------------

# The one speedup rule: what a challenger must gain over the base, measured, to replace it. A
# candidate has a kind (lib/tunable.py: Candidate.kind); MIN_SPEEDUP holds unless a kind below
# says otherwise, so that a shared machine's noise does not flip a tie nor a lucky sample pick
# a kernel. No other module sets a speedup (tests/lib/test_tuning.py holds that).
MIN_SPEEDUP = 1.1
# What a challenger of these kinds must gain:
TAKE_SPEEDUP = {
    # zero rows padded to a GEMV so that OpenBLAS threads it: only when clearly faster here
    "padded": 1.15,
    # dense columns split over the workers (GRAPH_RUNTIME_DENSE_SPLIT): a wrong "on" costs much
    # on a busy machine (docs/measurements.md)
    "split": 1.25,
    # the auto planner's placement against the default one, whole runs timed (confirm.py)
    "plan": 1.05,
}
# What a challenger must gain over a base of these kinds:
KEEP_SPEEDUP = {
    # Work spread over the runtime's workers (dense column tiles, attention blocks, oneDNN work
    # items) is the base for large ops and kept unless one call is clearly faster: measured on
    # a busy machine, one tile won BERT-base's 128x768x3072 products while another process held
    # the second core, and the model then ran at ONNX Runtime's one-thread speed (1.7x its
    # two-thread time) on a quiet one; column tiles lose little when a core is busy (the caller
    # takes the tiles a helper does not get to): BERT-base ran in 81 ms with them against 142
    # ms on one tile at load 1, 201 against 235 ms with another process spinning. oneDNN's
    # matmul at load 4: one call won its 128x3072x768 products by 1.14x and the model then ran
    # 203 ms against 160 with the items.
    "spread": 1.25,
}


def min_speedup(base: str, challengers: Sequence[str]) -> float:
    """What challengers (by kind) must gain over a base of kind base: the most any of them must
    gain (TAKE_SPEEDUP, else MIN_SPEEDUP), and at least KEEP_SPEEDUP[base] where listed."""
    gains = [TAKE_SPEEDUP.get(kind, MIN_SPEEDUP) for kind in challengers] or [MIN_SPEEDUP]
    return max([*gains, KEEP_SPEEDUP.get(base, 0.0)])


def speedups(base: str, challengers: Mapping[str, str]) -> dict[str, float]:
    """What each challenger (name: kind) must gain over a base of kind base: min_speedup of its
    kind alone, so that one set may race candidates of several kinds (dense's)."""
    return {name: min_speedup(base, [kind]) for name, kind in challengers.items()}


CLEAR = "clear"  # the rule decided: a challenger clearly faster, or none plausibly so
NOISE = "within noise"  # the budget ran out undecided: the base was kept
BUSY = "busy"  # decided or not, measured while other processes kept the CPUs busy
ALPHA = 0.05  # a median's bounds hold it with at least 95% confidence


# a candidate's samples stalled: median this many times its fastest, and this much over it
STALL_RATIO = 4.0
STALL_S = 0.001


@dataclass(frozen=True)
class Budget:
    """How long a comparison samples: min_rounds, then until it is clear, max_rounds are taken
    or max_s have passed."""

    min_rounds: int = 6  # the fewest whose extremes bound a median at 95% (see median_bounds)
    max_rounds: int = 30
    max_s: float = 0.5


@dataclass(frozen=True)
class Verdict:
    """A comparison's answer: the chosen candidate, every sample, and how sure it is."""

    chosen: str
    base: str
    samples: Mapping[str, tuple[float, ...]]  # per candidate, one per round, rounds aligned
    outcome: str  # CLEAR or NOISE
    busy: str = ""  # why the machine counted as busy while sampling ("": quiet)

    @property
    def confidence(self) -> str:
        """CLEAR, NOISE or BUSY: only CLEAR and NOISE answers may be trusted by later runs."""
        return BUSY if self.busy else self.outcome

    @property
    def confident(self) -> bool:
        """Whether the answer is clear and was measured on a quiet machine."""
        return self.confidence == CLEAR

    @property
    def rounds(self) -> int:
        return len(self.samples[self.base])

    @property
    def seconds(self) -> dict[str, float]:
        """Each candidate's median seconds."""
        return {name: statistics.median(s) for name, s in self.samples.items()}

    def text(self) -> str:
        """One line for logs and reports, e.g. "within noise after 30 rounds: on 1.06x as fast
        as off"."""
        times = self.seconds
        best = min((n for n in times if n != self.base), key=lambda n: times[n], default=None)
        line = f"{self.outcome} after {self.rounds} round{'s' if self.rounds != 1 else ''}"
        if best is not None and times[best] > 0:
            line += f": {best} {times[self.base] / times[best]:.2f}x as fast as {self.base}"
        return line + (f" ({self.busy})" if self.busy else "")


def median_bounds(values: Sequence[float], alpha: float = ALPHA) -> tuple[float, float] | None:
    """Bounds holding the median of values' distribution with 1 - alpha confidence, from order
    statistics (no assumption on the distribution: a busy machine's times are skewed); None
    when there are too few values (fewer than 6 at 95%)."""
    n = len(values)
    ordered = sorted(values)
    k = 0
    # the interval [x_(k), x_(n-k+1)] misses the median with probability 2 P(Binom(n, 1/2) < k)
    while k < n // 2 and 2 * sum(math.comb(n, i) for i in range(k + 1)) <= alpha * 2 ** n:
        k += 1
    return None if k == 0 else (ordered[k - 1], ordered[n - k])


def decide(samples: Mapping[str, Sequence[float]], base: str,
           min_speedup: Speedup) -> tuple[str, bool]:
    """(chosen, clear) from rounds of samples: per challenger the rounds' ratios base / it (a
    load change within a round hits both), bounded at their median; a challenger whose lower
    bound beats what it must gain (min_speedup, one figure or one per challenger) wins clearly
    (the best median ratio among such), base stays clearly when no challenger's upper bound
    reaches what it must gain, and otherwise stays unclearly."""
    ratios = {name: [_ratio(b, c) for b, c in zip(samples[base], s)]
              for name, s in samples.items() if name != base}
    if not ratios:
        return base, True
    bounds = {name: median_bounds(r) for name, r in ratios.items()}
    winners = [name for name, b in bounds.items()
               if b is not None and b[0] > needs(min_speedup, name)]
    if winners:
        return max(winners, key=lambda name: statistics.median(ratios[name])), True
    clear = all(b is not None and b[1] <= needs(min_speedup, name) for name, b in bounds.items())
    return base, clear


def _ratio(base: float, other: float) -> float:
    """base / other, where a zero or infinite time still compares (no ZeroDivisionError)."""
    if other == base:
        return 1.0
    return math.inf if other == 0.0 else base / other


def stalled(samples: Mapping[str, Sequence[float]]) -> str:
    """Why a race's samples say the machine stalled (a candidate's median STALL_RATIO times its
    fastest sample and STALL_S over it: most of its calls waited milliseconds for a core, which
    no kernel's own work explains), or "" where none did. Such a verdict is used by the
    process that made it and measured again by the next (as a busy machine's)."""
    for name, values in samples.items():
        if len(values) < 2:
            continue
        low, mid = min(values), statistics.median(values)
        if mid > STALL_RATIO * low and mid - low > STALL_S:
            return (f"{name}'s calls stalled: median {mid * 1e3:.2f} ms, fastest "
                    f"{low * 1e3:.2f} ms")
    return ""


@dataclass(frozen=True)
class Race:
    """The rule of one choice: base is kept unless a challenger is clearly min_speedup times
    faster. Called with timing sources, it samples them in interleaved rounds within budget
    and watches the machine's load meanwhile (load: _load.open_window when None)."""

    base: str
    min_speedup: Speedup
    budget: Budget = Budget()
    load: Callable[[], _load.Window] | None = None
    adjust: Callable[[dict[str, float]], dict[str, float]] | None = None

    def __call__(self, sources: Mapping[str, Source]) -> Verdict:
        """Sample every source once to warm it (first calls compile, pack weights, fault pages
        in), then rounds, alternately forwards and backwards (no candidate always follows the
        same one), until decide() is clear or the budget is spent. adjust, when given, turns a
        round's samples into the candidates' (a timed helper priced into the others)."""
        names = list(sources)
        for name in names:
            sources[name]()
        window = (self.load or _load.open_window)()
        samples: dict[str, list[float]] = {}
        started = time.perf_counter()
        chosen, clear = self.base, False
        for r in range(self.budget.max_rounds):
            timed = {name: float(sources[name]()) for name in (names[::-1] if r % 2 else names)}
            for name, seconds in (self.adjust(timed) if self.adjust else timed).items():
                samples.setdefault(name, []).append(seconds)
            if r + 1 < self.budget.min_rounds:
                continue
            chosen, clear = decide(samples, self.base, self.min_speedup)
            if clear or time.perf_counter() - started >= self.budget.max_s:
                break
        busy = window() or stalled(samples)
        return Verdict(chosen, self.base, {n: tuple(s) for n, s in samples.items()},
                       CLEAR if clear else NOISE, busy)

    def known(self, seconds: Mapping[str, float]) -> Verdict:
        """The verdict on costs known without timing (nothing to repeat): fastest() on them."""
        return Verdict(fastest(seconds, self.base, self.min_speedup), self.base,
                       {name: (float(s),) for name, s in seconds.items()}, CLEAR)
