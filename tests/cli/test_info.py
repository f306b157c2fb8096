"""graph_runtime.cli.info called directly: placement, copies and pool bytes, and their text."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import make_graph, null, tvm_op

from graph_runtime.cli.info import (CopyInfo, PlacementReport, arg_rows, copy_rows, executor_report,
                                    func_counts, graph_info, info_text, placement_report,
                                    split_args)
from graph_runtime.cli.job import GraphFiles, job_from_files, resolve_files
from graph_runtime.device import cpu, opencl
from graph_runtime.graph.model import Graph

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "graphs"
HETERO = EXAMPLES / "hetero_cnn"
CPU_OPENCL = [cpu(0), opencl(0)]  # placement needs no device: nothing is allocated

# hetero_cnn's pool by hand from graph.json (float32): storage ids 0..6 on OpenCL hold
# data 1x3x64x64, p0 16x3x3x3, p1 16, conv1 1x16x64x64 (shared with conv2 1x32x32x32),
# pool1 1x16x32x32 (shared with pool2 1x32x16x16), p2 32x16x3x3, p3 32; ids 7..11 on the CPU
# hold the copy 1x32x16x16 (shared with dense 1x10), flatten 1x8192, p4 10x8192, p5 10 and
# softmax 1x10.
OPENCL_POOL = 4 * (3 * 64 * 64 + 16 * 27 + 16 + 16 * 64 * 64 + 16 * 32 * 32 + 32 * 16 * 9 + 32)
OPENCL_UNSHARED = OPENCL_POOL + 4 * (32 * 32 * 32 + 32 * 16 * 16)
CPU_POOL = 4 * (32 * 16 * 16 + 8192 + 10 * 8192 + 10 + 10)
CPU_UNSHARED = CPU_POOL + 4 * 10
COPY_BYTES = 4 * 32 * 16 * 16


def inserted_copy_graph() -> Graph:
    """plus on OpenCL, neg on the CPU reading plus with no __copy: create() inserts one."""
    return make_graph([null("x"), null("y"), tvm_op("plus", "add", [0, 1]),
                       tvm_op("neg", "negative", [2])], heads=[3], device_index=[4, 4, 4, 1])


# ---- placement_report ----------------------------------------------------------------------------

def test_placement_report_of_hetero_cnn_on_cpu_and_opencl() -> None:
    graph = Graph.from_json(HETERO / "graph.json")
    report = placement_report(graph, CPU_OPENCL)
    assert report.node_device == [opencl(0)] * 9 + [cpu(0)] * 6
    assert report.copies == [CopyInfo(9, "node 9 '__copy_pool_to_flatten'", 8, opencl(0), cpu(0),
                                      COPY_BYTES)]
    assert not report.copies[0].inserted
    assert report.pool == {opencl(0): OPENCL_POOL, cpu(0): CPU_POOL}
    assert report.unshared == {opencl(0): OPENCL_UNSHARED, cpu(0): CPU_UNSHARED}
    assert report.kernels_per_device(graph) == {cpu(0): 3, opencl(0): 4}


def test_placement_report_on_cpu_alone_puts_everything_on_the_cpu() -> None:
    graph = Graph.from_json(HETERO / "graph.json")
    report = placement_report(graph, [cpu(0)])
    assert set(report.node_device) == {cpu(0)}
    assert report.pool == {cpu(0): OPENCL_POOL + CPU_POOL}
    assert [(c.src, c.dst, c.nbytes) for c in report.copies] == [(cpu(0), cpu(0), COPY_BYTES)]
    assert report.kernels_per_device(graph) == {cpu(0): 7}


def test_placement_report_lists_a_copy_create_would_insert() -> None:
    graph = inserted_copy_graph()
    report = placement_report(graph, CPU_OPENCL)
    (copy,) = report.copies
    assert copy.inserted and copy.nid == -1
    assert copy.label == "inserted copy of node 2 'plus' entry 2:0 (eid 2)"
    assert (copy.eid, copy.src, copy.dst, copy.nbytes) == (2, opencl(0), cpu(0), 16)
    # the CPU holds neg's output and the inserted copy's destination, 16 bytes each
    assert report.pool == {opencl(0): 48, cpu(0): 32}


# ---- copy_rows -----------------------------------------------------------------------------------

def test_copy_rows_groups_by_source_destination_and_kind() -> None:
    c, o = cpu(0), opencl(0)
    report = PlacementReport([], [CopyInfo(3, "a", 1, o, c, 100), CopyInfo(5, "b", 2, o, c, 20),
                                  CopyInfo(-1, "ins", 4, o, c, 7), CopyInfo(6, "d", 3, c, o, 1)],
                             {}, {})
    assert copy_rows(report) == [
        {"src": "cpu:0", "dst": "opencl:0", "inserted": False, "count": 1, "bytes": 1},
        {"src": "opencl:0", "dst": "cpu:0", "inserted": False, "count": 2, "bytes": 120},
        {"src": "opencl:0", "dst": "cpu:0", "inserted": True, "count": 1, "bytes": 7},
    ]
    assert copy_rows(PlacementReport([], [], {}, {})) == []


# ---- split_args, arg_rows, func_counts -----------------------------------------------------------

def test_split_args_by_params_file_then_inputs_file_then_tvm_names() -> None:
    graph = make_graph([null("data"), null("p0"), null("w"), tvm_op("f", "add", [0, 1]),
                        tvm_op("g", "add", [3, 2])], heads=[4])
    assert split_args(graph, ["w"], None) == (["data", "p0"], ["w"])
    assert split_args(graph, ["w"], ["data"]) == (["data", "p0"], ["w"])  # params file wins
    assert split_args(graph, [], ["data"]) == (["data"], ["p0", "w"])
    assert split_args(graph, [], None) == (["data", "w"], ["p0"])


def test_arg_rows_give_shape_dtype_and_bytes() -> None:
    graph = make_graph([null("a"), null("b"), tvm_op("f", "add", [0, 1])], heads=[2],
                       shapes=[[2, 3], [3], [2, 3]], dtypes=["float16", "int64", "float16"])
    assert arg_rows(graph, ["b", "a"]) == [
        {"name": "b", "shape": [3], "dtype": "int64", "bytes": 24},
        {"name": "a", "shape": [2, 3], "dtype": "float16", "bytes": 12}]


def test_func_counts_most_common_first() -> None:
    graph = make_graph([null("x"), tvm_op("a", "negative", [0]), tvm_op("b", "relu", [1]),
                        tvm_op("c", "relu", [2])], heads=[3])
    assert list(func_counts(graph).items()) == [("relu", 2), ("negative", 1)]


# ---- graph_info, info_text -----------------------------------------------------------------------

def test_graph_info_of_hetero_cnn_lists_copies_and_pool_bytes_per_device() -> None:
    doc = graph_info(resolve_files(HETERO), CPU_OPENCL)
    assert doc["graph"] == str(HETERO / "graph.json")
    assert doc["devices"] == ["cpu:0", "opencl:0"]
    assert (doc["nodes"], doc["entries"]) == (15, 15)
    assert doc["inputs"] == [{"name": "data", "shape": [1, 3, 64, 64], "dtype": "float32",
                              "bytes": 4 * 3 * 64 * 64}]
    assert [p["name"] for p in doc["params"]] == ["p0", "p1", "p2", "p3", "p4", "p5"]
    assert doc["outputs"] == [{"index": 0, "name": "tvmgen_default_fused_nn_softmax",
                               "node": "tvmgen_default_fused_nn_softmax",
                               "shape": [1, 10], "dtype": "float32"}]
    assert doc["functions"]["__copy"] == 1 and sum(doc["functions"].values()) == 8
    assert doc["kernels_per_device"] == {"cpu:0": 3, "opencl:0": 4}
    assert doc["copies"] == [{"src": "opencl:0", "dst": "cpu:0", "inserted": False, "count": 1,
                              "bytes": COPY_BYTES}]
    assert doc["pool"] == [
        {"device": "cpu:0", "bytes": CPU_POOL, "unshared_bytes": CPU_UNSHARED},
        {"device": "opencl:0", "bytes": OPENCL_POOL, "unshared_bytes": OPENCL_UNSHARED}]
    placement = {p["name"]: (p["func_name"], p["device"]) for p in doc["placement"]}
    assert placement["data"] == ("input", "opencl:0")
    assert placement["p4"] == ("param", "cpu:0")
    assert placement["__copy_pool_to_flatten"] == ("__copy", "cpu:0")


def test_graph_info_without_params_splits_args_by_the_inputs_file(tmp_path: Path) -> None:
    graph = make_graph([null("x"), null("w"), tvm_op("plus", "add", [0, 1])], heads=[2])
    (tmp_path / "graph.json").write_text(graph.to_json())
    np.savez(tmp_path / "inputs.npz", x=np.zeros(4, "float32"))
    doc = graph_info(resolve_files(tmp_path), [cpu(0)])
    assert [r["name"] for r in doc["inputs"]] == ["x"]
    assert [r["name"] for r in doc["params"]] == ["w"]
    assert doc["copies"] == [] and doc["pool"] == [{"device": "cpu:0", "bytes": 48,
                                                     "unshared_bytes": 48}]


def test_info_text_shows_the_numbers_it_was_given() -> None:
    doc = {"graph": "g.json", "devices": ["cpu:0", "opencl:0"], "nodes": 13, "entries": 17,
           "inputs": [{"name": "img", "shape": [1, 7], "dtype": "float32", "bytes": 3000}],
           "params": [],
           "outputs": [{"index": 0, "name": "prob", "node": "fused_x", "shape": [9],
                        "dtype": "float16"}],
           "functions": {"fused_x": 4, "__copy": 2},
           "kernels_per_device": {"cpu:0": 3, "opencl:0": 5},
           "placement": [{"nid": 0, "name": "img", "func_name": "input", "device": "opencl:0"},
                         {"nid": 1, "name": "fused_x", "func_name": "fused_x",
                          "device": "cpu:0"}],
           "copies": [{"src": "opencl:0", "dst": "cpu:0", "inserted": True, "count": 2,
                       "bytes": 2048}],
           "pool": [{"device": "cpu:0", "bytes": 1536, "unshared_bytes": 4096}]}
    text = info_text(doc)
    assert "g.json: 13 nodes, 17 entries" in text
    assert "cpu:0, opencl:0 (first = primary, the fallback)" in text
    assert "inputs (1, 2.9 KiB)" in text and "(1, 7)" in text
    assert "params (0, 0 B)\n  none" in text
    assert "outputs (1)" in text and "(9,)" in text and "float16" in text
    assert next(line for line in text.splitlines() if "prob" in line).split()[:3] == [
        "0", "prob", "fused_x"]
    assert "kernels per device: cpu:0: 3, opencl:0: 5" in text
    assert "copies (2)" in text
    copy_line = next(line for line in text.splitlines() if "inserted" in line)
    assert copy_line.split() == ["opencl:0", "cpu:0", "inserted", "2", "2.0", "KiB"]
    pool_line = text.splitlines()[-1]
    assert pool_line.split() == ["cpu:0", "1.5", "KiB", "4.0", "KiB"]
    # a node whose func_name is its own name shows it once
    node_line = next(line for line in text.splitlines() if line.strip().startswith("1 "))
    assert node_line.split() == ["1", "fused_x", "cpu:0"]


def test_info_text_of_a_real_graph_without_copies_says_none() -> None:
    text = info_text(graph_info(resolve_files(EXAMPLES / "mlp"), [cpu(0)]))
    assert "copies (0)\n  none" in text
    assert "kernels per device: cpu:0: 4" in text


# ---- executor_report -----------------------------------------------------------------------------

def test_executor_report_on_cpu_matches_the_placement_report() -> None:
    files = resolve_files(EXAMPLES / "mlp")
    job = job_from_files(files, [cpu(0)])
    built = executor_report(job.module.executor)
    assert built == placement_report(job.graph, [cpu(0)])


@pytest.mark.opencl
def test_executor_report_of_built_hetero_cnn_matches_the_placement_report(
        opencl_available: None) -> None:
    job = job_from_files(resolve_files(HETERO), CPU_OPENCL)
    built = executor_report(job.module.executor)
    assert built == placement_report(job.graph, CPU_OPENCL)
    assert built.pool == {opencl(0): OPENCL_POOL, cpu(0): CPU_POOL}


@pytest.mark.opencl
def test_executor_report_lists_the_copy_it_inserted(opencl_available: None,
                                                    tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text(inserted_copy_graph().to_json())
    job = job_from_files(GraphFiles(tmp_path / "g.json"), CPU_OPENCL)
    report = executor_report(job.module.executor)
    assert [(c.inserted, c.src, c.dst, c.nbytes) for c in report.copies] == [
        (True, opencl(0), cpu(0), 16)]
    (out,) = job.run()
    x, y = job.inputs.values["x"], job.inputs.values["y"]
    np.testing.assert_allclose(out, -(x + y), rtol=1e-6)
