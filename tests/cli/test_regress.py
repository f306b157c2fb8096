"""Regression suites: the TOML format and its errors, statuses, -k selection and JUnit XML."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from support import make_graph, null, tvm_op

from graph_runtime.cli.app import app
from graph_runtime.cli.regress import load_suite, selected
from graph_runtime.errors import GraphRuntimeError

ROOT = Path(__file__).resolve().parents[2]


def invoke(*args: object) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def suite_dir(tmp_path: Path) -> Path:
    """Folder 'neg' (y = -x) with inputs and expected, and a wrong expected file beside it."""
    folder = tmp_path / "graphs" / "neg"
    folder.mkdir(parents=True)
    graph = make_graph([null("x"), tvm_op("y", "negative", [0])], heads=[1])
    (folder / "graph.json").write_text(graph.to_json())
    x = np.arange(4, dtype="float32")
    np.savez(folder / "inputs.npz", x=x)
    np.savez(folder / "expected.npz", output_0=-x)
    np.savez(tmp_path / "wrong.npz", output_0=x)
    (tmp_path / "broken_lib.json").write_text('{"format": "graph_runtime.lib"}')
    return tmp_path


def write_suite(folder: Path, text: str) -> Path:
    path = folder / "suite.toml"
    path.write_text(text)
    return path


SUITE = """
[defaults]
devices = [["cpu"], ["cpu:5"]]

[[case]]
name = "good"
graph = "graphs/neg"

[[case]]
name = "wrong"
graph = "graphs/neg"
expected = "wrong.npz"
devices = [["cpu"]]

