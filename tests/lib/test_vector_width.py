"""512-bit vectors for the softmax loops of long rows (lib/kernels/cpu/vector_width.py): which
CPUs and rows take them, that the wide forms are marked so, and that they compute what the
narrow ones do (NumPy's float64 softmax, NaN rows included)."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from graph_runtime.lib.kernels.cpu import vector_width
from graph_runtime.lib.kernels.cpu.attention import _scale_mask_softmax, _scale_mask_softmax_wide
from graph_runtime.lib.kernels.cpu.vector_width import decide, wide_vectors

F32_EPS = float(np.finfo(np.float32).eps)
AVX512 = {"avx512f": True, "avx2": True}


@pytest.mark.parametrize("word,features,cpu,wide", [
    ("auto", {**AVX512, "avx512fp16": True}, "sapphirerapids", True),
    ("auto", {**AVX512, "avx512fp16": True}, "rocketlake", True),  # a VM's name for a Xeon
    ("auto", AVX512, "skylake-avx512", False),  # lowers its clock for 512-bit arithmetic
    ("auto", AVX512, "cascadelake", False),
    ("auto", AVX512, "znver4", True),
    ("auto", {"avx2": True}, "znver3", False),  # no AVX-512: LLVM's width
    ("512", {"avx2": True}, "haswell", True),  # asked for: LLVM takes the widest it has
    ("256", {**AVX512, "avx512fp16": True}, "sapphirerapids", False)])
def test_the_width_follows_the_setting_then_the_cpu(word: str, features: dict, cpu: str,
                                                    wide: bool) -> None:
    assert decide(word, features, cpu) is wide


def test_rows_take_the_wide_loops_in_whole_turns(monkeypatch) -> None:
    monkeypatch.setattr(vector_width, "wide", lambda: True)
    assert [w for w in (32, 49, 63, 64, 100, 128, 150, 197, 256, 400, 577)
            if vector_width.wide_rows(w)] == [64, 128, 197, 256, 400, 577]
    monkeypatch.setattr(vector_width, "wide", lambda: False)
    assert not vector_width.wide_rows(256)


def test_a_bad_width_is_named_by_the_first_long_row(monkeypatch) -> None:
    """The setting is read at the first long row, not at import: a bad value there names the
    setting (and leaves the jit cache's key without a width)."""
    from graph_runtime.errors import LibraryError
    from graph_runtime.settings import VECTOR_WIDTH
    monkeypatch.setenv(VECTOR_WIDTH.name, "wide")
    vector_width.wide.cache_clear()
    try:
        assert not vector_width.wide_rows(49)  # a short row asks nothing
        with pytest.raises(LibraryError, match="GRAPH_RUNTIME_VECTOR_WIDTH must be auto, 256 or "
                                               "512, got 'wide'"):
            vector_width.wide_rows(256)
        assert vector_width.stamp() is None
    finally:
        monkeypatch.delenv(VECTOR_WIDTH.name)
        vector_width.wide.cache_clear()


def _scores(rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores (1, 2, rows, width) and a mask per head with one row masked everywhere, and a
    NaN in another row."""
    rng = np.random.default_rng(width)
    s = (rng.standard_normal((1, 2, rows, width)) * 4).astype(np.float32)
    mask = np.where(rng.random((1, 2, rows, width)) < 0.2, -np.inf, 0).astype(np.float32)
    mask[0, 1, 0, :] = -np.inf
    s[0, 0, 1, width // 3] = np.nan
    return s, mask


@pytest.mark.parametrize("width", [64, 197, 256])
@pytest.mark.parametrize("nan_to_zero", [False, True])
def test_the_wide_pass_computes_the_narrow_ones_softmax(width: int, nan_to_zero: bool) -> None:
    s, mask = _scores(5, width)
    x64 = s.astype(np.float64) * 0.125 + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    if nan_to_zero:
        want = np.nan_to_num(want, nan=0.0)
    for fn in (_scale_mask_softmax, _scale_mask_softmax_wide):
        got = s.copy()
        fn(got, mask, 0, 0, 0, np.float32(0.125), np.float32(1), nan_to_zero, True)
        np.testing.assert_allclose(got, want, rtol=8 * F32_EPS, atol=8 * F32_EPS,
                                   equal_nan=not nan_to_zero)
        assert np.isnan(got).any() is not nan_to_zero  # the NaN and the masked rows


@numba.njit(inline="always")
def _scale_rows(x, s):  # a loop LLVM vectorizes
    for i in range(x.shape[0]):
        x[i] = x[i] * s


def test_a_marked_function_asks_llvm_for_512_bit_vectors() -> None:
    """wide_vectors() marks the function calling it (where wide() holds): LLVM then uses zmm
    registers in its loops; an unmarked one keeps LLVM's width. (Compiled here, uncached: a
    function loaded from numba's cache holds no IR to read.)"""
    @numba.njit(cache=False)
    def marked(x, s):
        wide_vectors()
        _scale_rows(x, s)

    @numba.njit(cache=False)
    def plain(x, s):
        _scale_rows(x, s)

    x = np.ones(1000, np.float32)
    marked(x, np.float32(2))
    plain(x, np.float32(2))
    np.testing.assert_array_equal(x, 4)
    attribute = '"prefer-vector-width"="512"'
    assert (attribute in marked.inspect_llvm(marked.signatures[0])) is vector_width.wide()
    assert attribute not in plain.inspect_llvm(plain.signatures[0])
    if vector_width.wide():
        assert "zmm" in marked.inspect_asm(marked.signatures[0])
