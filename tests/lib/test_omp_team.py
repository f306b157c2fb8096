"""Row kernels on oneDNN's OpenMP team (lib/kernels/cpu/omp_team.py): layer_norm, rms_norm,
group_norm, softmax, rotary and attention's scale, mask and softmax pass give bit for bit what
the same loops give split over the runtime's workers (or on one thread), at sizes that take the
team, with column offsets, partial rotary, each cos/sin table form and each mask broadcast."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.lib.kernels.cpu import attention, omp_team, rotary, rows_jit
from graph_runtime.lib.kernels.threads import num_threads
from graph_runtime.settings import ATTENTION_SPLIT, ONEDNN_THREADS
from support import require_onednn


@pytest.fixture(autouse=True)
def _team() -> None:
    """The team is oneDNN's OpenMP threads: oneDNN (required where CI requires it) and two
    CPUs."""
    require_onednn()
    if num_threads() < 2:
        pytest.skip("one CPU: oneDNN has no OpenMP team to share")


def _both(monkeypatch: pytest.MonkeyPatch, make, *arrays: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """make()'s kernel run on arrays (the last: like the output) on the team, then on the
    workers: (team's out, workers' out)."""
    outs, launched = [], []

    def counted(kernel, block):
        launched.append(kernel)
        omp_team.run_on_team(kernel, block)
    for module in (rows_jit, rotary, attention):
        monkeypatch.setattr(module, "run_on_team", counted)
    for mode in ("openmp", "workers"):
        monkeypatch.setenv(ONEDNN_THREADS.name, mode)
        out = np.full_like(arrays[-1], np.nan)
        make()(*arrays[:-1], out)
        outs.append(out)
        assert len(launched) == 1  # the team ran it in OpenMP mode, the workers then
    return outs[0], outs[1]


def test_norms_and_softmax_on_the_team_match_the_workers(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    rng = np.random.default_rng(5)
    shape = (3, 301, 517)  # above PARALLEL_ELEMENTS, rows not a multiple of the team
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    g, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    x[0, 5, :] = -np.inf  # a fully masked row: NaN in softmax on both
    x[2, 300, 7] = np.nan
    like = np.empty_like(x)
    team, workers = _both(monkeypatch, lambda: rows_jit.layer_norm_rows(shape, 1e-5, True, True),
                          x, g, b, like)
    np.testing.assert_array_equal(team, workers)
    team, workers = _both(monkeypatch, lambda: rows_jit.rms_norm_rows(shape, 1e-6), x, g, like)
    np.testing.assert_array_equal(team, workers)
    team, workers = _both(monkeypatch, lambda: rows_jit.softmax_rows(shape), x, like)
    np.testing.assert_array_equal(team, workers)
    assert np.isnan(team[0, 5]).all() and np.isfinite(team[1]).all()


def test_rows_under_the_workers_size_take_the_team(monkeypatch: pytest.MonkeyPatch) -> None:
    # MobileViT's layer norm: 1,024 rows of 64, under PARALLEL_ELEMENTS but over TEAM_ELEMENTS
    rng = np.random.default_rng(8)
    shape = (4, 256, 64)
    assert rows_jit.TEAM_ELEMENTS <= np.prod(shape) < rows_jit.PARALLEL_ELEMENTS
    x = rng.standard_normal(shape).astype(np.float32)
    g, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    team, one = _both(monkeypatch, lambda: rows_jit.layer_norm_rows(shape, 1e-5, True, True),
                      x, g, b, np.empty_like(x))
    np.testing.assert_array_equal(team, one)


@pytest.mark.parametrize("groups", [128, 32, 1])
def test_group_norm_on_the_team_matches_the_workers(groups: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # instance norm (a group per channel, wav2vec2's front end), groups of channels, and one
    # group: rows of (n, group) not a multiple of the team, per-channel scale and bias
    rng = np.random.default_rng(7)
    n, channels, spatial = 3, 128, 419
    x = (rng.standard_normal((n, channels, spatial)) * 2 + 1).astype(np.float32)
    scale, bias = (rng.standard_normal(channels).astype(np.float32) for _ in range(2))
    x[1, 5, 7] = np.nan  # its group's row is NaN on both
    like = np.empty_like(x)
    assert n * channels * spatial >= rows_jit.PARALLEL_ELEMENTS
    team, workers = _both(monkeypatch,
                          lambda: rows_jit.group_norm_rows(n, channels, groups, spatial, 1e-5),
                          x, scale, bias, like)
    np.testing.assert_array_equal(team, workers)
    per = channels // groups
    assert np.isnan(team[1, 5 // per * per:(5 // per + 1) * per]).all()
    assert np.isfinite(team[0]).all()


@pytest.mark.parametrize("table", ["per batch", "one for all", "no batch axis"])
def test_rotary_on_the_team_matches_one_thread(table: str, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    rng = np.random.default_rng(6)
    batch, tokens, heads, dim, rot, offset = 3, 157, 6, 64, 48, 5  # partial rotary, offset
    x = rng.standard_normal((batch, tokens, offset + heads * dim + 7)).astype(np.float32)
    lead = {"per batch": (batch,), "one for all": (1,), "no batch axis": ()}[table]
    cos, sin = (rng.standard_normal((*lead, tokens, rot)).astype(np.float32) for _ in range(2))
    like = np.empty((batch, tokens, heads * dim), np.float32)
    team, one = _both(monkeypatch, lambda: rotary.RotaryKernel(heads, dim, rot, offset),
                      x, cos, sin, like)
    np.testing.assert_array_equal(team, one)
    assert team.size >= rows_jit.PARALLEL_ELEMENTS  # the team took it


@pytest.mark.parametrize("mask", [None, "causal", "padding", "per head", "full", "scale only"])
def test_attention_softmax_on_the_team_matches_one_thread(
        mask: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One call over every head (grouped-query, OpenBLAS products): the scale, mask and softmax
    pass on the team against the compiled pass on this thread, NaN rows zeroed or kept."""
    rng = np.random.default_rng(7)
    batch, heads, kv, q_len, k_len, dim = 2, 4, 2, 131, 137, 16
    assert batch * heads * q_len * k_len >= rows_jit.PARALLEL_ELEMENTS
    q = rng.standard_normal((batch, q_len, heads * dim)).astype(np.float32)
    k, v = (rng.standard_normal((batch, k_len, kv * dim)).astype(np.float32) for _ in range(2))
    shape = {None: None, "scale only": None, "causal": (1, 1, q_len, k_len),
             "padding": (batch, 1, 1, k_len), "per head": (1, heads, q_len, k_len),
             "full": (batch, heads, q_len, k_len)}[mask]
    extra = []
    if shape is not None:
        m = np.where(rng.random(shape) < 0.3, -np.inf, rng.standard_normal(shape))
        m[..., 0, :] = -np.inf  # a row masked everywhere: NaN, or zero with nan_to_zero
        extra = [m.astype(np.float32)]
    scale = -0.5 if mask == "scale only" else 0.25  # a scale applied apart from the exp
    monkeypatch.setenv(ATTENTION_SPLIT.name, "off")  # one call: the pass the team takes
    like = np.empty((batch, q_len, heads * dim), np.float32)
    for nan_to_zero in (False, True):
        team, one = _both(monkeypatch, lambda: attention.AttentionKernel(
            batch, heads, q_len, k_len, dim, (0, 0, 0), scale, nan_to_zero, shape, "float32",
            kv_heads=kv), q, k, v, *extra, like)
        np.testing.assert_array_equal(team, one)
        assert np.isfinite(one).all() == (nan_to_zero or shape is None)


