"""The tuning service: which candidate kernel serves a key, measured once and remembered on disk.

A kernel with several strategies declares a Choice (its name and the setting that forces it)
and asks choice.choose(...) at create(). The first process to meet a key (the op's shapes and
dtypes, the device, the CPU model and the worker count) races the candidates (_timing.Race:
interleaved rounds until the difference is clear, the base kept within noise) and writes the
times, the winner and how sure it was to tuning-<version>.json in the cache folder
(settings.tuning_cache_dir); later processes read the winner and measure nothing, so they pick
the same kernels. An answer measured while other processes kept the CPUs busy is marked so and
measured again by the next process (GRAPH_RUNTIME_TUNING_BUSY=keep trusts it). The file is never
trusted: an unreadable or malformed file, or an entry whose candidates are not this call's, is
ignored and measured again. Writers merge with what is on disk under a lock file and replace the
file whole, so two processes writing at once both land their entries.

Inside by_size_class() (a symbolic module specialising for a new shape) nothing is measured:
each dim in the key is rounded to its size class (size_class), the exact key's entry or one of
its class is taken from this process or the file, and an unknown class gets the base candidate.
Any entry (measured here or read from the file) also serves its class, so a module tuned at
representative sizes (runtime/symbolic_module.py's tune) decides every shape of those classes.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import logging
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from .. import settings
from .._timing import BUSY, CLEAR, NOISE, Race, Speedup, Verdict
from .._version import __version__
from .kernels.threads import num_threads

log = logging.getLogger("graph_runtime")

FORMAT = 2  # the file's layout; a file of another layout is ignored (and rewritten)
# NOTE: format 1 entries were kept however busy the machine was when measured (issue 33).


@dataclass(frozen=True)
class Entry:
    """One measured choice: the key it was measured for, each candidate's seconds, the winner."""

    choice: str
    device: str
    key: str
    cpu: str
    threads: int
    chosen: str
    seconds: Mapping[str, float]
    measured: str  # when, ISO 8601 local time
    confidence: str = CLEAR  # CLEAR, NOISE (the base kept undecided) or BUSY (not trusted)
    base: str = ""  # the candidate kept unless another clearly won ("": a file of before)
    agreed: int = 1  # measurements in a row (processes) that chose `chosen`

    @property
    def ident(self) -> str:
        """The entry's key in the file: everything it was measured for."""
        return f"{self.choice}|{self.device}|{self.cpu}|threads={self.threads}|{self.key}"

    def to_json(self) -> dict[str, Any]:
        return {"choice": self.choice, "device": self.device, "key": self.key, "cpu": self.cpu,
                "threads": self.threads, "chosen": self.chosen, "seconds": dict(self.seconds),
                "measured": self.measured, "confidence": self.confidence, "base": self.base,
                "agreed": self.agreed}

    @classmethod
    def from_json(cls, doc: Any) -> Entry | None:
        """The entry doc describes, or None when any field is missing or of the wrong type."""
        if not isinstance(doc, dict):
            return None
        text = ("choice", "device", "key", "cpu", "chosen", "measured", "confidence")
        if not all(isinstance(doc.get(name), str) for name in text):
            return None
        threads, seconds = doc.get("threads"), doc.get("seconds")
        if type(threads) is not int or not isinstance(seconds, dict) or not seconds:
            return None
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and s >= 0
                   for s in seconds.values()):
            return None
        if doc["chosen"] not in seconds or doc["confidence"] not in (CLEAR, NOISE, BUSY):
            return None
        base, agreed = doc.get("base", ""), doc.get("agreed", 1)
        if not isinstance(base, str) or type(agreed) is not int or agreed < 1:
            return None
        return cls(doc["choice"], doc["device"], doc["key"], doc["cpu"], threads, doc["chosen"],
                   {str(k): float(v) for k, v in seconds.items()}, doc["measured"],
                   doc["confidence"], base, agreed)

    @property
    def trusted(self) -> bool:
        """Whether a later process may take this entry without measuring again: not measured
        on a busy machine (unless GRAPH_RUNTIME_TUNING_BUSY=keep), and keeping the base or
        confirmed by a second measurement (one sample run could pin a slower kernel for good:
        oneDNN timed at 7.6 ms against its 0.25 ms once took a T5 encoder's QKV product off
        oneDNN in every later process)."""
        if self.confidence == BUSY and settings.word(settings.TUNING_BUSY) != "keep":
            return False
        return self.chosen == self.base or self.agreed >= settings.tuning_confirm()


