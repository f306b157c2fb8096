"""Every GRAPH_RUNTIME_* setting (settings.py): read at use time, refused with the choices, listed."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from graph_runtime import settings
from graph_runtime.errors import LibraryError

ROOT = Path(__file__).resolve().parents[1]
WORDS = [s for s in settings.SETTINGS if s.values]


@pytest.mark.parametrize("setting", WORDS, ids=[s.name for s in WORDS])
def test_words_are_read_at_use_time_and_refused_by_name(setting: settings.Setting,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(setting.name, raising=False)
    assert settings.word(setting) == setting.default
    for value in setting.values:
        monkeypatch.setenv(setting.name, f" {value.upper()} ")
        assert settings.word(setting) == value
    monkeypatch.setenv(setting.name, "sideways")
    with pytest.raises(LibraryError) as e:
        settings.word(setting)
    assert str(e.value) == f"{setting.name} must be {setting.allowed()}, got 'sideways'"
    assert all(value in str(e.value) for value in setting.values)


def test_allowed_values_read_as_a_sentence() -> None:
    assert settings.GEMV_PADDING.allowed() == "auto, on or off"
    assert settings.CONV.allowed().startswith("auto or one of im2col, im2col_rows, ")
    assert "auto" not in settings.CONV.choices


def test_num_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(settings.NUM_THREADS.name, raising=False)
    assert settings.num_threads() is None
    monkeypatch.setenv(settings.NUM_THREADS.name, "3")
    assert settings.num_threads() == 3
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(settings.NUM_THREADS.name, bad)
        with pytest.raises(LibraryError, match=f"GRAPH_RUNTIME_NUM_THREADS must be a positive "
                                               f"integer, got '{bad}'"):
            settings.num_threads()


def test_tuning_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = settings.TUNING_CACHE.name
    monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert settings.tuning_cache_dir() == tmp_path / "xdg" / "graph_runtime"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert settings.tuning_cache_dir() == tmp_path / "home" / ".cache" / "graph_runtime"
    monkeypatch.setenv(name, str(tmp_path / "mine"))
    assert settings.tuning_cache_dir() == tmp_path / "mine"
    monkeypatch.setenv(name, "OFF")
    assert settings.tuning_cache_dir() is None


def test_the_package_reads_the_environment_only_here() -> None:
    package = ROOT / "graph_runtime"
    readers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                     if re.search(r"os\.environ\.get|os\.getenv|GRAPH_RUNTIME_\w+\"",
                                  p.read_text(encoding="utf-8")))
    assert readers == ["settings.py"]


def test_the_readme_table_lists_every_setting() -> None:
    rows = {line.split("|")[1].strip().strip("`"): line
            for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `GRAPH_RUNTIME_")}
    assert set(rows) == {s.name for s in settings.SETTINGS}
    for setting in WORDS:
        row = rows[setting.name]
        assert all(f"`{value}`" in row.split("|")[2] for value in setting.values), row
        assert f"`{setting.default}`" in row.split("|")[3], row


def test_a_held_scope_reads_each_setting_once_on_its_thread(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """A module's build holds its settings (settings.held): a change inside the scope is seen
    after it, never halfway through one build; another thread reads the environment."""
    import threading
    setting = settings.GEMV_PADDING
    monkeypatch.setenv(setting.name, "on")
    reads: list[int] = []
    with settings.held():
        assert settings.word(setting) == "on"
        monkeypatch.setenv(setting.name, "off")
        assert settings.word(setting) == "on"
        with settings.held():  # nested: the outer scope's values
            assert settings.word(setting) == "on"
        elsewhere: list[str] = []
        thread = threading.Thread(target=lambda: elsewhere.append(settings.word(setting)))
        thread.start()
        thread.join()
        assert elsewhere == ["off"]
        assert settings.held_value("k", lambda: reads.append(1) or 7) == 7
        assert settings.held_value("k", lambda: reads.append(1) or 8) == 7
    assert settings.word(setting) == "off"
    assert settings.held_value("k", lambda: reads.append(1) or 9) == 9 and len(reads) == 2
