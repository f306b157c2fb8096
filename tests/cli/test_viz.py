"""Graph drawings: DOT marks devices, copies, inputs and params; SVG/PNG come from Graphviz."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import make_graph, null, tvm_op

import graph_runtime as gr
from graph_runtime.cli.app import app
from graph_runtime.cli.trace import KIND_COLORS
from graph_runtime.cli.viz import to_dot, write_drawing
from graph_runtime.errors import GraphRuntimeError

ROOT = Path(__file__).resolve().parents[2]
DUPLEX = ROOT / "examples" / "graphs" / "duplex"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz `dot` is not on PATH (apt-get install graphviz)")


def node_line(dot: str, nid: int) -> str:
    return next(line for line in dot.splitlines() if line.strip().startswith(f"n{nid} ["))


def test_dot_colours_by_device_and_marks_copies() -> None:
    graph = gr.load_graph(DUPLEX / "graph.json")
    dot = to_dot(graph, [gr.cpu(), gr.opencl()])
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    assert KIND_COLORS["opencl"] in node_line(dot, 2)          # elemwise_add0 on opencl
    assert KIND_COLORS["cpu"] in node_line(dot, 5)             # elemwise_sub on cpu
    copy = node_line(dot, 3)
    assert "shape=cds" in copy and "opencl:0 -> cpu:0" in copy
    assert "shape=ellipse" in node_line(dot, 0)               # data input
    assert "peripheries=2" in node_line(dot, 8)               # the graph's output
    assert 'n2 -> n3 [label="(4,) float32"]' in dot
    assert "legend0" in dot and "cluster_legend" in dot


def test_dot_marks_params_and_inserted_copies() -> None:
    graph = make_graph([null("x"), tvm_op("y", "relu", [0]), null("w"), tvm_op("z", "add", [1, 2])],
                       heads=[3], shapes=[[2, 3]] * 4, device_index=[1, 4, 4, 4])
    dot = to_dot(graph, [gr.cpu(), gr.opencl()], params=["w"])
    assert 'style="filled,dashed"' in node_line(dot, 2) and "shape=note" in node_line(dot, 2)
    edge = next(line for line in dot.splitlines() if line.strip().startswith("n0 -> n1"))
    assert "inserted copy -> opencl:0" in edge and 'color="red"' in edge and "(2, 3)" in edge


def test_dot_quotes_names() -> None:
    graph = make_graph([null('a "quoted"\\name'), tvm_op("y", "relu", [0])], heads=[1])
    dot = to_dot(graph, [gr.cpu()])
    assert r'label="a \"quoted\"\\name\ncpu:0"' in node_line(dot, 0)


def test_write_dot_and_unknown_format(tmp_path: Path) -> None:
    write_drawing("digraph {}\n", tmp_path / "g.dot")
    assert (tmp_path / "g.dot").read_text() == "digraph {}\n"
    with pytest.raises(GraphRuntimeError, match=r"unknown drawing format '\.gif'"):
        write_drawing("digraph {}\n", tmp_path / "g.gif")


@needs_dot
@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")])
def test_viz_command_renders_with_graphviz(tmp_path: Path, suffix: str, magic: bytes) -> None:
    out = tmp_path / f"duplex{suffix}"
    result = CliRunner().invoke(app, ["viz", str(DUPLEX), "-d", "cpu", "-d", "opencl",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(magic)
    assert re.search(r"wrote .*duplex.* 9 nodes on cpu:0, opencl:0", result.stdout)


def test_viz_without_graphviz_says_to_install_it(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no `dot` on PATH
    result = CliRunner().invoke(app, ["viz", str(DUPLEX), "-o", str(tmp_path / "g.png")])
    assert result.exit_code == 2
    assert "needs Graphviz's `dot` on PATH; install graphviz" in result.stderr
    result = CliRunner().invoke(app, ["viz", str(DUPLEX), "-o", str(tmp_path / "g.dot")])
    assert result.exit_code == 0 and (tmp_path / "g.dot").read_text().startswith("digraph")