[[case]]
name = "broken"
graph = "graphs/neg"
lib = "broken_lib.json"
devices = [["cpu"]]
"""


def test_suite_statuses_and_junit(suite_dir: Path) -> None:
    report = suite_dir / "report.xml"
    result = invoke("regress", write_suite(suite_dir, SUITE), "--junit", report)
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "good[cpu]" in out and "good[cpu:5]" in out
    assert "FAILED wrong[cpu]: output 0 'y': max abs err 6" in out
    assert "ERROR broken[cpu]: " in out and "broken_lib.json" in out
    assert "1 passed, 1 failed, 1 errors, 1 skipped" in out
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"),
            suite.get("skipped")) == ("4", "1", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == ["good[cpu]", "good[cpu:5]", "wrong[cpu]", "broken[cpu]"]
    assert cases["good[cpu]"].find("*") is None
    skipped = cases["good[cpu:5]"].find("skipped")
    assert skipped is not None and "cpu:5 does not exist" in skipped.get("message", "")
    assert cases["wrong[cpu]"].find("failure") is not None
    assert cases["broken[cpu]"].find("error") is not None


def test_suite_passes_with_exit_0_and_json(suite_dir: Path) -> None:
    result = invoke("regress", write_suite(suite_dir, SUITE), "-k", "good", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(c["id"], c["status"]) for c in doc["cases"]] == [("good[cpu]", "passed"),
                                                              ("good[cpu:5]", "skipped")]
    assert doc["passed"] == 1 and doc["skipped"] == 1 and doc["cases"][0]["max_abs_err"] == 0


def test_k_selects_by_glob_or_substring(suite_dir: Path) -> None:
    cases = load_suite(write_suite(suite_dir, SUITE))
    ids = [f"{c.name}[{'+'.join(d)}]" for c, d in selected(cases, "*[[]cpu]")]
    assert ids == ["good[cpu]", "wrong[cpu]", "broken[cpu]"]
    assert [c.name for c, _ in selected(cases, "ron")] == ["wrong"]
    result = invoke("regress", suite_dir / "suite.toml", "-k", "nothing")
    assert result.exit_code == 2
    assert result.stderr.startswith("graphrun: error: -k nothing: matches no case")


@pytest.mark.parametrize("text,fragment", [
    ("[[case]]\ngraph = 'graphs/neg'\ncolour = 1\n", "case 1: unknown key 'colour'; allowed keys:"),
    ("[other]\n", "top level: unknown key 'other'"),
    ("[[case]]\nname = 'a'\n", "case 1 'a': needs graph ="),
    ("[[case]]\ngraph = 'graphs/neg'\nrtol = 'small'\n", "rtol must be int or float"),
    ("[[case]]\ngraph = 'graphs/neg'\nstrict = 1\n", "strict must be bool, got 1"),
    ("[[case]]\ngraph = 'graphs/neg'\ndevices = ['cpu']\n", "devices must be a list of device"),
    ("[[case]]\ngraph = 'graphs/missing'\n", "no such graph file or example folder"),
    ("[[case]]\ngraph = 'graphs/neg/graph.json'\n", "needs expected ="),
    ("[[case]]\ngraph = 'graphs/neg'\n[[case]]\ngraph = 'graphs/neg'\n",
     "case 2: name 'neg' is used by an earlier case"),
    ("[defaults]\nrtol = 1\n", "expected one or more [[case]] tables"),
    ("[[case]\n", "not valid TOML"),
])
def test_suite_errors_name_the_file_case_and_key(suite_dir: Path, text: str,
                                                 fragment: str) -> None:
    path = write_suite(suite_dir, text)
    with pytest.raises(GraphRuntimeError) as info:
        load_suite(path)
    assert str(path) in str(info.value) and fragment in str(info.value), str(info.value)
    result = invoke("regress", path)
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("graphrun: error:")
    assert len(result.stderr.strip().splitlines()) == 1


def test_shipped_suite_covers_every_example_on_every_device_set() -> None:
    cases = load_suite(ROOT / "examples" / "regress.toml")
    folders = sorted(p.name for p in (ROOT / "examples" / "graphs").iterdir()
                     if (p / "graph.json").is_file())
    by_folder = {c.graph.parent.name for c in cases}
    assert by_folder == set(folders)
    device_sets = {d for c in cases for d in c.devices}
    assert {("cpu",), ("opencl",), ("cpu", "opencl"), ("cuda",), ("cpu", "cuda")} <= device_sets
    for case in cases:
        if case.graph.name == "graph.json" and case.graph.parent.name in folders:
            assert len(case.devices) >= 5 or case.name.endswith("_cuda"), case.name
        assert case.expected.is_file()


# ---- issue 13: misspelt devices, nothing run, bad tolerances, non-UTF-8 suites -------------------

def test_a_misspelt_device_is_an_error(suite_dir: Path) -> None:
    path = write_suite(suite_dir, '[[case]]\ngraph = "graphs/neg"\ndevices = [["cpux"]]\n')
    with pytest.raises(GraphRuntimeError, match=r"case 1: devices: 'cpux': unknown device type"):
        load_suite(path)


def test_a_suite_where_nothing_ran_fails(suite_dir: Path) -> None:
    path = write_suite(suite_dir, '[[case]]\ngraph = "graphs/neg"\ndevices = [["cpu:7"]]\n')
    result = invoke("regress", path)
    assert result.exit_code == 1, result.output
    assert "nothing ran: every case" in result.stderr


@pytest.mark.parametrize("line", ["rtol = -1", "rtol = nan", "atol = -5", "atol = inf"])
def test_bad_tolerances_in_a_suite_are_errors(suite_dir: Path, line: str) -> None:
    path = write_suite(suite_dir, f'[defaults]\n{line}\n[[case]]\ngraph = "graphs/neg"\n')
    key = line.split()[0]
    with pytest.raises(GraphRuntimeError, match=rf"case 1: {key}: expected a finite number >= 0"):
        load_suite(path)


def test_a_non_utf8_suite_is_an_error(suite_dir: Path) -> None:
    path = suite_dir / "suite.toml"
    path.write_bytes(b'[[case]]\ngraph = "\xff"\n')
    with pytest.raises(GraphRuntimeError, match=r"suite.toml: not UTF-8 text \(byte 18"):
        load_suite(path)
