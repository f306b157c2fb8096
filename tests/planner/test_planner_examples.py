"""The example graphs, planned across CPU and OpenCL, reproduce their expected (CPU) outputs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import require_backend

import graph_runtime as gr
from graph_runtime.graph.model import Graph
from graph_runtime.planner import plan_graph

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "graphs").glob("*/graph.json"))


def alternating(g: Graph) -> dict:
    """Ops pinned alternately to cpu and opencl, so nearly every edge crosses devices."""
    ops = [node.name for node in g.nodes if not node.is_arg]
    return {"node_devices": {name: ("cpu", "opencl")[k % 2] for k, name in enumerate(ops)}}


PLACEMENTS = {
    "alternating": alternating,
    "all-opencl": lambda g: {"default_device": "opencl", "output_devices": {"0": "cpu"}},
    "inputs-on-opencl": lambda g: {"input_devices": {n: "opencl" for n in g.input_names}},
}


@pytest.mark.opencl
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_planned_example_matches_expected(path: Path, placement: str) -> None:
    require_backend("opencl")
    folder = path.parent
    lib = gr.load_module(next(folder.glob("lib.*")))
    g = Graph.from_json(path)
    result = plan_graph(g, PLACEMENTS[placement](g), lib=lib)
    assert result.fallbacks == []
    module = gr.create(result.graph, lib, [gr.cpu(0), gr.opencl(0)], strict=True)
    if (folder / "params").exists():
        module.load_params(folder / "params")
    with np.load(folder / "inputs.npz") as inputs:
        module.run(**{name: inputs[name] for name in inputs.files})
    with np.load(folder / "expected.npz") as expected:
        for k, name in enumerate(expected.files):
            np.testing.assert_allclose(module.get_output(k).numpy(), expected[name],
                                       rtol=1e-4, atol=1e-5, err_msg=f"{folder.name} {name}")
    assert module.copies() == []


def test_examples_exist() -> None:
    assert EXAMPLES, "examples/graphs/*/graph.json: no example graphs found"


@pytest.mark.opencl
def test_mixed_example_as_designed_integral_images_on_opencl() -> None:
    # The plan auto_place finds for `mixed` on a quiet machine (its README): the integral images
    # on OpenCL, everything else on the CPU; two copies per block, outputs as expected.
    require_backend("opencl")
    folder = ROOT / "examples" / "graphs" / "mixed"
    lib = gr.load_module(folder / "lib.json")
    g = Graph.from_json(folder / "graph.json")
    pins = {node.name: "opencl" if "cumsum" in node.func_name else "cpu"
            for node in g.nodes if not node.is_arg}
    result = plan_graph(g, {"node_devices": pins}, lib=lib)
    copies = [node for node in result.graph.nodes if node.func_name == "__copy"]
    assert len(copies) == 4, [node.name for node in copies]
    module = gr.create(result.graph, lib, [gr.cpu(0), gr.opencl(0)], strict=True)
    module.load_params(folder / "params")
    with np.load(folder / "inputs.npz") as inputs:
        module.run(data=inputs["data"])
    with np.load(folder / "expected.npz") as expected:
        np.testing.assert_allclose(module.get_output(0).numpy(), expected["output_0"],
                                   rtol=1e-4, atol=1e-5)
