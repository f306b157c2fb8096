"""The attention op's kernels (CPU, OpenCL, and the NumPy-API one CUDA runs through CuPy) against
float64 NumPy: odd sizes, packed and separate q/k/v columns, broadcast masks, NaN rows, k and v
of fewer heads (grouped- and multi-query)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import require_onednn

from graph_runtime.backends import get_backend
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.ops.attention import HostAttention
from graph_runtime.lib.registry import get_op

# (batch, q_len, k_len, heads, head_dim, mask shape or None, packed q/k/v, nan_to_zero)
CASES = [
    (2, 7, 7, 3, 5, (2, 1, 1, 7), False, True),
    (1, 9, 9, 1, 8, (1, 1, 9, 9), True, False),
    (2, 5, 5, 4, 4, None, True, False),
    (2, 5, 6, 4, 4, None, False, False),
    (3, 11, 4, 2, 3, (3, 2, 11, 4), False, False),
    (1, 1, 13, 6, 16, (1, 1, 1, 13), False, True),
]
# (..., kv_heads): grouped-query attention at ratios 1, 2, 4 and 8 (multi-query: one kv head)
GQA_CASES = [
    (2, 7, 7, 3, 5, (2, 1, 1, 7), False, True, 3),
    (2, 5, 6, 4, 4, None, False, False, 2),
    (1, 9, 9, 4, 8, (1, 1, 9, 9), True, False, 1),
    (3, 1, 13, 8, 6, (3, 1, 1, 13), False, True, 1),
    (1, 11, 11, 8, 3, (1, 8, 11, 11), False, False, 2),
    # (..., kv_heads, k and v as (batch, kv_heads, tokens, head_dim): a KV cache's layout)
    (2, 1, 9, 8, 4, (2, 1, 1, 9), False, False, 2, True),
    (1, 6, 10, 3, 5, (1, 1, 6, 10), False, True, 3, True),
    (3, 4, 7, 4, 8, None, False, False, 1, True),
]
TOLERANCE = {"float32": 2e-5, "float64": 1e-12}


def _case(batch: int, q_len: int, k_len: int, heads: int, dim: int, mask: Any, packed: bool,
          nan_to_zero: bool, kv: int = 0, heads_layout: bool = False, *, dtype: str
          ) -> tuple[list[np.ndarray], dict[str, Any], np.ndarray]:
    """Inputs, attrs and the float64 reference (softmax as NumPy's: NaN rows, then zeroed); k
    and v of kv heads (kv_heads given where kv is), as (batch, kv, tokens, dim) arrays where
    heads_layout."""
    rng = np.random.default_rng(batch * 31 + q_len)
    width, kv_width = heads * dim, (kv or heads) * dim
    if packed:  # one array holds q, k and v side by side, as GPT-2's QKV projection writes
        assert q_len == k_len
        qkv = rng.standard_normal((batch, q_len, width + 2 * kv_width + 2))
        arrays = [qkv, qkv, qkv]
        offsets = (1, 1 + width, 1 + width + kv_width)
    else:
        arrays = [rng.standard_normal((batch, n, w + 3))
                  for n, w in ((q_len, width), (k_len, kv_width), (k_len, kv_width))]
        offsets = (2, 0, 3)
    attrs = {"num_heads": heads, "head_dim": dim, "scale": 0.37, "q_offset": offsets[0],
             "k_offset": offsets[1], "v_offset": offsets[2], "nan_to_zero": nan_to_zero}
    if kv:
        attrs["kv_heads"] = kv
    heads_of = [a[:, :, o:o + n * dim].reshape(batch, a.shape[1], n, dim).transpose(0, 2, 1, 3)
                .repeat(heads // n, axis=1)  # repeat_kv: query head h reads kv head h // group
                for a, o, n in zip(arrays, offsets, (heads, kv or heads, kv or heads))]
    if heads_layout:
        for i in (1, 2):
            arrays[i] = heads_of[i][:, ::heads // (kv or heads)].copy()
            attrs[f"{'kv'[i - 1]}_offset"] = 0
    s = heads_of[0] @ heads_of[1].transpose(0, 1, 3, 2) * 0.37
    if mask is not None:
        m = np.where(rng.random(mask) < 0.3, -np.inf, rng.standard_normal(mask))
        if nan_to_zero:
            m[0] = -np.inf  # the first batch masked everywhere: NaN rows, zeroed
        arrays.append(m)
        s = s + m
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    if nan_to_zero:
        p = np.where(np.isnan(p), 0.0, p)
    want = (p @ heads_of[2]).transpose(0, 2, 1, 3).reshape(batch, q_len, width)
    return [a.astype(dtype) for a in arrays], attrs, want


def _check(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES + GQA_CASES)
def test_kernel_matches_float64(case: tuple, dtype: str, backend_name: str) -> None:
    arrays, attrs, want = _case(*case, dtype=dtype)
    backend = get_backend(backend_name)
    specs = [TensorSpec(a.shape, dtype) for a in arrays]
    out_spec = TensorSpec(want.shape, dtype)
    op = get_op("attention")
    assert op.infer(specs, attrs) == [out_spec]
    run = op.kernels[backend_name](backend, 0, specs, [out_spec], attrs)
    args = []
    for a in arrays:
        arr = backend.empty(0, a.shape, np.dtype(dtype))
        backend.from_host(np.ascontiguousarray(a), arr)
        args.append(arr)
    out = backend.empty(0, want.shape, np.dtype(dtype))
    run(*args, out)
    backend.sync(0)
    _check(backend.to_host(out), want, dtype)


@pytest.mark.parametrize("case", CASES + GQA_CASES)
def test_numpy_api_kernel_matches_float64(case: tuple) -> None:
    # What CUDA runs through CuPy, run here with NumPy.
    arrays, attrs, want = _case(*case, dtype="float32")
    specs = [TensorSpec(a.shape, "float32") for a in arrays]
    out = np.empty(want.shape, np.float32)
    HostAttention(np, get_backend("cpu"), 0, specs, [TensorSpec(out.shape, "float32")],
                  attrs)(*arrays, out)
    _check(out, want, "float32")


def test_workspace_is_reported(backend_name: str) -> None:
    from graph_runtime.lib.prepared import capabilities
    arrays, attrs, want = _case(*CASES[0], dtype="float32")
    specs = [TensorSpec(a.shape, "float32") for a in arrays]
    run = get_op("attention").kernels[backend_name](get_backend(backend_name), 0, specs,
                                                     [TensorSpec(want.shape, "float32")], attrs)
    assert capabilities(run).workspace_bytes() >= 2 * 3 * 7 * 7 * 4  # the scores


# Large enough for the CPU kernel to hand blocks of heads to the workers (kernels/cpu/attention.py)
WORKER_CASES = [(2, 70, 70, 5, 40, (2, 1, 1, 70), True, True),
                (3, 80, 80, 1, 64, (3, 1, 80, 80), False, False),
                (2, 70, 70, 8, 40, (2, 1, 70, 70), False, False, 2),  # blocks across groups
                (1, 72, 72, 6, 40, None, True, True, 3)]
# Fewer heads than workers (SegFormer's first stage): each head's queries in row blocks
ROW_CASES = [(1, 1100, 240, 1, 8, (1, 1, 1, 240), False, True),
             (1, 1030, 260, 1, 8, None, False, False),
             (1, 1040, 256, 1, 8, (1, 1, 1040, 256), False, False),
             (1, 301, 301, 3, 8, (1, 3, 301, 301), True, True)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", WORKER_CASES + ROW_CASES)
def test_cpu_blocks_on_workers(monkeypatch, case: tuple, dtype: str) -> None:
    from graph_runtime.settings import ATTENTION_SPLIT, NUM_THREADS
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(ATTENTION_SPLIT.name, "on")
    arrays, attrs, want = _case(*case, dtype=dtype)
    specs = [TensorSpec(a.shape, dtype) for a in arrays]
    run = get_op("attention").kernels["cpu"](get_backend("cpu"), 0, specs,
                                             [TensorSpec(want.shape, dtype)], attrs)
    assert run.uses_workers() and len(run.blocks) > 2
    if case[0] * case[3] == 1:  # one head on two workers: its queries in 8 row blocks
        assert len(run.blocks) == 8 and all(q1 > q0 for *_, q0, q1 in run.blocks)
    out = np.full(want.shape, np.nan, dtype)
    run(*[np.ascontiguousarray(a) for a in arrays], out)
    _check(out, want, dtype)



def test_cpu_kernel_follows_new_arrays() -> None:
    """The CPU kernel keeps its head views while it gets the same arrays; other arrays, or the
    same ones changed in place, give their own result (here: the batch reversed)."""
    arrays, attrs, want = _case(*CASES[0], dtype="float32")
    specs = [TensorSpec(a.shape, "float32") for a in arrays]
    kernel = get_op("attention").kernels["cpu"](get_backend("cpu"), 0, specs,
                                                [TensorSpec(want.shape, "float32")], attrs)
    out = np.empty(want.shape, np.float32)
    kernel(*arrays, out)
    _check(out, want, "float32")
    flipped = [np.ascontiguousarray(a[::-1]) for a in arrays]
    other_out = np.empty_like(out)
    kernel(*flipped, other_out)
    _check(other_out, want[::-1], "float32")
    kernel(*arrays, out)
    _check(out, want, "float32")
    for a, f in zip(arrays, flipped):
        a[...] = f
    kernel(*arrays, out)
    _check(out, want[::-1], "float32")


@pytest.mark.parametrize("scale", [-0.5, 0.0])
def test_cpu_kernel_without_mask_and_a_scale_not_positive(scale: float) -> None:
    """A positive scale is applied inside the softmax's exp; any other is applied first."""
    arrays, attrs, _ = _case(*CASES[2], dtype="float32")
    attrs = dict(attrs, scale=scale)
    batch, q_len, _, heads, dim = CASES[2][:5]
    width = heads * dim
    heads_of = [a.astype(np.float64)[:, :, o:o + width].reshape(batch, q_len, heads, dim)
                .transpose(0, 2, 1, 3)
                for a, o in zip(arrays, (attrs["q_offset"], attrs["k_offset"], attrs["v_offset"]))]
    s = heads_of[0] @ heads_of[1].transpose(0, 1, 3, 2) * scale
    e = np.exp(s - s.max(-1, keepdims=True))
    want = (e / e.sum(-1, keepdims=True) @ heads_of[2]).transpose(0, 2, 1, 3).reshape(
        batch, q_len, width)
    specs = [TensorSpec(a.shape, "float32") for a in arrays]
    kernel = get_op("attention").kernels["cpu"](get_backend("cpu"), 0, specs,
                                                [TensorSpec(want.shape, "float32")], attrs)
    out = np.empty(want.shape, np.float32)
    kernel(*arrays, out)
    _check(out, want, "float32")


@pytest.mark.parametrize("products", ["blas", "onednn"])
def test_a_shared_kernels_call_sites_keep_their_own_views(products: str) -> None:
    """One kernel called by two nodes (a decoder's layers share it), each at its call site:
    the sites' arrays alternate, each site makes its views once and every call is right
    (oneDNN's products, which the sites share, pointed at each call's arrays)."""
    from graph_runtime.lib.kernels.cpu.attention import AttentionKernel
    from graph_runtime.lib.ops.attention import _params
    if products == "onednn":
        require_onednn()
    arrays, attrs, want = _case(*GQA_CASES[0], dtype="float32")
    sets = [(arrays, attrs, want), ([a.copy() for a in arrays], attrs, want)]  # other arrays
    kernel = AttentionKernel(**_params([TensorSpec(a.shape, "float32") for a in arrays], attrs),
                             products=products)
    sites = [kernel.call_site(), kernel.call_site()]
    outs = [np.empty(want.shape, np.float32) for _, _, want in sets]
    made = []
    for _ in range(3):
        for site, (arrays, _, want), out in zip(sites, sets, outs):
            out[...] = np.nan
            site(*arrays, out)
            _check(out, want, "float32")
        made.append([site.seen.views for site in sites])
    assert all(views[0] is views[1] for views in zip(*made))  # made once per site
    assert (made[0][0][5] is not None) == (products == "onednn")


@pytest.mark.parametrize("threads", ["openmp", "workers"])
@pytest.mark.parametrize("case", CASES + GQA_CASES + WORKER_CASES)
def test_cpu_onednn_products_match_float64(monkeypatch, case: tuple, threads: str) -> None:
    """The products on oneDNN (onednn/attention_products.py) over the same strided head views,
    in each oneDNN threading mode, with blocks of heads on the workers where they pay."""
    from graph_runtime.lib.kernels.cpu.attention import AttentionKernel
    from graph_runtime.lib.ops.attention import _params
    from graph_runtime.settings import ONEDNN_THREADS
    require_onednn()
    monkeypatch.setenv(ONEDNN_THREADS.name, threads)
    arrays, attrs, want = _case(*case, dtype="float32")
    specs = [TensorSpec(a.shape, "float32") for a in arrays]
    p = _params(specs, attrs)
    kernel = AttentionKernel(**p, products="onednn")
    assert kernel.impl and not kernel.impl.startswith("ref")
    # OpenBLAS is held at one thread beside oneDNN's products (a threaded GEMV elsewhere in the
    # run left its threads spinning on the cores oneDNN's OpenMP threads need)
    assert kernel.uses_workers()
    out = np.full(want.shape, np.nan, np.float32)
    kernel(*arrays, out)
    _check(out, want, "float32")
    assert kernel._views(kernel._views_of, (*arrays, out))[5] is not None  # oneDNN did that call
    # arrays it was not made for (a strided view): OpenBLAS does that call, same result
    wide = np.zeros(want.shape[:2] + (want.shape[2] + 1,), np.float32)
    kernel(*arrays, wide[:, :, :-1])
    _check(wide[:, :, :-1], want, "float32")


def _onednn_kernel(monkeypatch, case: tuple, threads: str, workers: str | None = None,
                   split: str | None = None, softmax_from: int | None = None
                   ) -> tuple[list[np.ndarray], np.ndarray, Any]:
    """The float32 case's inputs, its float64 reference and an AttentionKernel with its
    products on oneDNN, made with oneDNN's threads mode (and the runtime's workers, the
    attention split and ONEDNN_SOFTMAX_SCORES where given); its output checked once."""
    from graph_runtime.lib.kernels.cpu import attention
    from graph_runtime.lib.ops.attention import _params
    from graph_runtime.settings import ATTENTION_SPLIT, NUM_THREADS, ONEDNN_THREADS
    require_onednn()
    monkeypatch.setenv(ONEDNN_THREADS.name, threads)
    for setting, value in ((NUM_THREADS, workers), (ATTENTION_SPLIT, split)):
        if value is not None:
            monkeypatch.setenv(setting.name, value)
    if softmax_from is not None:
        monkeypatch.setattr(attention, "ONEDNN_SOFTMAX_SCORES", softmax_from)
    arrays, attrs, want = _case(*case, dtype="float32")
    p = _params([TensorSpec(a.shape, "float32") for a in arrays], attrs)
    kernel = attention.AttentionKernel(**p, products="onednn")
    out = np.full(want.shape, np.nan, np.float32)
    kernel(*arrays, out)
    _check(out, want, "float32")
    return arrays, want, kernel


@pytest.mark.parametrize("threads", ["openmp", "one thread"])
@pytest.mark.parametrize("case", [CASES[2], CASES[4], GQA_CASES[1], GQA_CASES[4]])
def test_cpu_onednn_softmax_with_the_products_matches_float64(monkeypatch, case: tuple,
                                                              threads: str) -> None:
    """With oneDNN's OpenMP threads, or on one thread from ONEDNN_SOFTMAX_SCORES scores (0
    here), q kᵀ takes the scale (and adds the mask) and oneDNN's softmax runs after it; a row
    masked everywhere, or a NaN in q, gives a NaN row as NumPy's softmax does."""
    if threads == "openmp":
        arrays, want, kernel = _onednn_kernel(monkeypatch, case, "openmp")
    else:
        arrays, want, kernel = _onednn_kernel(monkeypatch, case, "workers", workers="1",
                                              softmax_from=0)
    out = np.full(want.shape, np.nan, np.float32)
    assert kernel._views(kernel._views_of, (*arrays, out))[5].softmax_fused
    poisoned = [a.copy() for a in arrays]
    if case[5] is not None:  # batch 0's first query row of every head masked everywhere
        poisoned[3][0, :, 0, :] = -np.inf
    else:  # a NaN in batch 0's first query
        poisoned[0][0, 0, :] = np.nan
    kernel(*poisoned, out)
    assert np.isnan(out[0, 0]).all() and not np.isnan(out[0, 1:]).any()
    assert not np.isnan(out[1:]).any()


@pytest.mark.parametrize("case", [
    WORKER_CASES[1],
    # blocks of whole groups of 2 with a mask: oneDNN fuses none (its fast kernels refuse a
    # grouped-query mask), each block takes the compiled pass
    (2, 64, 64, 8, 32, (2, 1, 64, 64), False, False, 4),
    (2, 64, 64, 4, 32, (2, 4, 64, 64), False, False),  # a mask per batch and head
    (3, 64, 64, 4, 32, (1, 1, 64, 64), True, False),  # one mask for all
    (2, 48, 48, 8, 32, None, False, False, 4)])  # grouped-query, no mask
def test_cpu_onednn_softmax_in_each_block_on_the_workers(monkeypatch, case: tuple) -> None:
    """Blocks of heads on the workers (oneDNN threads `workers`) each scale and mask in their
    q kᵀ and run oneDNN's softmax over their scores (their part of the mask bound at its
    offset), or none does; a row masked everywhere gives a NaN row in its block alone."""
    arrays, want, kernel = _onednn_kernel(monkeypatch, case, "workers", workers="2",
                                          split="on", softmax_from=0)
    assert len(kernel.blocks) > 2
    out = np.full(want.shape, np.nan, np.float32)
    products = kernel._views(kernel._views_of, (*arrays, out))[5]
    grouped_mask = len(case) > 8 and case[5] is not None
    assert products.softmax_fused is not grouped_mask
    assert len(products.blocks) == len(kernel.blocks)
    if case[5] is not None:
        poisoned = [a.copy() for a in arrays]
        poisoned[3][-1, -1, -1, :] = -np.inf  # the last batch's last query row (last head)
        kernel(*poisoned, out)
        heads = range(case[3] - 1 if case[5][1] > 1 else 0, case[3])
        bad = np.zeros(out.shape, bool)
        for h in heads:
            bad[-1, -1, h * case[4]:(h + 1) * case[4]] = True
        if case[5][0] == 1:  # a mask shared by every batch
            bad[:, -1] = bad[-1, -1]
        assert np.isnan(out[bad]).all() and not np.isnan(out[~bad]).any()


@pytest.mark.parametrize("case", [
    (2, 96, 96, 4, 16, (2, 1, 1, 96), False, False),  # a padding mask
    (1, 120, 120, 3, 8, (1, 3, 120, 120), True, False),  # a mask per head, packed qkv
    (1, 100, 100, 4, 8, None, False, False),
    (1, 256, 256, 2, 8, (1, 1, 1, 256), False, False)])  # long rows: the wide pass (if wide())
def test_cpu_openmp_softmax_of_many_scores_on_the_team(monkeypatch, case: tuple) -> None:
    """With oneDNN's OpenMP threads, scores enough for the team (rows_jit.on_team) take the
    compiled pass on it between oneDNN's products (faster than oneDNN's softmax primitive),
    scale and mask included; a row masked everywhere, or a NaN in q, gives a NaN row. Rows
    long enough take its 512-bit form where the machine does (vector_width.py)."""
    from graph_runtime.lib.kernels.cpu import attention, vector_width
    from graph_runtime.lib.kernels.cpu.omp_team import available
    arrays, want, kernel = _onednn_kernel(monkeypatch, case, "openmp")
    if not available():
        pytest.skip("oneDNN's OpenMP team is not available here")
    assert kernel.team and not kernel.softmax_on_onednn
    wide = vector_width.wide_rows(case[2])
    assert kernel._pass_team is (attention._scale_mask_softmax_team_wide if wide
                                 else attention._scale_mask_softmax_team)
    out = np.full(want.shape, np.nan, np.float32)
    views = kernel._views(kernel._views_of, (*arrays, out))
    assert views[5] is not None and not views[5].softmax_fused
    assert kernel._views_of.team_block is not None
    batch, q_len, k_len, heads, dim = case[:5]
    poisoned = [a.copy() for a in arrays]
    if case[5] is not None:  # the mask's first row masked everywhere (where it broadcasts)
        poisoned[3][0, 0, 0, :] = -np.inf
        rows = np.isneginf(np.broadcast_to(poisoned[3], (batch, heads, q_len, k_len))).all(-1)
    else:  # a NaN in batch 0's first query
        poisoned[0][0, 0, :] = np.nan
        rows = np.zeros((batch, heads, q_len), bool)
        rows[0, :, 0] = True
    kernel(*poisoned, out)
    bad = np.repeat(rows.transpose(0, 2, 1), dim, axis=2)  # (batch, query, heads * dim)
    assert np.isnan(out[bad]).all() and not np.isnan(out[~bad]).any()


def test_cpu_one_thread_keeps_the_compiled_softmax_below_the_threshold(monkeypatch) -> None:
    """On one thread a call of fewer than ONEDNN_SOFTMAX_SCORES scores keeps the compiled pass
    between oneDNN's products (the primitive gains nothing there)."""
    from graph_runtime.lib.kernels.cpu.attention import ONEDNN_SOFTMAX_SCORES
    arrays, want, kernel = _onednn_kernel(monkeypatch, CASES[4], "workers", workers="1")
    assert kernel.scores.size < ONEDNN_SOFTMAX_SCORES
    out = np.full(want.shape, np.nan, np.float32)
    products = kernel._views(kernel._views_of, (*arrays, out))[5]
    assert products is not None and not products.softmax_fused


@pytest.mark.parametrize("heads,kv,message", [
    (4, 3, "kv_heads 3 must be a positive divisor of num_heads 4"),
    (4, 0, "kv_heads 0 must be a positive divisor of num_heads 4"),
    (6, 12, "kv_heads 12 must be a positive divisor of num_heads 6")])
def test_kv_heads_not_dividing_the_heads_is_refused(heads: int, kv: int, message: str) -> None:
    from graph_runtime.errors import LibraryError
    specs = [TensorSpec((1, 5, heads * 4), "float32")] * 3
    attrs = {"num_heads": heads, "head_dim": 4, "kv_heads": kv}
    with pytest.raises(LibraryError, match=f"^attention: {message}$"):
        get_op("attention").infer(specs, attrs)


def test_kv_columns_beyond_k_are_refused() -> None:
    """k holds 2 heads of 4 from column 2: kv_heads 2 needs columns [2, 10) of its 9."""
    from graph_runtime.errors import LibraryError
    specs = [TensorSpec((1, 5, 16), "float32"), TensorSpec((1, 5, 9), "float32"),
             TensorSpec((1, 5, 8), "float32")]
    attrs = {"num_heads": 4, "head_dim": 4, "kv_heads": 2, "k_offset": 2}
    with pytest.raises(LibraryError, match=r"k .* has no columns \[2, 10\) for batch 1"):
        get_op("attention").infer(specs, attrs)


@pytest.mark.parametrize("k_shape,k_offset,message", [
    ((1, 3, 5, 4), 0, r"k \(1, 3, 5, 4\) float32 is not \(1, 2, tokens, 4\) with k_offset 0 "
                      r"\(it has 0\)"),
    ((1, 2, 5, 4), 1, r"k \(1, 2, 5, 4\) float32 is not \(1, 2, tokens, 4\) with k_offset 0 "
                      r"\(it has 1\)"),
    ((1, 2, 6, 4), 0, r"v \(1, 2, 5, 4\) float32 needs 6 tokens as k"),
    ((1, 2, 1, 5, 4), 0, r"k \(1, 2, 1, 5, 4\) float32 must be \(batch, tokens, width\) or")])
def test_kv_in_heads_layout_of_other_shapes_are_refused(k_shape: tuple, k_offset: int,
                                                        message: str) -> None:
    """k and v as a KV cache holds them, (batch, kv_heads, tokens, head_dim), or refused."""
    from graph_runtime.errors import LibraryError
    specs = [TensorSpec((1, 5, 16), "float32"), TensorSpec(k_shape, "float32"),
             TensorSpec((1, 2, 5, 4), "float32")]
    attrs = {"num_heads": 4, "head_dim": 4, "kv_heads": 2, "k_offset": k_offset}
    with pytest.raises(LibraryError, match=f"^attention: {message}"):
        get_op("attention").infer(specs, attrs)


def test_a_new_shapes_small_attention_takes_every_past_length() -> None:
    """Prepared for a symbolic module's new shape (tuning.by_size_class) at a decode step's
    size, the kernel takes any shape: one kept per size class serves every past length, each
    as exact as its own kernel, and arrays that do not fit together are refused as prepare()
    refuses them."""
    from graph_runtime.errors import LibraryError
    from graph_runtime.lib import tuning
    kernels = []
    for k_len in (9, 12, 5, 9):
        arrays, attrs, want = _case(2, 1, k_len, 8, 4, (2, 1, 1, k_len), False, False, 2, True,
                                    dtype="float32")
        if not kernels:
            specs = [TensorSpec(a.shape, "float32") for a in arrays]
            with tuning.by_size_class():
                kernels.append(get_op("attention").kernels["cpu"](
                    get_backend("cpu"), 0, specs, [TensorSpec(want.shape, "float32")], attrs))
            assert kernels[0].any_shape()
        out = np.empty(want.shape, np.float32)
        kernels[0](*arrays, out)
        _check(out, want, "float32")
    # each new length is checked as the one before it, against the dims that moved: no check
    # of its own and no kept kernel per length (a decode step meets one at every token)
    assert len(kernels[0]._kernels.keys()) == 1
    q, k, v, mask = arrays
    with pytest.raises(LibraryError, match="needs 9 tokens"):
        kernels[0](q, k, v[:, :, :7], mask, out)
    with pytest.raises(LibraryError, match="does not broadcast"):
        kernels[0](q, k, v, mask[..., :7], out)
    # it serves any past length whose work stays that small; a longer one is the tuning
    # service's choice (prepared again)
    from graph_runtime.lib.ops.attention import ONE_SHOT_FLOPS
    shapes = [a.shape for a in arrays] + [out.shape]
    assert kernels[0].serves(shapes)
    long = ONE_SHOT_FLOPS // (4 * 2 * 8 * 4) + 1  # tokens: batch 2, 8 heads of 4, one query
    assert not kernels[0].serves([s[:-1] + (long,) if i == 3 else
                                  s[:2] + (long,) + s[3:] if i in (1, 2) else s
                                  for i, s in enumerate(shapes)])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES + GQA_CASES + [
    # a mask broadcast over its tokens (last dim 1), and one over batch and queries only
    (2, 3, 6, 4, 4, (1, 4, 3, 1), False, False),
    (2, 1, 6, 4, 4, (1, 4, 1, 6), False, False, 2, True)])
