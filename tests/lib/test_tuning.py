"""The tuning service (lib/tuning.py): measured once per key, remembered on disk, never trusted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np
import pytest

from graph_runtime import __version__
from graph_runtime.lib import tuning
from graph_runtime.lib.conv_params import conv2d_params
from graph_runtime.lib.kernels.cpu import conv_choice, padded_gemv
from graph_runtime.lib.kernels.cpu.conv_epilogue import Epilogue
from graph_runtime.lib.kernels.cpu.threads import num_threads
from graph_runtime.lib.library import TensorSpec
from graph_runtime.settings import GEMV_PADDING, NUM_THREADS, TUNING_CACHE

ROOT = Path(__file__).resolve().parents[2]
# A choice of the tests' own, forced by a real auto/on/off setting.
SWITCH = tuning.Choice("test.switch", GEMV_PADDING)
KEY = "float32 x 2x3"


class Counting:
    """A measure() that returns fixed seconds and counts its calls."""

    def __init__(self, seconds: Mapping[str, float]) -> None:
        self.seconds = dict(seconds)
        self.calls = 0

    def __call__(self) -> Mapping[str, float]:
        self.calls += 1
        return self.seconds


def _choose(measure: Counting, key: str = KEY) -> str:
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
           "measured": "2024-01-01T00:00:00"}
    doc.update(change)
    return doc


def _file(*entries: dict, **change: object) -> bytes:
    doc = {"format": tuning.FORMAT, "version": __version__, "entries": list(entries)}
    doc.update(change)
    return json.dumps(doc).encode()


def test_a_cache_hit_measures_nothing(cache: Path) -> None:
    measure = Counting({"off": 2e-3, "on": 1e-3})
    assert _choose(measure) == "on" and measure.calls == 1
    assert _choose(measure) == "on" and measure.calls == 1  # remembered by the process
    tuning.forget()  # a new process: only the file knows
    assert _choose(measure) == "on" and measure.calls == 1
    (entry,) = json.loads(cache.read_text())["entries"]
    assert entry == _entry(chosen="on", seconds={"off": 2e-3, "on": 1e-3},
                           measured=entry["measured"])


def test_base_stays_unless_clearly_faster(cache: Path) -> None:
    assert _choose(Counting({"off": 1.05e-3, "on": 1e-3})) == "off"


def test_a_real_kernel_read_from_the_file_times_nothing(cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU conv2d: a second process picks the first one's strategy without timing any."""
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.delenv("GRAPH_RUNTIME_CONV", raising=False)
    timed = []
    real = conv_choice.median_seconds

    def counted(*args: object, **kwargs: object) -> Mapping[str, float]:
        timed.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(conv_choice, "median_seconds", counted)
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
    """GEMV padding remembered "on": read back without timing, and forced off by its setting."""
    def no_timing(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured although the cache knows")
    key = "float32 x 1x784 weight 512x784 padded to 588 rows"
    assert padded_gemv.CHOICE.choose("cpu", key, ("off", "on"),
                                     Counting({"off": 1e-3, "on": 1e-4}), "off", 1.15) == "on"
    tuning.forget()
    monkeypatch.setattr(padded_gemv, "best_seconds", no_timing)
    assert padded_gemv.padded_rows(784, 512, "float32") == 588
    monkeypatch.setenv(GEMV_PADDING.name, "off")
    assert padded_gemv.padded_rows(784, 512, "float32") == 0
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
    cache.write_bytes(_file({"choice": 3}, _entry(chosen="on", seconds={"off": 2.0, "on": 1.0})))
    measure = Counting({"off": 1e-3, "on": 2e-3})
    assert _choose(measure) == "on" and measure.calls == 0


WRITER = """
import sys
from graph_runtime.lib import tuning
from graph_runtime.settings import GEMV_PADDING
choice = tuning.Choice("test.switch", GEMV_PADDING)
for i in range(int(sys.argv[2])):
    choice.choose("cpu", f"{sys.argv[1]} {i}", ("off", "on"), lambda: {"off": 1.0, "on": 0.5},
                  "off", 1.1)
"""


def test_two_processes_writing_at_once_both_land(cache: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
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
    from graph_runtime._timing import best_seconds, fastest, median_seconds
    calls = {"a": lambda: None, "b": lambda: np.ones(1000).sum()}
    assert set(best_seconds(calls, 2)) == set(median_seconds(calls, 3)) == {"a", "b"}
    assert fastest({"a": 1.0, "b": 0.5}, "a", 1.5) == "b"
    assert fastest({"a": 1.0, "b": 0.9}, "a", 1.5) == "a"


def test_the_file_is_parsed_once_until_another_writer_replaces_it(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_bytes(_file(_entry(), _entry(key="other", chosen="on",
                                             seconds={"off": 2.0, "on": 1.0})))
    parsed: list[int] = []
    parse = tuning._parse_entries
    monkeypatch.setattr(tuning, "_parse_entries", lambda data: parsed.append(1) or parse(data))
    none = Counting({"off": 1.0, "on": 2.0})
    assert _choose(none) == "off" and _choose(none, "other") == "on"
    assert none.calls == 0 and len(parsed) == 1  # the second key came from the parsed file
    # another process stores an entry: the file is replaced, so it is read again
    subprocess.run([sys.executable, "-c", WRITER, "third", "1"], cwd=ROOT, check=True,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert _choose(none, "third 0") == "on" and none.calls == 0 and len(parsed) == 2
