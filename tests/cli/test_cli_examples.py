"""Every examples/graphs/* folder through `graphrun run` and `graphrun compare` (CliRunner)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import require_backend

from graph_runtime.cli.app import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graphs"
FOLDERS = sorted(p for p in EXAMPLES.iterdir() if (p / "graph.json").is_file())
DEVICE_SETS = [
    pytest.param(["cpu"], id="cpu"),
    pytest.param(["cpu", "opencl"], id="cpu+opencl", marks=pytest.mark.opencl),
    pytest.param(["cpu", "cuda"], id="cpu+cuda", marks=pytest.mark.cuda),
]


def device_args(devices: list[str]) -> list[str]:
    for kind in devices:
        require_backend(kind)
    return [arg for kind in devices for arg in ("-d", kind)]


def accelerator_nodes(graph: Path, code: int) -> int:
    """Kernel nodes whose device_index is code (what the run should put on that device)."""
    doc = json.loads(graph.read_text())
    codes = doc["attrs"].get("device_index", [None, []])[1]
    eids = [doc["node_row_ptr"][nid] for nid, node in enumerate(doc["nodes"])
            if node["op"] != "null" and node["attrs"]["func_name"] != "__copy"]
    return sum(codes[e] == code for e in eids) if codes else 0


@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_run_example_matches_expected(folder: Path, devices: list[str]) -> None:
    args = device_args(devices)
    result = CliRunner().invoke(app, ["run", str(folder), *args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["expected"]["ok"] is True, doc["expected"]
    assert [d["device"] for d in doc["devices"]] == [f"{k}:0" for k in devices]
    assert all(not c["inserted"] for c in doc["copies"])  # examples carry their own __copy nodes
    if devices == ["cpu", "opencl"]:
        assert doc["kernels_per_device"].get("opencl:0", 0) == accelerator_nodes(
            folder / "graph.json", 4)


@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_compare_example(folder: Path, devices: list[str], tmp_path: Path) -> None:
    args = device_args(devices)
    result = CliRunner().invoke(app, ["compare", str(folder), *args, "--junit",
                                      str(tmp_path / "r.xml")])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1].startswith("OK: ")
    assert (tmp_path / "r.xml").read_text().count("<testcase") >= 1


@pytest.mark.cuda
def test_hetero_cnn_cuda_graph_puts_convolutions_on_cuda() -> None:
    require_backend("cuda")
    folder = EXAMPLES / "hetero_cnn"
    graph = folder / "graph_cuda.json"
    result = CliRunner().invoke(app, [
        "run", str(graph), "-d", "cpu", "-d", "cuda", "--strict", "--json",
        "--lib", str(folder / "lib.json"), "--params", str(folder / "params"),
        "--inputs", str(folder / "inputs.npz"), "--expected", str(folder / "expected.npz")])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["expected"]["ok"] is True
    assert doc["kernels_per_device"]["cuda:0"] == accelerator_nodes(graph, 2) > 0


@pytest.mark.opencl
@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_plan_then_run_reproduces_expected(folder: Path, tmp_path: Path) -> None:
    # Issue 5: `graphrun plan` then `graphrun run` on every example gives the CPU outputs, with
    # every kernel whose name mentions add (elemwise_add, *_dense_add*, *_conv2d_add*) on OpenCL
    # and the rest on the CPU.
    require_backend("opencl")
    planned = tmp_path / "planned.json"
    plan = CliRunner().invoke(app, [
        "plan", str(folder / "graph.json"), "--default", "cpu", "--lib", str(folder / "lib.json"),
        "--place", "*add*=opencl", "--strict", "-o", str(planned)])
    assert plan.exit_code == 0, plan.output
    args = ["--lib", str(folder / "lib.json"), "--inputs", str(folder / "inputs.npz"),
            "--expected", str(folder / "expected.npz")]
    if (folder / "params").is_file():
        args += ["--params", str(folder / "params")]
    run = CliRunner().invoke(app, ["run", str(planned), "-d", "cpu", "-d", "opencl", "--strict",
                                   "--json", *args])
    assert run.exit_code == 0, run.output
    doc = json.loads(run.stdout)
    assert doc["expected"]["ok"] is True, doc["expected"]
    assert doc["kernels_per_device"].get("opencl:0", 0) > 0
