"""Regression suites: read a suite TOML, run each case on each device set, write JUnit XML."""
from __future__ import annotations

import fnmatch
import os
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..device import device as parse_device
from ..errors import DeviceError, GraphRuntimeError
from .job import (TOLERANCES, Comparison, compare, expected_outputs, job_from_files, output_names,
                  parse_devices, resolve_files, tolerance_problem)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SUITE_KEYS = ("defaults", "case")
SETTING_KEYS = ("lib", "params", "inputs", "expected", "devices", "rtol", "atol", "strict", "seed")
CASE_KEYS = ("name", "graph") + SETTING_KEYS
DEFAULTS = {"devices": [["cpu"]], **TOLERANCES, "strict": False, "seed": 0}
_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,), "graph": (str,), "lib": (str,), "params": (str,), "inputs": (str,),
    "expected": (str,), "devices": (list,), "rtol": (int, float), "atol": (int, float),
    "strict": (bool,), "seed": (int,)}


@dataclass(frozen=True)
class Case:
    """One suite case with its paths resolved against the suite file and defaults applied."""

    name: str
    graph: Path
    lib: Path | None
    params: Path | None
    inputs: Path | None
    expected: Path
    devices: tuple[tuple[str, ...], ...]
    rtol: float
    atol: float
    strict: bool
    seed: int


@dataclass
class CaseResult:
    """The outcome of one case on one device set: passed, failed, error or skipped."""

    case: Case
    devices: tuple[str, ...]
    status: str
    message: str = ""
    seconds: float = 0.0
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def case_id(self) -> str:
        return case_id(self.case, self.devices)


def case_id(case: Case, devices: Sequence[str]) -> str:
    """How reports and -k name a case on a device set: name[cpu+opencl]."""
    return f"{case.name}[{'+'.join(devices)}]"