def test_few_query_kernel_matches_float64(case: tuple, dtype: str) -> None:
    """The decode step's one-pass kernel at every case's shapes (it takes any number of query
    rows; a symbolic module gives it one), arrays met again and new ones."""
    from graph_runtime.lib.kernels.cpu.attention import FewQueryAttention
    arrays, attrs, want = _case(*case, dtype=dtype)
    heads = attrs["num_heads"]
    kernel = FewQueryAttention(heads, attrs.get("kv_heads", heads), attrs["head_dim"],
                               (attrs["q_offset"], attrs["k_offset"], attrs["v_offset"]),
                               attrs["scale"], attrs["nan_to_zero"], len(arrays) == 4, dtype)
    assert kernel.any_shape() and kernel.workspace_bytes() == 0
    out = np.empty(want.shape, dtype)
    for _ in range(2):  # the same arrays again, as a module calls it every run
        out[...] = 7.0
        kernel(*arrays, out)
        _check(out, want, dtype)
    fresh = [a.copy() for a in arrays]
    out = np.empty(want.shape, dtype)
    kernel(*fresh, out)
    _check(out, want, dtype)


def test_a_decode_steps_attention_runs_on_the_few_query_kernel() -> None:
    """A symbolic module's new shape of one query row takes the one-pass kernel, shared by
    every past length; more rows keep OpenBLAS's products."""
    from graph_runtime.lib import tuning
    from graph_runtime.lib.kernels.cpu.attention import AttentionKernel, FewQueryAttention
    made = {}
    for q_len in (1, 3):
        arrays, attrs, want = _case(2, q_len, 9, 8, 4, (2, 1, 1, 9), False, False, 2, True,
                                    dtype="float32")
        specs = [TensorSpec(a.shape, "float32") for a in arrays]
        with tuning.by_size_class():
            kernel = get_op("attention").kernels["cpu"](
                get_backend("cpu"), 0, specs, [TensorSpec(want.shape, "float32")], attrs)
        out = np.empty(want.shape, np.float32)
        kernel(*arrays, out)
        _check(out, want, "float32")
        made[q_len] = kernel._own.kernel  # the kernel of the shape its own calls met last
    assert isinstance(made[1], FewQueryAttention)
    assert isinstance(made[3], AttentionKernel)


