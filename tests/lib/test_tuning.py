"""The tuning service (lib/tuning.py): measured once per key, remembered on disk, never trusted."""
from __future__ import annotations

import itertools
import json
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pytest
from support import dense_spec

from graph_runtime import __version__, _load
from graph_runtime._timing import (BUSY, CLEAR, NOISE, Budget, Race, Verdict, fastest,
                                   median_bounds, sampler)
from graph_runtime.lib import tuning
from graph_runtime.lib.tunable import Candidate, TunableOp
from graph_runtime.lib.conv_params import conv2d_params
from graph_runtime.lib.kernels.cpu import conv_choice, dense_choice
from graph_runtime.lib.kernels.conv_epilogue import Epilogue
from graph_runtime.lib.kernels.threads import num_threads
from graph_runtime.lib.library import TensorSpec
from graph_runtime.settings import (GEMV_PADDING, NUM_THREADS, ONEDNN, ONEDNN_THREADS,
                                     TUNING_BUSY, TUNING_CACHE, TUNING_CONFIRM)

ROOT = Path(__file__).resolve().parents[2]
# A choice of the tests' own, forced by a real auto/on/off setting.
SWITCH = tuning.Choice("test.switch", GEMV_PADDING)
KEY = "float32 x 2x3"


def quiet() -> Callable[[], str]:
    """A load window that saw no other process."""
    return lambda: ""


def busy_now() -> Callable[[], str]:
    """A load window that saw other processes on the CPUs."""
    return lambda: "other processes used 1.2 of 2 CPUs"


class Counting:
    """A measure() that returns fixed seconds and counts its calls."""

    def __init__(self, seconds: Mapping[str, float]) -> None:
        self.seconds = dict(seconds)
        self.calls = 0

    def __call__(self, race: Race) -> Verdict:
        self.calls += 1
        return race.known(self.seconds)


def _choose(measure: Callable[[Race], Verdict], key: str = KEY) -> str:
    return SWITCH.choose("cpu", key, ("off", "on"), measure, "off", 1.1)


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A cache file of this test's own, and a process that remembers nothing yet."""
    monkeypatch.setenv(TUNING_CACHE.name, str(tmp_path / "cache"))
    monkeypatch.delenv(GEMV_PADDING.name, raising=False)
    tuning.forget()
    path = tuning.cache_path()
    assert path is not None and path.parent == tmp_path / "cache"
    yield path
    tuning.forget()


def _entry(**change: object) -> dict:
    """The file entry of SWITCH at KEY on this machine, with fields changed."""
    doc = {"choice": SWITCH.name, "device": "cpu", "key": KEY, "cpu": tuning.cpu_model(),
           "threads": num_threads(), "chosen": "off", "seconds": {"off": 1e-3, "on": 2e-3},
           "measured": "2024-01-01T00:00:00", "confidence": "clear", "base": "off",
           "agreed": 1}
    doc.update(change)
    return doc


def _file(*entries: dict, **change: object) -> bytes:
    doc = {"format": tuning.FORMAT, "version": __version__, "entries": list(entries)}
    doc.update(change)
    return json.dumps(doc).encode()


def test_a_cache_hit_measures_nothing(cache: Path) -> None:
    """A choice other than the base is measured again by the next process, which confirms it;
    from then on the file's answer is taken without measuring."""
    measure = Counting({"off": 2e-3, "on": 1e-3})
    assert _choose(measure) == "on" and measure.calls == 1
    assert _choose(measure) == "on" and measure.calls == 1  # remembered by the process
    tuning.forget()  # a new process: the file's answer is not confirmed yet
    assert _choose(measure) == "on" and measure.calls == 2
    tuning.forget()  # and the next one takes it
    assert _choose(measure) == "on" and measure.calls == 2
    (entry,) = json.loads(cache.read_text())["entries"]
    assert entry == _entry(chosen="on", seconds={"off": 2e-3, "on": 1e-3},
                           measured=entry["measured"], agreed=2)


