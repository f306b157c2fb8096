"""Fixtures shared by the CLI tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support import make_graph, null, tvm_op

from graph_runtime.params import save_params_file


@pytest.fixture
def addw(tmp_path: Path) -> Path:
    """A folder graph y = (x + w) - z with params w, inputs x and z, and expected outputs."""
    graph = make_graph([null("x"), null("w"), tvm_op("plus", "add", [0, 1]), null("z"),
                        tvm_op("minus", "subtract", [2, 3])], heads=[4])
    (tmp_path / "graph.json").write_text(graph.to_json())
    rng = np.random.default_rng(1)
    x, w, z = (rng.standard_normal(4).astype("float32") for _ in range(3))
    save_params_file(tmp_path / "params", {"w": w})
    np.savez(tmp_path / "inputs.npz", x=x, z=z)
    np.savez(tmp_path / "expected.npz", output_0=(x + w) - z)
    return tmp_path