@dataclass(frozen=True)
class Choice:
    """A named choice among candidate kernels, forced by one setting (auto: measured)."""

    name: str
    setting: settings.Setting

    def forced(self) -> str | None:
        """The candidate the setting forces, or None for auto (measured)."""
        value = settings.word(self.setting)
        return None if value == "auto" else value

    def choose(self, device: str, key: str, candidates: Sequence[str],
               measure: Callable[[Race], Verdict], base: str, min_speedup: Speedup) -> str:
        """The forced candidate if it is one of candidates, else the remembered or measured one.

        Args:
            device: where the kernel runs ("cpu", or an OpenCL device with its name).
            key: the op's shapes, dtypes and attributes, as a readable line.
            measure: given the race (base, min_speedup), its verdict over every one of
                candidates: race(timing sources), or race.known(costs) where nothing is timed.
                Called once per key.
            base: the candidate kept unless another is clearly min_speedup times faster (one
                figure, or one per challenger).
        """
        forced = self.forced()
        if forced is not None and forced in candidates:
            return forced
        wanted = Entry(self.name, device, key, cpu_model(), num_threads(), base, {}, "")
        with _lock:
            scope = _by_class.get()
            if scope is not None:
                # a shape met by a symbolic module's run(): the exact key's entry, its class's,
                # else the base; never measured here (the file read once per scope)
                if "classes" not in scope:
                    scope["classes"] = _class_entries()
                entry = _memo.get(wanted.ident) or scope["classes"].get(wanted.ident)
                if entry is None or not _fits(entry, candidates):
                    entry = scope["classes"].get(_class_ident(wanted))
                if entry is not None and _fits(entry, candidates):
                    return entry.chosen
                global class_defaults
                class_defaults += 1
                return base
            entry = _known(wanted.ident, candidates)
            if entry is None:
                entry = _measure(wanted, candidates, measure, base, min_speedup)
                _store(entry)
            _memo[wanted.ident] = entry
            return entry.chosen


def _known(ident: str, candidates: Sequence[str]) -> Entry | None:
    """The entry for ident this process remembers, else the file's if trusted (remembered from
    then on); None when neither has one over exactly these candidates.

    NOTE: this process keeps what it measured while busy; the file's busy entries were another
    process's, measured again here."""
    entry = _memo.get(ident)
    if entry is not None and _fits(entry, candidates):
        return entry
    entry = _read_entries().get(ident)
    if entry is None or not _fits(entry, candidates) or not entry.trusted:
        return None
    _memo[ident] = entry
    return entry


# Integers standing alone in a key (not inside a word such as float32; 4x12's both count).
_DIM = re.compile(r"(?<![A-WYZa-wyz_.\d])\d+")
SMALL_DIM = 16  # dims up to this stay exact in a size class (batch, heads: each one matters)


def size_class(key: str) -> str:
    """key with every dim over SMALL_DIM rounded up to a power of two (300 -> 512): one tuning
    decision serves every shape of the class."""
    return _DIM.sub(lambda match: str(_class_dim(int(match.group()))), key)


def class_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """shape's size class as size_class rounds a key's dims: over SMALL_DIM, the power of two
    at or above (its 0s and small dims exact)."""
    return tuple(_class_dim(d) for d in shape)


def _class_dim(d: int) -> int:
    """d over SMALL_DIM rounded up to a power of two; d itself at or under it."""
    return d if d <= SMALL_DIM else 1 << (d - 1).bit_length()


