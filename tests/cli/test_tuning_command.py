"""`graphrun tuning` (cli/tuning_command.py): the listing, --json, --clear, and a second process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from click.testing import CliRunner

from graph_runtime.cli.app import app
from graph_runtime.lib import tuning
from graph_runtime.settings import (GEMV_PADDING, ONEDNN_THREADS, TUNING_BUSY, TUNING_CACHE,
                                     TUNING_CONFIRM)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.setenv(TUNING_CACHE.name, str(tmp_path))
    monkeypatch.delenv(GEMV_PADDING.name, raising=False)
    tuning.forget()
    path = tuning.cache_path()
    assert path is not None
    yield path
    tuning.forget()


def _remember(key: str) -> None:
    choice = tuning.Choice("test.switch", GEMV_PADDING)
    choice.choose("cpu", key, ("off", "on"), lambda race: race.known({"off": 2e-3, "on": 1e-3}),
                  "off", 1.1)


def test_listing_text_json_and_clear(cache: Path) -> None:
    runner = CliRunner()
    empty = runner.invoke(app, ["tuning"])
    assert empty.exit_code == 0
    assert f"tuning cache: {cache} (0 choices)" in empty.output
    assert "nothing measured yet" in empty.output
    _remember("float32 x 2x3")
    text = runner.invoke(app, ["tuning"]).output
    assert "(1 choice)" in text and "times (ms, * chosen)" in text
    assert "test.switch" in text and "float32 x 2x3" in text and "on 1.000*, off 2.000" in text
    doc = json.loads(runner.invoke(app, ["tuning", "--json"]).output)
    assert doc == tuning.listing()
    assert doc["entries"][0]["seconds"] == {"off": 2e-3, "on": 1e-3}
    cleared = runner.invoke(app, ["tuning", "--clear", "--json"])
    assert cleared.exit_code == 0
    assert json.loads(cleared.output) == {"path": str(cache), "cleared": 1}
    assert not cache.exists()
    assert runner.invoke(app, ["tuning", "--clear"]).output.startswith("cleared 0 choices from ")


def test_listing_when_the_cache_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TUNING_CACHE.name, "off")
    result = CliRunner().invoke(app, ["tuning"])
    assert result.exit_code == 0
    assert result.output.startswith("tuning cache: off (GRAPH_RUNTIME_TUNING_CACHE=off)")


def test_a_second_run_in_a_new_process_measures_nothing(tmp_path: Path) -> None:
    """`graphrun run` of a conv example twice: the first measures its convs, the second reads
    every choice from the cache (no `tuning: measured` line, the file untouched)."""
    # NOTE: oneDNN's threading mode is part of its timings' keys, and auto decides it per
    # process from the machine's load: pinned, so both processes ask for the same entries.
    # Choices measured while the machine is busy are measured again by the next process
    # unless TUNING_BUSY is keep: a busy test machine must not fail this test.
    # (and a choice is trusted from one measurement: this test is about reading it back)
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{TUNING_CACHE.name: str(tmp_path),
                                                    ONEDNN_THREADS.name: "workers",
                                                    TUNING_BUSY.name: "keep",
                                                    TUNING_CONFIRM.name: "1"})
    env.pop("GRAPH_RUNTIME_CONV", None)

    def graphrun(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        return done
    first = graphrun("-v", "run", "examples/graphs/cnn", "-d", "cpu")
    assert "tuning: measured cpu.conv2d" in first.stderr
    listed = json.loads(graphrun("tuning", "--json").stdout)
    assert listed["path"] is not None
    before = Path(listed["path"]).read_bytes()
    assert "cpu.conv2d" in {e["choice"] for e in listed["entries"]}  # oneDNN adds its own
    second = graphrun("-v", "run", "examples/graphs/cnn", "-d", "cpu")
    assert "tuning: measured" not in second.stderr
    assert "expected   OK" in second.stdout
    assert Path(listed["path"]).read_bytes() == before
