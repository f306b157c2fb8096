"""The kv_append op's kernels (CPU, OpenCL, and the NumPy-API one CUDA runs through CuPy)
against what the ops it replaces compute, written in NumPy as LLaMA's code does: q and k
rotated by rotate_half (bit for bit: the same roundings as the exporters' float ops), k's and
v's heads transposed to head-major and joined onto the past; odd sizes, an empty past, column
offsets, partial rotary, cos and sin per batch item or shared."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.backends import get_backend
from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.registry import get_op

# (batch, tokens, past, q heads, kv heads, head_dim, rotary_dim, lead columns, cos batch, tokens)
CASES = [
    (1, 1, 7, 4, 2, 8, 8, 0, 1, 1),      # a decode step: one token onto seven
    (2, 5, 0, 3, 3, 6, 6, 2, 2, 5),      # a prompt: nothing before it, cos per batch item
    (2, 3, 4, 4, 1, 12, 4, 5, 1, 3),     # multi-query, partial rotary (8 of 12 pass)
    (3, 2, 1, 2, 2, 2, 2, 0, 1, 1),
]


def _rotate_half(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rot: int) -> np.ndarray:
    """x (batch, heads, tokens, dim) as LLaMA's apply_rotary_pos_emb does it."""
    xr, xp = x[..., :rot], x[..., rot:]
    rotated = np.concatenate([-xr[..., rot // 2:], xr[..., :rot // 2]], -1)
    c, s = cos[:, None], sin[:, None]
    return np.concatenate([xr * c + rotated * s, xp], -1)


def _case(batch: int, tokens: int, past: int, qh: int, kvh: int, dim: int, rot: int,
          lead: int, cb: int, ct: int, dtype: str
          ) -> tuple[list[np.ndarray], dict, list[np.ndarray]]:
    rng = np.random.default_rng(batch * 11 + tokens * 3 + past)
    width = lead + (qh + 2 * kvh) * dim + 3
    qkv = rng.standard_normal((batch, tokens, width)).astype(dtype)
    past_k = rng.standard_normal((batch, kvh, past, dim)).astype(dtype)
    past_v = rng.standard_normal((batch, kvh, past, dim)).astype(dtype)
    angles = rng.uniform(0, 6, (cb, ct, rot // 2))
    cos = np.cos(np.concatenate([angles, angles], -1)).astype(dtype)
    sin = np.sin(np.concatenate([angles, angles], -1)).astype(dtype)
    q_off, k_off = lead, lead + qh * dim
    v_off = k_off + kvh * dim

    def heads(offset: int, count: int) -> np.ndarray:  # (batch, heads, tokens, dim)
        return qkv[:, :, offset:offset + count * dim].reshape(
            batch, tokens, count, dim).transpose(0, 2, 1, 3)

    q = _rotate_half(heads(q_off, qh), cos, sin, rot).transpose(0, 2, 1, 3).reshape(
        batch, tokens, qh * dim)
    k = _rotate_half(heads(k_off, kvh), cos, sin, rot)
    want = [q, np.concatenate([past_k, k], 2), np.concatenate([past_v, heads(v_off, kvh)], 2)]
    attrs = {"q_heads": qh, "kv_heads": kvh, "head_dim": dim, "rotary_dim": rot,
             "q_offset": q_off, "k_offset": k_off, "v_offset": v_off}
    return [qkv, past_k, past_v, cos, sin], attrs, want


def _run(kernel_of: str, arrays: list[np.ndarray], attrs: dict,
         want: list[np.ndarray]) -> list[np.ndarray]:
    backend = get_backend(kernel_of)
    dtype = arrays[0].dtype.name
    specs = [TensorSpec(a.shape, dtype) for a in arrays]
    op = get_op("kv_append")
    out_specs = [TensorSpec(w.shape, dtype) for w in want]
    assert op.infer(specs, attrs) == out_specs
    run = op.kernels[kernel_of](backend, 0, specs, out_specs, attrs)
    args = []
    for a in arrays:
        arr = backend.empty(0, a.shape, dtype)
        backend.from_host(np.ascontiguousarray(a), arr)
        args.append(arr)
    outs = [backend.empty(0, w.shape, dtype) for w in want]
    run(*args, *outs)
    backend.sync(0)
    return [backend.to_host(o) for o in outs]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_kernel_matches_the_ops_it_replaces(case: tuple, dtype: str, backend_name: str) -> None:
    arrays, attrs, want = _case(*case, dtype=dtype)
    for got, w in zip(_run(backend_name, arrays, attrs, want), want):
        np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("case", CASES)
def test_numpy_api_kernel_matches_the_ops_it_replaces(case: tuple) -> None:
    """What CUDA runs through CuPy, run here with NumPy."""
    from graph_runtime.lib.ops.kv_append import _host
    arrays, attrs, want = _case(*case, dtype="float32")
    specs = [TensorSpec(a.shape, "float32") for a in arrays]
    outs = [np.empty(w.shape, np.float32) for w in want]
    _host(get_backend("cpu"), 0, specs, [TensorSpec(w.shape, "float32") for w in want],
          attrs)(*arrays, *outs)
    for got, w in zip(outs, want):
        np.testing.assert_array_equal(got, w)


def test_the_cpu_kernel_takes_any_past_length() -> None:
    """Prepared once, called at other lengths and batches (a symbolic module keeps it for
    every decode step): each call reads its arrays' sizes."""
    prepared_at, attrs, want = _case(*CASES[0], dtype="float32")
    specs = [TensorSpec(a.shape, "float32") for a in prepared_at]
    run = get_op("kv_append").kernels["cpu"](
        get_backend("cpu"), 0, specs, [TensorSpec(w.shape, "float32") for w in want], attrs)
    assert run.any_shape() and run.shape_free()
    for past, batch in ((0, 1), (30, 1), (3, 2)):
        case = (batch, 1, past, 4, 2, 8, 8, 0, 1, 1)
        arrays, same_attrs, want = _case(*case, dtype="float32")
        assert same_attrs == attrs
        outs = [np.empty(w.shape, np.float32) for w in want]
        run(*arrays, *outs)
        for got, w in zip(outs, want):
            np.testing.assert_array_equal(got, w)
    # a past held in every other row of a larger array (strided, not contiguous)
    arrays, _, want = _case(1, 1, 5, 4, 2, 8, 8, 0, 1, 1, dtype="float32")
    for i in (1, 2):
        spread = np.zeros(arrays[i].shape[:2] + (10, 8), np.float32)
        spread[:, :, ::2] = arrays[i]
        arrays[i] = spread[:, :, ::2]
    outs = [np.empty(w.shape, np.float32) for w in want]
    run(*arrays, *outs)
    for got, w in zip(outs, want):
        np.testing.assert_array_equal(got, w)


_GOOD = {"q_heads": 2, "kv_heads": 1, "head_dim": 4, "rotary_dim": 4, "q_offset": 0,
         "k_offset": 8, "v_offset": 12}
_SHAPES = [(1, 2, 16), (1, 1, 3, 4), (1, 1, 3, 4), (1, 2, 4), (1, 2, 4)]


@pytest.mark.parametrize("change,shapes,message", [
    ({"rotary_dim": 3}, _SHAPES, "rotary_dim 3 must be even, from 2 to head_dim 4"),
    ({"v_offset": 13}, _SHAPES, r"qkv \(1, 2, 16\) float32 has no columns \[13, 17\) for "
                                "v_offset"),
    ({}, _SHAPES[:3] + [(1, 2, 4)], "takes qkv, past_k, past_v, cos and sin, got 4 inputs"),
    ({}, [_SHAPES[0], (1, 2, 3, 4), *_SHAPES[2:]], r"past_k .* must be \(batch 1, kv_heads 1"),
    ({}, [*_SHAPES[:2], (1, 1, 2, 4), *_SHAPES[3:]], r"past_v .* must be \(batch 1, kv_heads"),
    ({}, [*_SHAPES[:3], (2, 2, 4), (1, 2, 4)], r"cos .* does not broadcast to \(batch, "
                                               r"tokens, 4\)"),
])
def test_refusals_name_the_attr_or_input(change: dict, shapes: list, message: str) -> None:
    specs = [TensorSpec(s, "float32") for s in shapes]
    with pytest.raises(LibraryError, match=f"^kv_append: {message}"):
        get_op("kv_append").infer(specs, {**_GOOD, **change})


def test_a_nodes_site_replays_its_recording_on_the_arrays_it_follows() -> None:
    """A node's call site (KvAppendSite: a decoder's layer) recorded once, then told each new
    past length's arrays (follow): the recorded call, replayed, computes the new arrays'
    result, as a decode step's replay runs without recording the step again. Arrays the team
    function cannot read (strided) are refused and leave the block as it was; a plain call
    with other arrays leaves it too."""
    from graph_runtime.lib.kernels import replay
    from graph_runtime.lib.kernels.cpu import omp_team
    from graph_runtime.lib.kernels.onednn import binding
    if not binding.available():  # (a replay runs on oneDNN's stream)
        pytest.skip(f"oneDNN not available: {binding.unavailable_reason()}")
    if not omp_team.gomp_loaded():
        pytest.skip("libgomp's GOMP_parallel did not load: no team functions")
    attrs_at = _case(*CASES[0], dtype="float32")
    specs = [TensorSpec(a.shape, "float32") for a in attrs_at[0]]
    kernel = get_op("kv_append").kernels["cpu"](
        get_backend("cpu"), 0, specs, [TensorSpec(w.shape, "float32") for w in attrs_at[2]],
        attrs_at[1])
    site = kernel.call_site()

    def case(past: int) -> tuple[tuple[np.ndarray, ...], list[np.ndarray]]:
        arrays, _, want = _case(1, 1, past, 4, 2, 8, 8, 0, 1, 1, dtype="float32")
        return (*arrays, *[np.zeros(w.shape, np.float32) for w in want]), want
    args, want = case(7)
    recording, why = replay.record(site, args)
    assert recording is not None, why
    for got, w in zip(args[5:], want):
        np.testing.assert_array_equal(got, w)
    replayed = replay.Replay([replay.Rows(recording, replay.Scratchpad())], ["kv_append"])
    for past in (8, 30, 0):
        args, want = case(past)
        assert site.follow(*args)
        replayed()
        for got, w in zip(args[5:], want):
            np.testing.assert_array_equal(got, w)
    # strided pasts: refused, the block still the last arrays'
    held = site.block.copy()
    strided, _ = case(5)
    spread = np.zeros((1, 2, 10, 8), np.float32)
    assert not site.follow(strided[0], spread[:, :, ::2], *strided[2:])
    np.testing.assert_array_equal(site.block, held)
    other, other_want = case(3)  # called plainly: its result, the block untouched
    site(*other)
    for got, w in zip(other[5:], other_want):
        np.testing.assert_array_equal(got, w)
    np.testing.assert_array_equal(site.block, held)
    args[5][...] = 0
    replayed()
    for got, w in zip(args[5:], want):
        np.testing.assert_array_equal(got, w)
