"""Batched dense against a kept transposed weight (lib/kernels/transposed_dense.py)."""
from __future__ import annotations

import numpy as np
import pytest
from support import dense_spec, make_graph, null, tvm_op

import graph_runtime as gr
from graph_runtime.errors import LibraryError
from graph_runtime.lib import Module
from graph_runtime.lib.chain import Chain, Step
from graph_runtime.lib.kernels.cpu.dense_choice import choose, offered
from graph_runtime.lib.kernels.cpu.transposed_dense import TransposedDense, transposes
from graph_runtime.settings import DENSE_TILES, DENSE_TRANSPOSE

TRANSPOSE_ENV = DENSE_TRANSPOSE.name

@pytest.fixture(autouse=True)
def _todays_kernels(monkeypatch):
    """These test the OpenBLAS kernels; oneDNN's matmul (the choice may take it) has
    test_onednn.py."""
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "off")


TOL = {"float32": {"rtol": 1e-5, "atol": 1e-4}, "float64": {"rtol": 1e-10, "atol": 1e-10}}


@pytest.mark.parametrize("m,n,k", [(32, 512, 784), (3, 130, 7), (2, 1, 5)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matches_the_reference(m, n, k, dtype, random_array) -> None:
    x = random_array((m, k), dtype, seed=1)
    w = random_array((n, k), dtype, seed=2)
    out = np.full((m, n), np.nan, dtype)
    kernel = TransposedDense(m, n, k, dtype)
    kernel(x, w, out)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.astype(np.float64).T, **TOL[dtype])
    assert kernel.workspace_bytes() == w.nbytes


def _dense_module(monkeypatch) -> gr.GraphModule:
    monkeypatch.setenv(TRANSPOSE_ENV, "on")
    lib = Module("denselib")
    lib.register("fused_dense", Chain("fused_dense", [Step("dense"), Step("add"), Step("relu")]))
    nodes = [null("data"), null("weight"), null("bias"), tvm_op("fc", "fused_dense", [0, 1, 2])]
    graph = make_graph(nodes, [3], shapes=[[8, 300], [256, 300], [256], [8, 256]])
    return gr.create(graph, lib, gr.cpu())


def test_every_weight_write_reaches_the_copy(monkeypatch, random_array) -> None:
    m = _dense_module(monkeypatch)
    assert m.memory_report().workspace[gr.cpu()] >= 256 * 300 * 4  # the copy
    x = random_array((8, 300), "float32", seed=3)
    weights = [random_array((256, 300), "float32", seed=s) for s in (4, 5, 6, 7)]
    bias = random_array((256,), "float32", seed=8)

    def check(w) -> None:
        m.run(data=x)
        want = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + bias, 0)
        np.testing.assert_allclose(m.get_output(0).numpy(), want, **TOL["float32"])

    m.load_params({"weight": weights[0], "bias": bias})
    check(weights[0])
    check(weights[0])  # the kept copy is reused
    m.set_input("weight", weights[1])
    check(weights[1])
    m.load_params(gr.save_param_dict({"weight": weights[2]}))
    check(weights[2])
    own = weights[3].copy()
    m.set_input_zero_copy("weight", own)
    check(weights[3])
    own[...] = weights[0]  # changed in place behind the module's back: still followed
    check(weights[0])


def test_mode_and_limits(monkeypatch) -> None:
    monkeypatch.setenv(TRANSPOSE_ENV, "off")
    assert "transposed" not in offered(dense_spec(32, 512, 784))
    monkeypatch.setenv(TRANSPOSE_ENV, "on")  # forced over the tiles
    assert choose(dense_spec(32, 512, 784)) == "transposed"
    assert not transposes(1, 512, 784, "float32")  # a GEMV: padded_gemv.py's business
    assert not transposes(32, 512, 784, "float16")
    monkeypatch.setenv(TRANSPOSE_ENV, "auto")
    assert "transposed" not in offered(dense_spec(32, 512, 784))  # the tiles stand for it
    monkeypatch.setenv(DENSE_TILES.name, "off")
    assert choose(dense_spec(32, 512, 784)) in ("blas", "transposed")  # measured, either way
    monkeypatch.setenv(TRANSPOSE_ENV, "sideways")
    with pytest.raises(LibraryError, match="GRAPH_RUNTIME_DENSE_TRANSPOSE must be auto, on or"):
        offered(dense_spec(32, 512, 784))
