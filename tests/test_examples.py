"""Every examples/graphs/* folder runs through graph_runtime.create on each backend and matches."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from support import require_backend

import graph_runtime as gr
from graph_runtime.device import Device
from graph_runtime.params import load_params_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FOLDERS = sorted(p for p in (EXAMPLES / "graphs").iterdir() if (p / "graph.json").is_file())
DEVICE_CODES = {"cpu": 1, "cuda": 2, "opencl": 4}
# float32 kernels against the float64 reference (stored as float32): softmax outputs in [0, 1]
# after 784-term dot products, elementwise outputs that may nearly cancel.
TOLERANCE = {"float32": (1e-4, 1e-5)}  # (rtol, atol) per output dtype


def _device_codes(path: Path) -> set[int]:
    column = json.loads(path.read_text())["attrs"].get("device_index")
    return set(column[1]) if column else set()


def contexts(folder: Path, backend: str) -> tuple[Path, list[Device], bool]:
    """The graph file, ctxs and strictness for one backend.

    cpu runs every graph on the CPU alone (heterogeneous nodes fall back to ctxs[0], as in TVM).
    An accelerator runs next to the CPU, strictly, where a graph file places nodes on it
    (graph.json says OpenCL; graph_cuda.json is the CUDA variant); other graphs run on it alone.
    """
    if backend == "cpu":
        return folder / "graph.json", [gr.cpu()], False
    for name in ("graph.json", f"graph_{backend}.json"):
        path = folder / name
        if path.is_file() and DEVICE_CODES[backend] in _device_codes(path):
            return path, [gr.cpu(), gr.device(backend)], True
    return folder / "graph.json", [gr.device(backend)], False


def run_example(folder: Path, graph: Path, ctxs: list[Device], strict: bool):
    """Create the module from the folder's files, load params and inputs, run once."""
    module = gr.create(graph, folder / "lib.json", ctxs, strict=strict)
    if (folder / "params").is_file():
        module.load_params(folder / "params")
    with np.load(folder / "inputs.npz") as inputs:
        module.run(**{name: inputs[name] for name in inputs.files})
    return module


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_example_matches_expected(folder: Path, backend_name: str) -> None:
    graph, ctxs, strict = contexts(folder, backend_name)
    module = run_example(folder, graph, ctxs, strict)
    with np.load(folder / "expected.npz") as expected:
        assert module.get_num_outputs() == len(expected.files)
        for i in range(module.get_num_outputs()):
            want = expected[f"output_{i}"]
            got = module.get_output(i).numpy()
            assert got.shape == want.shape and got.dtype == want.dtype
            rtol, atol = TOLERANCE[str(want.dtype)]
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                                       err_msg=f"{folder.name} output {i} on {backend_name}")


def _hetero_cases() -> list:
    """(folder, accelerator) for every graph file that places nodes on that accelerator."""
    cases = []
    for folder in FOLDERS:
        for backend in ("opencl", "cuda"):
            if contexts(folder, backend)[2]:
                cases.append(pytest.param(folder, backend, marks=getattr(pytest.mark, backend),
                                          id=f"{folder.name}-{backend}"))
    return cases


@pytest.mark.parametrize("folder,backend", _hetero_cases())
def test_hetero_example_places_nodes_as_the_graph_says(folder: Path, backend: str) -> None:
    require_backend(backend)
    graph, ctxs, strict = contexts(folder, backend)
    module = run_example(folder, graph, ctxs, strict)
    doc = json.loads(graph.read_text())
    codes = doc["attrs"]["device_index"][1]
    want = {node["name"]: ("cpu" if code == 1 else backend)
            for node, code in zip(doc["nodes"], codes)}
    got = {name: dev.kind for _, name, _, dev in module.placement()}
    assert got == want
    assert module.copies() == []  # every crossing has its own __copy node in the graph


@pytest.mark.parametrize("folder", FOLDERS, ids=[f.name for f in FOLDERS])
def test_example_files_cover_every_graph_input(folder: Path) -> None:
    for name in ("README.md", "lib.json", "inputs.npz", "expected.npz"):
        assert (folder / name).is_file(), f"{folder.name}: {name} is missing"
    doc = json.loads((folder / "graph.json").read_text())
    args = {doc["nodes"][nid]["name"] for nid in doc["arg_nodes"]}
    params = set(load_params_file(folder / "params")) if (folder / "params").is_file() else set()
    with np.load(folder / "inputs.npz") as inputs:
        given = set(inputs.files)
    assert not params & given, f"{folder.name}: both params and inputs.npz set {params & given}"
    assert params | given == args


def test_examples_are_what_the_generator_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("make_examples", EXAMPLES / "make_examples.py")
    assert spec is not None and spec.loader is not None
    make_examples = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_examples", make_examples)  # dataclasses look it up
    spec.loader.exec_module(make_examples)
    names = [make().name for make in make_examples.EXAMPLES]
    assert sorted(names) == [f.name for f in FOLDERS]
    assert make_examples.main(["--check"]) == 0


def test_examples_readme_lists_every_example_and_files_stay_small() -> None:
    table = (EXAMPLES / "README.md").read_text()
    for folder in FOLDERS:
        assert f"[{folder.name}]" in table, f"examples/README.md does not list {folder.name}"
    total = sum(p.stat().st_size for p in (EXAMPLES / "graphs").rglob("*") if p.is_file())
    assert total < 8 * 2**20, f"examples/graphs holds {total} bytes; keep it under 8 MiB"
