"""Batched dense in tiles on the CPU workers with the chain's tail per tile (dense_tiles.py)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import erf
from support import dense_spec

from graph_runtime.device import cpu
from graph_runtime.lib.chain import Chain, Step, kernel_note
from graph_runtime.lib.kernels.cpu.dense_choice import choose, offered
from graph_runtime.lib.kernels.cpu.dense_tiles import DenseTiles, tiles
from graph_runtime.lib.library import TensorSpec
from graph_runtime.settings import CHAIN_JIT, DENSE_TILES, NUM_THREADS, ONEDNN


@pytest.fixture(autouse=True)
def without_onednn(monkeypatch) -> None:
    """These tests are about the NumPy/OpenBLAS tiles: oneDNN's matmul, a candidate beside
    them, must not be the one measured faster and taken."""
    monkeypatch.setenv(ONEDNN.name, "off")

TOL = {"float32": {"rtol": 2e-5, "atol": 2e-5}, "float64": {"rtol": 1e-12, "atol": 1e-12}}


def _gelu(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1 + erf(v / np.sqrt(2)))


# (chain, extra inputs after x and w: "bias" (n,) or "residual" (m, n), float64 reference)
CHAINS = [
    ("dense", [], lambda y, e: y),
    ("bias", ["bias"], lambda y, e: y + e[0]),
    ("bias_gelu", ["bias"], lambda y, e: _gelu(y + e[0])),
    ("bias_residual", ["bias", "residual"], lambda y, e: y + e[0] + e[1]),
]
STEPS = {"dense": [Step("dense")], "bias": [Step("dense"), Step("add")],
         "bias_gelu": [Step("dense"), Step("add"), Step("gelu")],
         "bias_residual": [Step("dense"), Step("add"), Step("add")]}


@pytest.mark.parametrize("kind", ["whole", "cols", "rows"])
@pytest.mark.parametrize("name,extras,reference", CHAINS, ids=[c[0] for c in CHAINS])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_chain_against_float64(monkeypatch, random_array, kind, name, extras, reference,
                               dtype) -> None:
    monkeypatch.setenv(DENSE_TILES.name, kind)
    monkeypatch.setenv(NUM_THREADS.name, "2")
    m, n, k = 37, 200, 19  # odd sizes: the last column block and row block are partial
    arrays = [random_array((m, k), dtype, seed=1), random_array((n, k), dtype, seed=2)]
    arrays += [random_array((n,) if e == "bias" else (m, n), dtype, seed=3 + i)
               for i, e in enumerate(extras)]
    specs = [TensorSpec(a.shape, dtype) for a in arrays]
    chain = Chain(name, STEPS[name])
    out_spec = chain.infer(specs)[0]
    run = chain.prepare(cpu(0), specs, [out_spec], {})
    assert "dense in" in kernel_note(run)
    assert name == "dense" or "compiled tail" in kernel_note(run)
    if kind != "whole":
        assert f"in {len(tiles(kind, m, n))} tiles" in kernel_note(run)
    out = np.full(out_spec.shape, np.nan, dtype)
    run(*arrays, out)
    wide = [a.astype(np.float64) for a in arrays]
    want = reference(wide[0] @ wide[1].T, wide[2:])
    np.testing.assert_allclose(out, want, **TOL[dtype])


def test_tail_keeps_nan_and_inf(monkeypatch, random_array) -> None:
    """NaN and infinities come out where NumPy's one-pass-per-op path gives them."""
    monkeypatch.setenv(NUM_THREADS.name, "2")
    m, n, k = 8, 160, 5
    x, w = random_array((m, k), "float32", seed=1), random_array((n, k), "float32", seed=2)
    bias = random_array((n,), "float32", seed=3)
    bias[[0, 70, 159]] = [np.nan, np.inf, -np.inf]
    specs = [TensorSpec(a.shape, "float32") for a in (x, w, bias)]
    chain = Chain("bias_gelu", STEPS["bias_gelu"])
    outs = {}
    for tiling_, jit in (("cols", "on"), ("off", "off")):
        monkeypatch.setenv(DENSE_TILES.name, tiling_)
        monkeypatch.setenv(CHAIN_JIT.name, jit)
        run = chain.prepare(cpu(0), specs, chain.infer(specs), {})
        outs[tiling_] = np.empty((m, n), np.float32)
        run(x, w, bias, outs[tiling_])
    assert np.isnan(outs["cols"][:, 0]).all() and (outs["cols"][:, 70] == np.inf).all()
    np.testing.assert_allclose(outs["cols"], outs["off"], rtol=1e-5, atol=1e-5)  # NaN alike


@pytest.mark.parametrize("kind", ["whole", "cols", "rows"])
@pytest.mark.parametrize("m,n", [(37, 200), (2, 64), (128, 2304)])
def test_tiles_cover_the_output_once(monkeypatch, kind, m, n) -> None:
    monkeypatch.setenv(NUM_THREADS.name, "2")
    seen = np.zeros((m, n), int)
    for r0, r1, c0, c1 in tiles(kind, m, n):
        seen[r0:r1, c0:c1] += 1
    assert (seen == 1).all()


def test_settings(monkeypatch) -> None:
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(DENSE_TILES.name, "off")  # OpenBLAS's threads, or the transposed copy
    assert offered(dense_spec(128, 768, 768)) == ["blas", "transposed"]
    monkeypatch.setenv(DENSE_TILES.name, "rows")
    assert offered(dense_spec(128, 768, 768)) == ["rows"]
    assert choose(dense_spec(128, 768, 768)) == "rows"
    assert offered(dense_spec(1, 768, 768)) == ["blas"]  # a GEMV (already threaded: no padding)
    assert offered(dense_spec(128, 768, 768, "float16")) == ["blas"]
    monkeypatch.setenv(DENSE_TILES.name, "auto")
    assert offered(dense_spec(128, 768, 768)) == ["whole", "cols", "rows"]  # the tiles race
    assert choose(dense_spec(4, 8, 8)) == "whole"  # too small to race
    assert DenseTiles(4, 8, 8, tiles("whole", 4, 8)).uses_workers()