def in_size_class_scope() -> bool:
    """Whether kernels are being prepared for a symbolic module's new shape (by_size_class)."""
    return _by_class.get() is not None


def _class_ident(entry: Entry) -> str:
    ident = entry.ident
    found = _class_idents.get(ident)
    if found is None:
        found = _class_idents[ident] = dataclasses.replace(entry, key=size_class(entry.key)).ident
    return found


# ident -> its class's ident: a file that other processes keep adding to is indexed again per
# change, and rounding every key of a 9,000-entry file cost 25 ms of each new decode shape
_class_idents: dict[str, str] = {}


def _class_entries() -> dict[str, Entry]:
    """Every entry of this process and every trusted entry of the file (Entry.trusted: a
    busy machine's answer serves no other process, as _known), by its own ident and by its
    class's (this process's and clear answers first); kept until the file, the memory or the
    busy setting changes."""
    global _classes
    entries = _read_entries()
    # what trusted() reads: asking all entries cost 2-3 ms of every new shape
    stamp = (_parsed[0] if _parsed is not None else None, len(_memo),
             settings.word(settings.TUNING_BUSY), settings.tuning_confirm())
    if _classes is not None and _classes[0] == stamp:
        return _classes[1]
    found = {ident: e for ident, e in entries.items() if e.trusted}
    index: dict[str, Entry] = {**found, **_memo}
    ranked = sorted([*_memo.values(), *found.values()], key=lambda e: e.confidence != CLEAR)
    for entry in ranked:
        index.setdefault(_class_ident(entry), entry)
    _classes = (stamp, index)
    return index


_classes: tuple[Any, dict[str, Entry]] | None = None


@contextlib.contextmanager
def by_size_class() -> Iterator[None]:
    """Within: choices are taken per size class and never measured (see the module docstring)."""
    token = _by_class.set({})
    try:
        yield
    finally:
        _by_class.reset(token)


# Within by_size_class(): what it read of the file ("classes": _class_entries()); None outside.
_by_class: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "by_size_class", default=None)
class_defaults = 0  # choices by_size_class() left at the base: no entry for their class


_memo: dict[str, Entry] = {}
_lock = threading.RLock()  # measuring one choice never asks another, but stay safe if it does


@functools.cache
def cpu_model() -> str:
    """This machine's CPU model, part of every key."""
    from ..backends.cpu import cpu_name
    return cpu_name()


def cache_path() -> Path | None:
    """The cache file (tuning-<version>.json in the cache folder), or None when it is off."""
    folder = settings.tuning_cache_dir()
    return None if folder is None else folder / f"tuning-{__version__}.json"


def entries() -> list[Entry]:
    """Every well-formed entry of the cache file, in the file's order (none when it is off)."""
    return list(_read_entries().values())


def listing() -> dict[str, Any]:
    """The cache file's path and entries (sorted by choice, device and key) as JSON data."""
    path = cache_path()
    found = sorted(entries(), key=lambda e: (e.choice, e.device, e.key, e.threads))
    return {"path": None if path is None else str(path), "setting": settings.TUNING_CACHE.name,
            "cpu": cpu_model(), "entries": [e.to_json() for e in found]}


def remembered() -> list[Entry]:
    """What this process chose by measuring or from the file, in the order it asked."""
    with _lock:
        return list(_memo.values())


def forget() -> None:
    """Drop what this process remembers (the next choose reads the file again, as a new process
    would)."""
    global _parsed
    with _lock:
        _memo.clear()
        _parsed = None


def clear() -> int:
    """Empty the cache file and this process's memory; the number of entries the file held."""
    with _lock:
        _memo.clear()
        path = cache_path()
        if path is None or not path.parent.is_dir():
            return 0
        with _file_lock(path):
            count = len(_read_entries())
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return count


