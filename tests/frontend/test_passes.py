"""The importer's rewrite passes: one ordered list (frontend/passes.py), disabled by name, and
docs/frontend.md's table in the same order."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from onnx_builders import F32, helper, model

from graph_runtime import FrontendError
from graph_runtime.frontend import import_onnx
from graph_runtime.frontend.passes import NAMES, PASSES, describe

DOCS = Path(__file__).resolve().parents[2] / "docs" / "frontend.md"


def test_the_docs_table_lists_the_passes_in_order() -> None:
    rows = re.findall(r"^\| (\d+) \| `([a-z0-9-]+)` \| (onnx|prims) \|", DOCS.read_text(),
                      re.MULTILINE)
    assert [(name, level) for _, name, level in rows] == [(p.name, p.level) for p in PASSES]
    assert [int(i) for i, _, _ in rows] == list(range(1, len(PASSES) + 1))


def test_names_are_unique_and_onnx_passes_come_first() -> None:
    assert len(set(NAMES)) == len(NAMES)
    levels = [p.level for p in PASSES]
    assert levels == sorted(levels, key=["onnx", "prims"].index)
    assert describe().splitlines()[0].startswith(" 1. expand-functions")


def _gelu_model() -> object:
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = [helper.make_tensor(n, F32, [], [v]) for n, v in
             (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))]
    return model(nodes, [helper.make_tensor_value_info("x", F32, [2, 8])],
                 [helper.make_tensor_value_info("y", F32, [2, 8])], inits)


def test_a_disabled_pass_does_not_run() -> None:
    m = _gelu_model()
    assert import_onnx(m).patterns["gelu"] == 1
    assert "gelu" not in import_onnx(m, disable=["gelu"]).patterns
    assert import_onnx(m, disable=["attention"]).patterns["gelu"] == 1


def test_an_unknown_pass_is_refused_naming_the_passes() -> None:
    with pytest.raises(FrontendError, match=r"no import pass named 'gelus'; the passes are: "
                                            r"expand-functions, .*gelu"):
        import_onnx(_gelu_model(), disable=["gelus"])


def test_cli_lists_and_disables_passes(tmp_path: Path) -> None:
    from click.testing import CliRunner

    import onnx

    from graph_runtime.cli import app
    listed = CliRunner().invoke(app, ["import", "--list-passes"])
    assert listed.exit_code == 0, listed.output
    assert [line.split()[1] for line in listed.output.splitlines()] == list(NAMES)
    path = tmp_path / "model.onnx"
    onnx.save(_gelu_model(), str(path))
    fused = CliRunner().invoke(app, ["import", str(path), "-o", str(tmp_path / "fused")])
    assert "patterns fused (transformer, quantized): gelu x1" in fused.output, fused.output
    done = CliRunner().invoke(app, ["import", str(path), "-o", str(tmp_path / "out"),
                                    "--disable-pass", "gelu"])
    assert done.exit_code == 0, done.output
    assert "patterns fused" not in done.output
    bad = CliRunner().invoke(app, ["import", str(path), "-o", str(tmp_path / "bad"),
                                   "--disable-pass", "nope"])
    assert bad.exit_code == 2 and "no import pass named 'nope'" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