def test_one_outlying_measurement_pins_nothing(cache: Path) -> None:
    """A candidate measured once as faster (oneDNN once timed at 7.6 ms against its 0.25 ms)
    is measured again by the next process; where that one disagrees, its answer stands and
    waits for its own confirmation, and the base needs none."""
    cache.parent.mkdir(parents=True)
    cache.write_bytes(_file(_entry(chosen="on", seconds={"off": 7.6e-3, "on": 0.5e-3})))
    quiet_run = Counting({"off": 0.25e-3, "on": 0.5e-3})
    assert _choose(quiet_run) == "off" and quiet_run.calls == 1
    tuning.forget()
    assert _choose(quiet_run) == "off" and quiet_run.calls == 1  # the base: trusted at once
    (entry,) = tuning.entries()
    assert (entry.chosen, entry.base, entry.agreed) == ("off", "off", 1)


def test_base_stays_unless_clearly_faster(cache: Path) -> None:
    assert _choose(Counting({"off": 1.05e-3, "on": 1e-3})) == "off"


def test_a_real_kernel_read_from_the_file_times_nothing(cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU conv2d: a second process picks the first one's strategy without timing any."""
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(TUNING_BUSY.name, "keep")  # trusted even if measured on a busy machine
    monkeypatch.delenv("GRAPH_RUNTIME_CONV", raising=False)
    timed = []
    real = conv_choice._race

    def counted(*args: object, **kwargs: object) -> Verdict:
        timed.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(conv_choice, "_race", counted)
    p = conv2d_params([TensorSpec((2, 8, 10, 10), "float32"), TensorSpec((8, 8, 3, 3), "float32")],
                      {"padding": [1, 1]})
    assert len(conv_choice.applicable(p)) > 1
    first = conv_choice.conv2d_cpu(p, Epilogue((), (2, 8, 10, 10))).strategy
    assert len(timed) == 1
    tuning.forget()
    assert conv_choice.conv2d_cpu(p, Epilogue((), (2, 8, 10, 10))).strategy == first
    assert len(timed) == 1
    (entry,) = tuning.entries()
    assert entry.choice == "cpu.conv2d" and entry.chosen == first
    assert set(entry.seconds) == set(conv_choice.candidates(p, Epilogue((), (2, 8, 10, 10))))


def test_forcing_overrides_the_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GEMV padding remembered: read back without timing, and forced off by its setting."""
    def no_timing(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured although the cache knows")
    monkeypatch.setenv(ONEDNN.name, "off")
    spec = dense_spec(1, 512, 784)
    for _ in range(2):  # measured, then confirmed by a second process
        assert dense_choice.DENSE.choice.choose("cpu", spec.key(), ("blas", "padded"),
                                                Counting({"blas": 1e-3, "padded": 1e-4}),
                                                "blas", 1.15) == "padded"
        tuning.forget()
    monkeypatch.setattr(dense_choice, "_race", no_timing)
    assert dense_choice.choose(spec) == "padded"
    monkeypatch.setenv(GEMV_PADDING.name, "off")
    assert dense_choice.choose(spec) == "blas"
    measure = Counting({"off": 2e-3, "on": 1e-3})
    assert _choose(measure) == "off" and measure.calls == 0


GARBAGE = {
    "bytes": b"\x00\xff\xfe not json",
    "truncated": _file(_entry())[:-7],
    "a list": b"[1, 2, 3]",
    "no entries": b'{"format": 1}',
    "entries not a list": _file(entries={"x": _entry()}),
    "wrong version": _file(_entry(), version="0.0.0-old"),
    "wrong format": _file(_entry(), format=99),
    "missing field": _file({k: v for k, v in _entry().items() if k != "chosen"}),
    "bad seconds": _file(_entry(seconds={"off": "fast", "on": 1e-3})),
    "unknown candidate": _file(_entry(chosen="fft", seconds={"off": 1e-3, "fft": 1e-4})),
    "other candidates": _file(_entry(seconds={"off": 1e-3, "on": 2e-3, "gone": 1e-4})),
    "unknown confidence": _file(_entry(confidence="sure")),
    "format 1 (no load guard)": _file({k: v for k, v in _entry().items() if k != "confidence"},
                                      format=1),
}


@pytest.mark.parametrize("content", GARBAGE.values(), ids=GARBAGE.keys())
def test_a_corrupt_or_stale_file_is_ignored_and_rewritten(cache: Path, content: bytes) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_bytes(content)
    measure = Counting({"off": 2e-3, "on": 1e-3})
    assert _choose(measure) == "on" and measure.calls == 1
    doc = json.loads(cache.read_text())
    assert doc["version"] == __version__ and doc["format"] == tuning.FORMAT
    assert [(e["key"], e["chosen"]) for e in doc["entries"]] == [(KEY, "on")]


def test_a_good_entry_beside_a_bad_one_is_kept(cache: Path) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_bytes(_file({"choice": 3}, _entry(chosen="on", seconds={"off": 2.0, "on": 1.0},
                                                  agreed=2)))
    measure = Counting({"off": 1e-3, "on": 2e-3})
    assert _choose(measure) == "on" and measure.calls == 0


WRITER = """
import sys
from graph_runtime.lib import tuning
from graph_runtime.settings import GEMV_PADDING
choice = tuning.Choice("test.switch", GEMV_PADDING)
for i in range(int(sys.argv[2])):
    choice.choose("cpu", f"{sys.argv[1]} {i}", ("off", "on"),
                  lambda race: race.known({"off": 1.0, "on": 0.5}), "off", 1.1)
"""


def _writer_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A writer process's environment, this process's too: a count of threads fixed (an entry
    is kept per count, which auto makes 1 while another process keeps a core busy: a writer
    and this process then asked different entries) and choices stored however busy the
    machine is (TUNING_BUSY), which these tests do not judge."""
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(TUNING_BUSY.name, "keep")
    return dict(os.environ, PYTHONPATH=str(ROOT))


def test_two_processes_writing_at_once_both_land(cache: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    env = _writer_env(monkeypatch)
    count = 30
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, name, str(count)], env=env,
                                stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    for writer in writers:
        _, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
    keys = {e.key for e in tuning.entries()}
    assert keys == {f"{name} {i}" for name in ("a", "b") for i in range(count)}
    assert [p.name for p in cache.parent.iterdir() if p.suffix == ".tmp"] == []


def test_off_keeps_choices_in_the_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TUNING_CACHE.name, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    tuning.forget()
    measure = Counting({"off": 2e-3, "on": 1e-3})
    assert _choose(measure) == "on" and _choose(measure) == "on" and measure.calls == 1
    assert tuning.cache_path() is None and tuning.listing()["path"] is None
    assert tuning.entries() == [] and tuning.clear() == 0
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_folder_costs_only_the_file(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    (tmp_path / "a file").write_text("")
    monkeypatch.setenv(TUNING_CACHE.name, str(tmp_path / "a file" / "cache"))
    tuning.forget()
    measure = Counting({"off": 2e-3, "on": 1e-3})
    assert _choose(measure) == "on" and _choose(measure) == "on" and measure.calls == 1
    assert tuning.entries() == [] and tuning.clear() == 0


def test_listing_and_clear(cache: Path) -> None:
    _choose(Counting({"off": 2e-3, "on": 1e-3}), key="k2")
    _choose(Counting({"off": 1e-3, "on": 2e-3}), key="k1")
    doc = tuning.listing()
    assert doc["path"] == str(cache) and doc["cpu"] == tuning.cpu_model()
    assert [(e["key"], e["chosen"]) for e in doc["entries"]] == [("k1", "off"), ("k2", "on")]
    assert tuning.clear() == 2
    assert not cache.exists() and tuning.entries() == [] and tuning.remembered() == []


def test_timing_helpers_name_every_candidate() -> None:
    calls = {"a": lambda: None, "b": lambda: np.ones(1000).sum()}
    verdict = Race("a", 1.5, Budget(6, 6), load=quiet)({n: sampler(c) for n, c in calls.items()})
    assert set(verdict.seconds) == {"a", "b"} and verdict.rounds == 6
    assert fastest({"a": 1.0, "b": 0.5}, "a", 1.5) == "b"
    assert fastest({"a": 1.0, "b": 0.9}, "a", 1.5) == "a"


def test_the_file_is_parsed_once_until_another_writer_replaces_it(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _writer_env(monkeypatch)
    cache.parent.mkdir(parents=True)
    cache.write_bytes(_file(_entry(), _entry(key="other", chosen="on",
                                             seconds={"off": 2.0, "on": 1.0}, agreed=2)))
    parsed: list[int] = []
    parse = tuning._parse_entries
    monkeypatch.setattr(tuning, "_parse_entries", lambda data: parsed.append(1) or parse(data))
    none = Counting({"off": 1.0, "on": 2.0})
    assert _choose(none) == "off" and _choose(none, "other") == "on"
    assert none.calls == 0 and len(parsed) == 1  # the second key came from the parsed file
    # two other processes store an entry and confirm it: the file is replaced, so it is read
    # again
    for _ in range(2):
        subprocess.run([sys.executable, "-c", WRITER, "third", "1"], cwd=ROOT, check=True,
                       env=env, timeout=120)
    assert _choose(none, "third 0") == "on" and none.calls == 0 and len(parsed) == 2


# ---- the race: interleaved rounds until the difference is clear (_timing.Race) ---------------

def scripted(*seconds: float) -> Callable[[], float]:
    """A timing source giving these seconds in turn, over and over (the first is the warm-up)."""
    times = itertools.cycle(seconds)
    return lambda: next(times)


def race(budget: Budget = Budget(6, 20, math.inf), load: Any = quiet) -> Race:
    return Race("off", 1.1, budget, load)


def test_median_bounds_need_six_samples_and_widen_with_skew() -> None:
    assert median_bounds([1.0] * 5) is None
    assert median_bounds([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (1.0, 6.0)  # 97% for n = 6
    assert median_bounds(list(range(30))) == (9, 20)


def test_a_clear_win_stops_at_the_fewest_rounds() -> None:
    verdict = race()({"off": scripted(1.0, 1.02, 0.98), "on": scripted(0.5, 0.51, 0.49)})
    assert (verdict.chosen, verdict.confidence, verdict.rounds) == ("on", CLEAR, 6)
    assert verdict.confident and verdict.text().startswith("clear after 6 rounds: on 2.0")


def test_a_challenger_clearly_not_fast_enough_keeps_the_base_early() -> None:
    verdict = race()({"off": scripted(1.0, 1.02, 0.98), "on": scripted(0.97, 0.99, 0.96)})
    assert (verdict.chosen, verdict.confidence, verdict.rounds) == ("off", CLEAR, 6)


def test_within_noise_the_budget_runs_out_and_the_base_stays() -> None:
    """Round ratios 0.95 and 1.45 in turn: medians 1.15x apart (past 1.1), but the bounds
    straddle 1.1 however long it samples."""
    verdict = race()({"off": scripted(1.0), "on": scripted(1 / 0.95, 1 / 1.45)})
    assert (verdict.chosen, verdict.confidence, verdict.rounds) == ("off", NOISE, 20)
    assert not verdict.confident and verdict.text().startswith("within noise after 20 rounds")
    # the old rule on medians alone would have taken the challenger
    assert fastest(verdict.seconds, "off", 1.1) == "on"


def test_it_keeps_sampling_until_the_difference_is_clear() -> None:
    """Three noisy rounds, then a steady 1.6x: clear once the noisy ones fall outside the
    bounds, before the budget's 20 rounds."""
    on = scripted(*([1.0] + [1 / 0.9, 1 / 1.6] * 3 + [1 / 1.6] * 40))
    verdict = race(Budget(6, 40, math.inf))({"off": scripted(1.0), "on": on})
    assert verdict.chosen == "on" and verdict.confidence == CLEAR
    assert 6 < verdict.rounds < 40


def test_busy_samples_are_not_confident() -> None:
    verdict = race(load=busy_now)({"off": scripted(1.0), "on": scripted(0.5)})
    assert verdict.chosen == "on" and verdict.confidence == BUSY and not verdict.confident
    assert verdict.text().endswith("(other processes used 1.2 of 2 CPUs)")


def test_calls_that_stalled_for_a_core_are_not_confident() -> None:
    """oneDNN's 0.3 ms product waiting ~7 ms for its sleeping OpenMP thread in most samples (a
    2-vCPU VM): used here, measured again by the next process, as a busy machine's."""
    verdict = race()({"off": scripted(0.0007), "on": scripted(0.0074, 0.0003, 0.0074, 0.0074)})
    assert verdict.confidence == BUSY and not verdict.confident
    assert "on's calls stalled: median 7.40 ms, fastest 0.30 ms" in verdict.text()
    # a few microseconds' kernel spread five-fold is no stall: no millisecond was waited
    verdict = race()({"off": scripted(1e-5), "on": scripted(2e-6, 2e-6, 1e-5, 1e-5)})
    assert verdict.busy == ""


def test_a_sampler_wakes_the_helpers_before_its_pause() -> None:
    """wake runs first, then the pause, then the timed calls: the helpers idle for the pause
    alone, whatever ran since their last sample."""
    from graph_runtime._timing import sampler
    events: list[str] = []
    sample = sampler(lambda: events.append("call"), pause_s=0.001,
                     wake=lambda: events.append("wake"), number=2)
    assert sample() >= 0.0
    assert events == ["wake", "call", "call"]


def test_rounds_alternate_their_order_and_adjust_prices_a_helper() -> None:
    order: list[str] = []

    def source(name: str, seconds: float) -> Callable[[], float]:
        def sample() -> float:
            order.append(name)
            return seconds
        return sample
    def adjust(s: dict[str, float]) -> dict[str, float]:
        return {"off": s["off"] + s["helper"], "on": s["on"]}
    verdict = replace(race(Budget(6, 6)), adjust=adjust)(
        {"off": source("off", 1.0), "on": source("on", 1.5), "helper": source("helper", 1.0)})
    assert order[3:9] == ["off", "on", "helper", "helper", "on", "off"]  # after the warm-up
    assert verdict.seconds == {"off": 2.0, "on": 1.5} and verdict.chosen == "on"


class Raced:
    """A measure() that races scripted sources (off 1.0 s, on as given) under a load window,
    and counts its calls."""

    def __init__(self, load: Callable[[], Callable[[], str]], on: float) -> None:
        self.load = load
        self.on = on
        self.calls = 0

    def __call__(self, given: Race) -> Verdict:
        self.calls += 1
        return replace(given, load=self.load)({"off": scripted(1.0), "on": scripted(self.on)})


def test_a_busy_measurement_is_kept_in_the_process_only(cache: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    busy = Raced(busy_now, 0.5)
    with caplog.at_level(logging.INFO, logger="graph_runtime"):
        assert _choose(busy) == "on" and _choose(busy) == "on"
    assert busy.calls == 1
    assert "kept in this process only" in caplog.text
    (entry,) = json.loads(cache.read_text())["entries"]
    assert entry["confidence"] == BUSY and entry["chosen"] == "on"
    tuning.forget()  # a new process measures again, on a quiet machine: the base wins there
    calm = Raced(quiet, 1.0)
    assert _choose(calm) == "off" and calm.calls == 1
    tuning.forget()  # and the next one trusts that
    assert _choose(calm) == "off" and calm.calls == 1
    assert [e.confidence for e in tuning.entries()] == [CLEAR]


def test_a_busy_measurement_never_replaces_a_trusted_entry(cache: Path) -> None:
    busy = Raced(busy_now, 0.5)

    def meanwhile(given: Race) -> Verdict:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(_file(_entry()))  # another process, on a quiet machine
        return busy(given)
    assert _choose(meanwhile) == "on"  # this process keeps what it measured
    assert [(e.chosen, e.confidence) for e in tuning.entries()] == [("off", CLEAR)]


def test_busy_keep_trusts_busy_entries(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TUNING_BUSY.name, "keep")
    busy = Raced(busy_now, 0.5)
    assert _choose(busy) == "on"
    tuning.forget()
    assert _choose(busy) == "on" and busy.calls == 2  # confirmed, busy as it was
    tuning.forget()
    assert _choose(busy) == "on" and busy.calls == 2


def test_a_busy_entry_serves_no_size_class_in_another_process(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A symbolic module's new shape takes no answer another process measured while busy (it
    took a slower kernel for every shape of the class); this process's own it keeps."""
    busy = Raced(busy_now, 0.5)
    assert _choose(busy, "m 260") == "on"
    with tuning.by_size_class():
        assert _choose(busy, "m 300") == "on"  # measured by this process: kept here
    tuning.forget()  # a new process
    defaults = tuning.class_defaults
    with tuning.by_size_class():
        assert _choose(busy, "m 260") == "off" and _choose(busy, "m 300") == "off"
    assert tuning.class_defaults == defaults + 2 and busy.calls == 1
    monkeypatch.setenv(TUNING_BUSY.name, "keep")
    tuning.forget()
    assert _choose(busy, "m 260") == "on" and busy.calls == 2  # confirmed: trusted with keep
    tuning.forget()
    with tuning.by_size_class():
        assert _choose(busy, "m 300") == "on"


def test_within_noise_is_recorded_and_trusted(cache: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    def noisy(given: Race) -> Verdict:
        return replace(given, load=quiet, budget=Budget(6, 12, math.inf))(
            {"off": scripted(1.0), "on": scripted(1 / 0.95, 1 / 1.45)})
    with caplog.at_level(logging.INFO, logger="graph_runtime"):
        assert _choose(noisy) == "off"
    assert "within noise after 12 rounds" in caplog.text and "(the base kept)" in caplog.text
    tuning.forget()
    assert _choose(Counting({"off": 1.0, "on": 0.1})) == "off"  # read back: not measured
    assert [e.confidence for e in tuning.entries()] == [NOISE]


def test_a_load_window_sees_another_process_on_the_cpus() -> None:
    """A process spinning on a CPU is a CPU's worth of other work, however many CPUs there are
    (this process's own time is not counted)."""
    if not _load.cpu_jiffies():
        pytest.skip("no /proc/stat here")
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # started and spinning
        assert _load.open_window(0.2)().startswith("other processes used ")
    finally:
        child.kill()
        child.wait()


# ---- tunable ops (lib/tunable.py) and the one speedup rule (_timing.min_speedup) ---------------

def test_no_module_but_the_rules_sets_a_speedup() -> None:
    """The one speedup rule: only _timing.py sets a *SPEEDUP constant or passes a literal one."""
    import ast
    found = []
    for path in sorted((ROOT / "graph_runtime").rglob("*.py")):
        if path.name == "_timing.py" and path.parent.name == "graph_runtime":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AnnAssign) else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {t.id}" for t in targets
                      if isinstance(t, ast.Name) and t.id.isupper() and t.id.endswith("SPEEDUP")]
            if isinstance(node, ast.Call):
                literal = [a for a in node.args if isinstance(a, ast.Constant)
                           and isinstance(a.value, float) and 1.0 < a.value < 2.0]
                called = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if called in ("choose", "Race") and literal:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} a literal speedup")
    assert found == []


def test_the_speedup_rule_by_kind() -> None:
    """What each choice asked before the rule, now read from it by the candidates' kinds."""
    from graph_runtime._timing import min_speedup
    assert min_speedup("plain", ["plain"]) == 1.1  # conv, OpenCL conv, transpose, oneDNN on/off
    assert min_speedup("plain", ["padded"]) == 1.15  # GEMV padding
    assert min_speedup("plain", ["split"]) == 1.25  # dense column split
    assert min_speedup("plain", ["spread", "spread"]) == 1.1  # tiles or blocks: small ops
    assert min_speedup("spread", ["plain", "spread"]) == 1.25  # ... large ones keep them
    assert min_speedup("plain", ["plan"]) == 1.05  # the auto planner's placement


def test_one_race_holds_each_challenger_to_its_kind() -> None:
    """Candidates of several kinds race at once, each challenger held to its own kind's gain."""
    from graph_runtime._timing import decide, speedups
    need = speedups("plain", {"padded": "padded", "tile": "spread"})
    assert need == {"padded": 1.15, "tile": 1.1}
    samples = {"base": [1.0] * 8, "padded": [1 / 1.12] * 8, "tile": [1 / 1.12] * 8}
    assert decide(samples, "base", need) == ("tile", True)
    assert decide(samples, "base", 1.15) == ("base", True)  # one figure for all: the most
    assert Race("base", need).known({"base": 1.0, "padded": 0.8, "tile": 0.95}).chosen == "padded"


def test_dense_is_one_candidate_set_with_one_entry(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                    run_op: Any) -> None:
    """Dense's ways (OpenBLAS's call, padding, tiles, oneDNN's matmul where it loads) race as
    one set: one measurement and one entry per shape, over every candidate offered."""
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(TUNING_BUSY.name, "keep")  # read back even if measured on a busy machine
    monkeypatch.setenv(TUNING_CONFIRM.name, "1")  # and taken from one measurement
    # padding is offered beside oneDNN's single-threaded kernels (not beside OpenMP's threads)
    monkeypatch.setenv(ONEDNN_THREADS.name, "workers")
    batched, gemv = dense_spec(64, 256, 256), dense_spec(1, 512, 784)
    assert {"whole", "cols", "rows"} <= set(dense_choice.offered(batched))
    assert {"blas", "padded"} <= set(dense_choice.offered(gemv))
    chosen = [dense_choice.choose(batched), dense_choice.choose(gemv)]
    entries = tuning.remembered()
    assert [e.choice for e in entries] == ["cpu.gemm", "cpu.gemm"]
    assert [e.chosen for e in entries] == chosen
    assert [set(e.seconds) for e in entries] == [set(dense_choice.offered(batched)),
                                                  set(dense_choice.offered(gemv))]
    tuning.forget()

    def no_timing(*args: object) -> None:
        raise AssertionError("measured although the cache knows")
    monkeypatch.setattr(dense_choice, "_race", no_timing)
    assert [dense_choice.choose(batched), dense_choice.choose(gemv)] == chosen
    # the op asks that one set and nothing else
    x, w = np.ones((64, 256), np.float32), np.ones((256, 256), np.float32)
    (got,) = run_op("cpu", "dense", [x, w])
    np.testing.assert_array_equal(got, np.full((64, 256), 256, np.float32))
    assert {e.choice for e in tuning.remembered()} == {"cpu.gemm"}


SET = TunableOp(tuning.Choice("test.set", GEMV_PADDING), (
    Candidate("off", lambda s: "plain kernel"),
    Candidate("on", lambda s: f"wide kernel for {s}", lambda s: s > 1, "spread"),
    Candidate("dnn", lambda s: "onednn kernel", lambda s: s > 2, onednn=True)), fallback="off")


@pytest.mark.parametrize("mode, offered", [("auto", ["off", "on", "dnn"]), ("off", ["off", "on"])])
def test_a_tunable_op_offers_what_applies_and_the_settings_allow(
        cache: Path, monkeypatch: pytest.MonkeyPatch, mode: str, offered: list[str]) -> None:
    monkeypatch.setenv(ONEDNN.name, mode)
    assert SET.offered(1) == ["off"] and SET.offered(3) == offered
    assert SET.build("on", 3) == "wide kernel for 3"


def test_a_tunable_op_forces_in_one_place(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice's setting forces a name where it is offered (fallback elsewhere); oneDNN=on
    forces its candidate wherever offered; else the race, under the rule for the base's kind."""
    measure = Counting({"off": 1.2e-3, "on": 1e-3, "dnn": 2e-3})
    assert SET.choose(["off", "on", "dnn"], "cpu", KEY, measure, "on") == "on"  # 1.25 to beat
    tuning.forget()
    assert SET.choose(["off", "on"], "cpu", "k2", measure, "off") == "on"  # 1.1 to beat
    assert measure.calls == 2
    monkeypatch.setenv(GEMV_PADDING.name, "off")
    assert SET.choose(["off", "on"], "cpu", KEY, measure, "on") == "off"
    monkeypatch.setenv(GEMV_PADDING.name, "on")
    assert SET.choose(["off"], "cpu", KEY, measure, "off") == "off"  # on does not apply
    monkeypatch.delenv(GEMV_PADDING.name)
    monkeypatch.setenv(ONEDNN.name, "on")
    assert SET.forced(["off", "on"]) is None and SET.forced(["off", "on", "dnn"]) == "dnn"
    assert measure.calls == 2


def test_by_size_class_never_measures_and_takes_the_classes_entry(cache: Path) -> None:
    """A symbolic module's new shape: the exact key's entry, else its class's, else the base;
    measure is never called."""
    assert tuning.size_class("float32 batch 1 m 300 n 512 k 33 4x12 (openmp)") == \
        "float32 batch 1 m 512 n 512 k 64 4x12 (openmp)"
    measure = Counting({"off": 2e-3, "on": 1e-3})
    defaults = tuning.class_defaults
    with tuning.by_size_class():
        assert _choose(measure, "m 300") == "off" and measure.calls == 0  # unknown: the base
    assert tuning.class_defaults == defaults + 1
    assert _choose(measure, "m 260") == "on" and measure.calls == 1  # measured outside run()
    tuning.forget()
    assert _choose(measure, "m 260") == "on" and measure.calls == 2  # confirmed
    with tuning.by_size_class():
        assert _choose(measure, "m 300") == "on"  # 300 and 260 are both of class 512
        assert _choose(measure, "m 100") == "off"  # class 128: nothing known, the base
    tuning.forget()  # a new process: the file's entry serves the class too
    with tuning.by_size_class():
        assert _choose(measure, "m 511") == "on"
    assert measure.calls == 2 and tuning.class_defaults == defaults + 2