def _fits(entry: Entry, candidates: Sequence[str]) -> bool:
    """Whether entry was measured over exactly these candidates (else it is stale)."""
    return set(entry.seconds) == set(candidates) and entry.chosen in candidates


def _measure(wanted: Entry, candidates: Sequence[str], measure: Callable[[Race], Verdict],
             base: str, min_speedup: Speedup) -> Entry:
    start = time.perf_counter()
    verdict = measure(Race(base, min_speedup))
    seconds = verdict.seconds
    missing = [name for name in candidates if name not in seconds]
    assert not missing, f"{wanted.choice}: measure() left out {missing}"
    kept = {CLEAR: "" if verdict.chosen == base else " (measured again by the next process, "
                   "which confirms it)", NOISE: " (the base kept)",
            BUSY: " (kept in this process only: measured again by the next)"}
    log.info("tuning: measured %s on %s for %s in %.3f s: %s, %s%s", wanted.choice,
             wanted.device, wanted.key, time.perf_counter() - start, verdict.chosen,
             verdict.text(), kept[verdict.confidence])
    return Entry(wanted.choice, wanted.device, wanted.key, wanted.cpu, wanted.threads,
                 verdict.chosen, seconds, time.strftime("%Y-%m-%dT%H:%M:%S"),
                 verdict.confidence, base)


# (path, inode, size, mtime) of the file last parsed, and its entries: a process asked the
# file once per new key, and a warm BERT-base start parsed its 370 KB five times (0.1 s). Every
# store replaces the file by a new one (a new inode), so a changed file is never taken for it.
_parsed: tuple[tuple[str, int, int, int], dict[str, Entry]] | None = None


def _read_entries() -> dict[str, Entry]:
    """The cache file's well-formed entries by ident; {} when it is off, missing or malformed."""
    global _parsed
    path = cache_path()
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            stamp = (str(path), info.st_ino, info.st_size, info.st_mtime_ns)
            if _parsed is not None and _parsed[0] == stamp:
                return dict(_parsed[1])
            data = f.read()
    except OSError:  # missing or unreadable
        return {}
    found = _parse_entries(data)
    _parsed = (stamp, found)
    return dict(found)


def _parse_entries(data: bytes) -> dict[str, Entry]:
    """The well-formed entries of a cache file's bytes by ident; {} when it is malformed."""
    try:
        doc = json.loads(data)
    except ValueError:  # not UTF-8 or not JSON
        return {}
    if (not isinstance(doc, dict) or doc.get("format") != FORMAT
            or doc.get("version") != __version__ or not isinstance(doc.get("entries"), list)):
        return {}
    found: dict[str, Entry] = {}
    for item in doc["entries"]:
        entry = Entry.from_json(item)
        if entry is not None:
            found[entry.ident] = entry
    return found


def _store(entry: Entry) -> None:
    """Add entry to the cache file: merge with what is on disk, then replace the file whole."""
    path = cache_path()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(path):
            merged = _read_entries()
            there = merged.get(entry.ident)
            if there is not None and there.chosen == entry.chosen and (
                    BUSY not in (there.confidence, entry.confidence)
                    or settings.word(settings.TUNING_BUSY) == "keep"):
                entry = dataclasses.replace(entry, agreed=there.agreed + 1)  # confirmed
            if (there is not None and there.trusted and not entry.trusted
                    and set(there.seconds) == set(entry.seconds)):
                return  # another process measured this key (quieter, or confirmed) meanwhile
            merged[entry.ident] = entry
            doc = {"format": FORMAT, "version": __version__,
                   "entries": [e.to_json() for e in merged.values()]}
            fd, temp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(doc, f, indent=1)
                os.replace(temp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
    except OSError as e:
        # NOTE: a cache that cannot be written only costs the next process a measurement.
        log.info("tuning: cannot write %s: %s", path, e)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold path's lock file (flock) so that writers merge one after another."""
    try:
        import fcntl
    except ImportError:  # not POSIX: os.replace alone keeps the file whole
        yield
        return
    with open(path.parent / (path.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
