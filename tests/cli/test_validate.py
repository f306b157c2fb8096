"""graph_runtime.cli.validate called directly: every problem in graph, lib coverage and params."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import make_graph, null, tvm_op

from graph_runtime.cli.job import GraphFiles, resolve_files
from graph_runtime.cli.validate import CheckResult, check_files, lib_problems, params_problems
from graph_runtime.device import cpu, opencl
from graph_runtime.graph.model import Graph
from graph_runtime.params import save_params_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "graphs"
# check_files needs no device here: OpenCL is named, never opened.
CPU_OPENCL = [cpu(0), opencl(0)]


def write_lib(path: Path, functions: dict) -> Path:
    path.write_text(json.dumps({"format": "graph_runtime.lib", "version": 1,
                                "functions": functions}))
    return path


@pytest.fixture
def faulty(tmp_path: Path) -> Path:
    """A folder whose lib lacks one function, makes a wrong shape for another, and whose params
    have one wrong shape, one wrong dtype and one name the graph does not have."""
    graph = make_graph([null("x"), null("w"), tvm_op("plus", "plus", [0, 1]),
                        tvm_op("odd", "mystery", [2]), null("m"),
                        tvm_op("proj", "project", [3, 4])],
                       heads=[5], shapes=[[1, 4], [1, 4], [1, 4], [1, 4], [3, 4], [1, 4]])
    (tmp_path / "graph.json").write_text(graph.to_json())
    write_lib(tmp_path / "lib.json", {"plus": {"op": "add"}, "project": {"op": "dense"}})
    save_params_file(tmp_path / "params", {"w": np.zeros((1, 5), "float32"),
                                           "q": np.zeros(1, "float32"),
                                           "m": np.zeros((3, 4), "float64")})
    return tmp_path


@pytest.mark.parametrize("name", ["mlp", "cnn", "hetero_cnn", "simplex", "duplex"])
def test_every_example_checks_clean_on_cpu_and_on_cpu_plus_opencl(name: str) -> None:
    files = resolve_files(EXAMPLES / name)
    for devices in ([cpu(0)], CPU_OPENCL):
        result = check_files(files, devices)
        assert result.problems == [], result.problems
        assert result.checked[0] == "graph"
        assert result.checked[1] == f"lib {files.lib}"
        assert (f"params {files.params}" in result.checked) == (files.params is not None)
        assert result.text(name).endswith("OK: no problems found")


def test_check_files_reports_every_problem_at_once_each_naming_what(faulty: Path) -> None:
    files = resolve_files(faulty)
    result = check_files(files, [cpu(0)])
    assert result.checked == ["graph", f"lib {files.lib}", f"params {files.params}"]
    problems = result.problems
    assert len(problems) == 5, problems
    missing, shape, w, q, m = problems
    assert "no function 'mystery'" in missing and "node 3 'odd'" in missing
    assert "it has: " in missing and "plus" in missing and "project" in missing
    assert "node 5 'proj' on cpu:0" in shape
    assert "'project' makes (1, 3) float32 but the graph declares (1, 4) float32" in shape
    assert w == (f"{files.params}: param 'w' is (1, 5) float32 but the graph's input 'w' "
                 "(eid 1) is (1, 4) float32")
    assert q == f"{files.params}: param 'q' is not an input of the graph; inputs are: x, w, m"
    assert "param 'm' is (3, 4) float64" in m and "(eid 4) is (3, 4) float32" in m


def test_check_result_text_numbers_problems_and_counts_them(faulty: Path) -> None:
    text = check_files(resolve_files(faulty), [cpu(0)]).text("faulty")
    lines = text.splitlines()
    assert lines[0].startswith("faulty: checked graph, lib ")
    assert [line.split(".")[0].strip() for line in lines[1:6]] == ["1", "2", "3", "4", "5"]
    assert lines[-1] == "5 problems found"


def test_check_result_text_singular_and_nothing_checked() -> None:
    one = CheckResult(["graph"], ["bad"]).text("g")
    assert one == "g: checked graph\n  1. bad\n1 problem found"
    assert CheckResult().text("g") == "g: checked nothing\nOK: no problems found"


def test_unreadable_graph_is_one_problem_and_nothing_else_is_checked(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{")
    result = check_files(GraphFiles(tmp_path / "broken.json", params=tmp_path / "p"), [cpu(0)])
    assert result.checked == ["graph"]
    assert len(result.problems) == 1
    assert "broken.json: not valid JSON" in result.problems[0]


def test_unsound_graph_reports_its_problems_and_skips_lib_and_params(tmp_path: Path) -> None:
    doc = json.loads(make_graph([null("x"), tvm_op("neg", "negative", [0])], heads=[1]).to_json())
    doc["attrs"]["storage_id"] = ["list_str", ["0", "1"]]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    result = check_files(GraphFiles(tmp_path / "bad.json", lib=tmp_path / "nolib.json"), [cpu(0)])
    assert result.checked == ["graph"]
    expected = (f"{tmp_path / 'bad.json'} at $.attrs.storage_id: expected "
                '["list_int", [...]], got ["list_str", [...]]')
    assert result.problems == [expected]


def test_several_semantic_graph_problems_are_all_reported(tmp_path: Path) -> None:
    doc = json.loads(make_graph([null("x"), tvm_op("neg", "negative", [0])], heads=[1]).to_json())
    doc["node_row_ptr"] = [0, 1, 3]
    doc["heads"] = [[1, 0, 0], [5, 0, 0]]
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    problems = check_files(GraphFiles(tmp_path / "bad.json"), [cpu(0)]).problems
    assert len(problems) >= 2, problems
    assert any("node_row_ptr" in p for p in problems), problems
    assert any("heads" in p for p in problems), problems


def test_storage_shared_across_devices_is_a_placement_problem(tmp_path: Path) -> None:
    graph = make_graph([null("x"), null("y"), tvm_op("plus", "add", [0, 1]),
                        tvm_op("neg", "negative", [2])], heads=[3],
                       device_index=[4, 4, 4, 1], storage_ids=[0, 1, 2, 2])
    (tmp_path / "g.json").write_text(graph.to_json())
    result = check_files(GraphFiles(tmp_path / "g.json"), CPU_OPENCL)
    assert result.checked == ["graph"]
    (problem,) = result.problems
    assert "storage id 2 is used on opencl:0 by entry 2" in problem
    assert "on cpu:0 by entry 3" in problem


def test_function_missing_on_the_nodes_device_names_where_it_exists(tmp_path: Path) -> None:
    graph = make_graph([null("x"), null("y"), tvm_op("plus", "add", [0, 1])], heads=[2],
                       device_index=[4, 4, 4])
    (tmp_path / "g.json").write_text(graph.to_json())
    lib = write_lib(tmp_path / "lib.json", {"add": {"op": "add", "devices": ["cpu"]}})
    files = GraphFiles(tmp_path / "g.json", lib=lib)
    (problem,) = check_files(files, CPU_OPENCL).problems
    assert problem == (f"{tmp_path / 'g.json'}: no function 'add' for opencl (node 2 'plus'); "
                       "it exists for: cpu")
    assert check_files(files, [cpu(0)]).problems == []  # device_index falls back to cpu


def test_lib_that_does_not_load_is_one_problem(tmp_path: Path) -> None:
    graph = make_graph([null("x"), tvm_op("neg", "negative", [0])], heads=[1])
    (tmp_path / "g.json").write_text(graph.to_json())
    lib = write_lib(tmp_path / "lib.json", {"negative": {"op": "nosuchop"}})
    (problem,) = check_files(GraphFiles(tmp_path / "g.json", lib=lib), [cpu(0)]).problems
    assert "$.functions.negative: unknown op 'nosuchop'; known ops: " in problem


def test_without_lib_the_standard_ops_are_checked(tmp_path: Path) -> None:
    graph = make_graph([null("x"), tvm_op("neg", "negative", [0]), tvm_op("odd", "frobnicate",
                                                                           [1])], heads=[2])
    (tmp_path / "g.json").write_text(graph.to_json())
    result = check_files(GraphFiles(tmp_path / "g.json"), [cpu(0)])
    assert result.checked == ["graph", "standard ops (no --lib)"]
    (problem,) = result.problems
    assert "'frobnicate'" in problem and "node 2 'odd'" in problem


def test_unreadable_params_file_is_one_problem(tmp_path: Path) -> None:
    graph = make_graph([null("x"), tvm_op("neg", "negative", [0])], heads=[1])
    (tmp_path / "g.json").write_text(graph.to_json())
    (tmp_path / "p.txt").write_text("garbage")
    (problem,) = check_files(GraphFiles(tmp_path / "g.json", params=tmp_path / "p.txt"),
                             [cpu(0)]).problems
    assert problem.startswith(f"{tmp_path / 'p.txt'}: ")
    assert "expected TVM param dict" in problem


def test_params_problems_of_the_mlp_params_against_the_cnn_graph() -> None:
    graph = Graph.from_json(EXAMPLES / "cnn" / "graph.json")
    problems = params_problems(graph, EXAMPLES / "mlp" / "params")
    # p0..p5 are all inputs of cnn; all but p5 (10,) have other shapes there.
    assert [p.split("'")[1] for p in problems] == ["p0", "p1", "p2", "p3", "p4"], problems
    assert "param 'p0' is (512, 784) float32 but the graph's input 'p0' (eid 1) is " \
           "(16, 3, 3, 3) float32" in problems[0]


def test_lib_problems_flattened_node_is_checked_on_flat_shapes(tmp_path: Path) -> None:
    graph = make_graph([null("a"), null("b"), tvm_op("sum2", "plus", [0, 1], flatten_data=1)],
                       heads=[2], shapes=[[2, 3], [6], [3, 2]])
    lib = write_lib(tmp_path / "lib.json", {"plus": {"op": "add"}})
    files = GraphFiles(tmp_path / "g.json", lib=lib)
    assert lib_problems(graph, [cpu(0)] * 3, files) == []
    unflattened = make_graph([null("a"), null("b"), tvm_op("sum2", "plus", [0, 1])],
                             heads=[2], shapes=[[2, 3], [6], [3, 2]])
    (problem,) = lib_problems(unflattened, [cpu(0)] * 3, files)
    assert "node 2 'sum2' on cpu:0" in problem


# ---- issue 13 --------------------------------------------------------------------------------

MLP = Path(__file__).resolve().parents[2] / "examples" / "graphs" / "mlp"


def test_a_graph_file_is_checked_with_the_lib_beside_it() -> None:
    files = resolve_files(MLP / "graph.json", params=MLP / "params")
    result = check_files(files, [cpu()])
    assert result.problems == []
    assert "lib.json (found beside the graph)" in result.text("graph.json")


def test_a_missing_function_without_lib_hints_at_lib(tmp_path: Path) -> None:
    graph = make_graph([null("x"), tvm_op("y", "my_custom_fn", [0])], heads=[1])
    (tmp_path / "graph.json").write_text(graph.to_json())
    result = check_files(resolve_files(tmp_path / "graph.json"), [cpu()])
    assert len(result.problems) == 1 and "give the graph's lib with --lib" in result.problems[0]


@pytest.mark.parametrize("shape", [[2 ** 40, 2 ** 40], [0, 2 ** 62]])
def test_shapes_beyond_any_array_are_problems(tmp_path: Path, shape: list[int]) -> None:
    doc = make_graph([null("x"), tvm_op("y", "relu", [0])], heads=[1]).to_dict()
    doc["attrs"]["shape"][1] = [shape, shape]
    (tmp_path / "graph.json").write_text(json.dumps(doc))
    result = check_files(resolve_files(tmp_path / "graph.json"), [cpu()])
    assert result.problems and "more than 2^63 bytes" in result.problems[0]