def test_a_decode_steps_attention_replays_on_the_arrays_its_site_follows() -> None:
    """A node's site of the new-shape attention (ByShapeSite) recorded at one past length,
    then told the next lengths' arrays (follow, as a decode step's replay is kept): the
    recorded call, replayed, computes each length's attention; arrays of a shape the kernel
    refuses are not followed (the step is then called, and refused, as before)."""
    from graph_runtime.lib import tuning
    from graph_runtime.lib.kernels import replay
    from graph_runtime.lib.kernels.cpu import omp_team
    from graph_runtime.lib.kernels.onednn import binding
    if not binding.available():  # (a replay runs on oneDNN's stream)
        pytest.skip(f"oneDNN not available: {binding.unavailable_reason()}")
    if not omp_team.gomp_loaded():
        pytest.skip("libgomp's GOMP_parallel did not load: no team functions")

    def case(k_len: int) -> tuple[list[np.ndarray], dict, np.ndarray, np.ndarray]:
        arrays, attrs, want = _case(2, 1, k_len, 8, 4, (2, 1, 1, k_len), False, False, 2,
                                    True, dtype="float32")
        return arrays, attrs, want, np.zeros(want.shape, np.float32)
    arrays, attrs, want, out = case(9)
    specs = [TensorSpec(a.shape, "float32") for a in arrays]
    with tuning.by_size_class():
        kernel = get_op("attention").kernels["cpu"](
            get_backend("cpu"), 0, specs, [TensorSpec(want.shape, "float32")], attrs)
    site = kernel.call_site()
    recording, why = replay.record(site, (*arrays, out))
    assert recording is not None, why
    _check(out, want, "float32")
    replayed = replay.Replay([replay.Rows(recording, replay.Scratchpad())], ["attention"])
    for k_len in (10, 31, 4):
        arrays, _, want, out = case(k_len)
        assert site.follow(*arrays, out)
        replayed()
        _check(out, want, "float32")
    q, k, v, mask = arrays
    assert not site.follow(q, k, v[:, :, :3], mask, out)  # fewer tokens in v than in k
    out[...] = 0
    replayed()
    _check(out, want, "float32")
