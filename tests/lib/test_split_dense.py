"""Batched dense split by output columns over CPU workers (lib/kernels/split_dense.py)."""
from __future__ import annotations

import numpy as np
import pytest
from support import dense_spec

from graph_runtime.errors import LibraryError
from graph_runtime.lib.kernels.cpu.dense_choice import offered
from graph_runtime.lib.kernels.cpu.split_dense import SplitDense, split_blocks
from graph_runtime.settings import DENSE_SPLIT, NUM_THREADS

SPLIT_ENV = DENSE_SPLIT.name


@pytest.fixture(autouse=True)
def _todays_kernels(monkeypatch):
    """These test the OpenBLAS kernels; oneDNN's matmul (the choice may take it) has
    test_onednn.py."""
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "off")


@pytest.mark.parametrize("m,n,k,blocks", [(32, 512, 784, 4), (3, 130, 7, 3), (2, 64, 5, 2)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_split_matches_the_reference(m, n, k, blocks, dtype, random_array) -> None:
    x = random_array((m, k), dtype, seed=1)
    w = random_array((n, k), dtype, seed=2)
    out = np.full((m, n), np.nan, dtype)
    SplitDense(m, n, k, blocks)(x, w, out)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    tol = {"float32": {"rtol": 1e-5, "atol": 1e-4}, "float64": {"rtol": 1e-10, "atol": 1e-10}}
    np.testing.assert_allclose(out, want, **tol[dtype])


def test_dense_chain_forced_split(monkeypatch, run_op, random_array) -> None:
    monkeypatch.setenv(SPLIT_ENV, "on")
    monkeypatch.setenv(NUM_THREADS.name, "2")
    x = random_array((32, 300), "float32", seed=3)
    w = random_array((256, 300), "float32", seed=4)
    b = random_array((256,), "float32", seed=5)
    (got,) = run_op("cpu", [{"op": "dense"}, {"op": "add"}, {"op": "relu"}], [x, w, b])
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + b, 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_mode_and_limits(monkeypatch) -> None:
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(SPLIT_ENV, "off")
    assert "split" not in offered(dense_spec(32, 512, 784))
    monkeypatch.setenv(SPLIT_ENV, "auto")
    assert "split" in offered(dense_spec(32, 512, 784))
    monkeypatch.setenv(SPLIT_ENV, "on")
    assert offered(dense_spec(32, 512, 784)) == ["split"]
    assert split_blocks(32, 512, 784, "float32") == 4
    assert split_blocks(1, 512, 784, "float32") == 0  # a GEMV: padded_gemv.py's business
    assert split_blocks(32, 512, 784, "float16") == 0
    monkeypatch.setenv(SPLIT_ENV, "sometimes")
    with pytest.raises(LibraryError, match="GRAPH_RUNTIME_DENSE_SPLIT must be auto, on or off"):
        offered(dense_spec(32, 512, 784))