def load_suite(path: str | os.PathLike[str]) -> list[Case]:
    """The cases of a suite TOML; errors name the file, the case and the key."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise GraphRuntimeError(f"{path}: cannot read the suite: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise GraphRuntimeError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from e
    except tomllib.TOMLDecodeError as e:
        raise GraphRuntimeError(f"{path}: not valid TOML: {e}") from e
    _check_keys(doc, SUITE_KEYS, f"{path}: top level")
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise GraphRuntimeError(f"{path}: [defaults] must be a table, got {defaults!r}")
    _check_keys(defaults, SETTING_KEYS, f"{path}: [defaults]")
    cases = doc.get("case", [])
    if not isinstance(cases, list) or not cases:
        raise GraphRuntimeError(f"{path}: expected one or more [[case]] tables, found none")
    result = []
    names: set[str] = set()
    for i, raw in enumerate(cases):
        where = f"{path}: case {i + 1}" + (f" {raw.get('name')!r}" if raw.get("name") else "")
        _check_keys(raw, CASE_KEYS, where)
        settings = {**DEFAULTS, **defaults, **raw}
        for key, value in settings.items():
            if not isinstance(value, _TYPES[key]) or (isinstance(value, bool)
                                                      and bool not in _TYPES[key]):
                raise GraphRuntimeError(f"{where}: {key} must be "
                                        f"{' or '.join(t.__name__ for t in _TYPES[key])}, "
                                        f"got {value!r}")
        if "graph" not in raw:
            raise GraphRuntimeError(f"{where}: needs graph = \"graph.json or example folder\"")
        case = _make_case(path.parent, settings, where)
        if case.name in names:
            raise GraphRuntimeError(f"{where}: name {case.name!r} is used by an earlier case")
        names.add(case.name)
        result.append(case)
    return result


def _check_keys(table: Any, allowed: Sequence[str], where: str) -> None:
    unknown = [k for k in table if k not in allowed]
    if unknown:
        raise GraphRuntimeError(f"{where}: unknown key {unknown[0]!r}; allowed keys: "
                                + ", ".join(allowed))


def _make_case(base: Path, s: dict[str, Any], where: str) -> Case:
    devices = s["devices"]
    if not devices or not all(isinstance(d, list) and d and all(isinstance(x, str) for x in d)
                              for d in devices):
        raise GraphRuntimeError(f"{where}: devices must be a list of device lists, e.g. "
                                f"[[\"cpu\"], [\"cpu\", \"opencl\"]], got {devices!r}")
    for spec in (x for d in devices for x in d):
        # A misspelt device is an error; only a device this machine lacks skips (run_case).
        if spec.strip().lower() != "auto":
            try:
                parse_device(spec)
            except DeviceError as e:
                raise GraphRuntimeError(f"{where}: devices: {spec!r}: {e}") from e
    for key in ("rtol", "atol"):
        problem = tolerance_problem(s[key])
        if problem:
            raise GraphRuntimeError(f"{where}: {key}: {problem}")

    def rel(key: str) -> Path | None:
        return base / s[key] if s.get(key) is not None else None

    try:
        files = resolve_files(base / s["graph"], rel("lib"), rel("params"), rel("inputs"),
                              rel("expected"))
    except GraphRuntimeError as e:
        raise GraphRuntimeError(f"{where}: graph: {e}") from e
    if files.expected is None:
        raise GraphRuntimeError(f"{where}: needs expected = \"expected.npz\" (or a graph folder "
                                "holding one)")
    name = s.get("name") or (files.folder or files.graph).stem
    return Case(name, files.graph, files.lib, files.params, files.inputs, files.expected,
                tuple(tuple(d) for d in devices), float(s["rtol"]), float(s["atol"]),
                s["strict"], s["seed"])


def selected(cases: Sequence[Case], pattern: str | None) -> list[tuple[Case, tuple[str, ...]]]:
    """(case, device set) pairs whose test id matches pattern (a glob, or else a substring)."""
    pairs = [(c, d) for c in cases for d in c.devices]
    if not pattern:
        return pairs
    if any(ch in pattern for ch in "*?["):
        return [(c, d) for c, d in pairs if fnmatch.fnmatchcase(case_id(c, d), pattern)]
    return [(c, d) for c, d in pairs if pattern in case_id(c, d)]


def run_case(case: Case, devices: tuple[str, ...]) -> CaseResult:
    """Run one case on one device set; a device missing here makes it skipped, not failed."""
    try:
        ctxs = parse_devices(devices, flag="device")
    except DeviceError as e:
        return CaseResult(case, devices, "skipped", str(e))
    start = time.perf_counter()
    try:
        files = resolve_files(case.graph, case.lib, case.params, case.inputs, case.expected)
        job = job_from_files(files, ctxs, seed=case.seed, strict=case.strict)
        outputs = job.run()
        names = output_names(job.graph)
        expected = expected_outputs(case.expected, names, job.graph.node_output_names)
        comparisons = compare(outputs, expected, names, case.rtol, case.atol)
    except GraphRuntimeError as e:
        return CaseResult(case, devices, "error", str(e), time.perf_counter() - start)
    bad = [c for c in comparisons if not c.ok]
    message = "; ".join(f"output {c.index} {c.name!r}: {_mismatch(c, case.rtol, case.atol)}"
                        for c in bad)
    return CaseResult(case, devices, "failed" if bad else "passed", message,
                      time.perf_counter() - start, comparisons)


def run_suite(cases: Sequence[Case], pattern: str | None = None,
              progress: Callable[[CaseResult], None] | None = None) -> list[CaseResult]:
    """Every selected (case, device set), in suite order."""
    results = []
    for case, devices in selected(cases, pattern):
        result = run_case(case, devices)
        results.append(result)
        if progress is not None:
            progress(result)
    return results


@dataclass(frozen=True)
class JUnitCase:
    """One <testcase>: status passed, failed, error or skipped."""

    name: str
    classname: str
    seconds: float
    status: str
    message: str = ""


def write_junit(path: str | os.PathLike[str], suite: str, cases: Sequence[JUnitCase]) -> None:
    """JUnit XML (the schema CI servers read): one <testsuite> with a <testcase> per case."""
    counts = {s: sum(c.status == s for c in cases) for s in ("failed", "error", "skipped")}
    root = ET.Element("testsuites")
    node = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)),
                         failures=str(counts["failed"]), errors=str(counts["error"]),
                         skipped=str(counts["skipped"]),
                         time=f"{sum(c.seconds for c in cases):.6f}")
    for c in cases:
        case = ET.SubElement(node, "testcase", name=c.name, classname=c.classname,
                             time=f"{c.seconds:.6f}")
        tag = {"failed": "failure", "error": "error", "skipped": "skipped"}.get(c.status)
        if tag is not None:
            child = ET.SubElement(case, tag, message=c.message)
            if tag != "skipped":
                child.text = c.message
    ET.indent(root)
    try:
        ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    except OSError as e:
        raise GraphRuntimeError(f"--junit {os.fspath(path)}: cannot write: "
                                f"{e.strerror or e}") from e


def junit_cases(results: Sequence[CaseResult], classname: str) -> list[JUnitCase]:
    return [JUnitCase(r.case_id, classname, r.seconds, r.status, r.message) for r in results]


def comparison_cases(comparisons: Sequence[Comparison], classname: str, seconds: float,
                     rtol: float, atol: float) -> list[JUnitCase]:
    """A JUnit case per compared output (`graphrun compare --junit`)."""
    return [JUnitCase(f"output {c.index} {c.name}", classname, seconds,
                      "passed" if c.ok else "failed", _mismatch(c, rtol, atol))
            for c in comparisons]


def _mismatch(c: Comparison, rtol: float, atol: float) -> str:
    """Why an output differs: shape or dtype, else its errors and the tolerances."""
    return c.problem or (f"max abs err {c.max_abs:.3g}, max rel err {c.max_rel:.3g} "
                         f"(rtol {rtol}, atol {atol})")