def test_a_compiled_chain_and_glu_on_the_team_match_the_workers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In OpenMP mode a chain's or glu's parallel work goes to the team (oneDNN's spinning
    threads), in the workers' mode to the workers; the same loop either way, bit for bit: a
    bias read per row (its metas), a scalar, GELU; glu's silu over rows not a multiple of the
    team."""
    from graph_runtime.device import cpu
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.lib.kernels.cpu import chain_jit, glu
    from graph_runtime.lib.library import TensorSpec
    from graph_runtime.lib.prepared import capabilities
    from graph_runtime.lib.registry import load_standard_ops
    load_standard_ops()
    rng = np.random.default_rng(8)
    specs = [TensorSpec((3, 301, 517), "float32"), TensorSpec((517,), "float32"),
             TensorSpec((), "float32")]
    arrays = [(rng.standard_normal(tuple(s.shape)) * 3).astype(np.float32) for s in specs]
    x = rng.standard_normal((301, 2 * 260)).astype(np.float32)
    launched = []

    def counted(kernel, block):
        launched.append(kernel)
        omp_team.run_on_team(kernel, block)
    monkeypatch.setattr(chain_jit, "run_on_team", counted)
    monkeypatch.setattr(glu, "run_on_team", counted)
    monkeypatch.setattr(chain_jit, "PARALLEL_WORK", 1)  # both loops parallel at these sizes
    chains, glus = [], []
    for mode in ("openmp", "workers"):
        monkeypatch.setenv(ONEDNN_THREADS.name, mode)
        chain = Chain("t", [Step("add"), Step("multiply"), Step("gelu")])
        outs = chain.infer(specs)
        fn = chain.prepare(cpu(0), specs, outs, {})
        compiled = [capabilities(f) for f, _ in getattr(fn, "_calls", [(fn, None)])]
        assert any(isinstance(c, chain_jit.CompiledChain) and c.workers == 2 and
                   (c.team is not None) == (mode == "openmp") for c in compiled), mode
        out = np.full(tuple(outs[0].shape), np.nan, np.float32)
        fn(*arrays, out)
        chains.append(out)
        kernel = glu.GluKernel("silu", glu.activation_expr("silu", {}, "float32"), "float32",
                               True)
        assert (kernel._team is not None) == (mode == "openmp")
        out = np.full((301, 260), np.nan, np.float32)
        kernel(x, out)
        glus.append(out)
        assert len(launched) == 2  # the team ran both in OpenMP mode, the workers then
    np.testing.assert_array_equal(chains[0], chains[1])
    np.testing.assert_array_equal(glus[0], glus[1])
    x64 = x.astype(np.float64)
    want = x64[:, :260] / (1 + np.exp(-x64[:, :260])) * x64[:, 260:]
    np.testing.assert_allclose(glus[0], want, rtol=1e-5, atol=1e-5)
