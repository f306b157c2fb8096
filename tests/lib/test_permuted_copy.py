"""A chain of reshapes and transposes as one copy (kernels/cpu/permuted_copy.py), against the
ops run one by one by NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.device import cpu
from graph_runtime.lib.chain import Chain, PreparedChain, Step
from graph_runtime.lib.kernels.cpu.permuted_copy import PermutedCopy, atom_permutation
from graph_runtime.lib.library import TensorSpec


def _shape(rng: np.random.Generator, count: int, rank: int) -> tuple[int, ...]:
    """A random shape of rank dims holding count elements."""
    dims = [1] * rank
    left, factor = count, 2
    while left > 1:
        while left % factor == 0:
            dims[int(rng.integers(rank))] *= factor
            left //= factor
        factor += 1
    return tuple(dims)


def test_random_chains_match_numpy() -> None:
    """Random chains of reshapes and transposes: where a permutation of atoms exists the one
    copy equals the chain; where none does (a reshape cutting an axis at a size that does not
    divide it, after a transpose), atom_permutation says so (None)."""
    rng = np.random.default_rng(0)
    found = refused = 0
    for _ in range(1500):
        count = int(rng.choice([24, 36, 60, 64, 96, 120]))
        shape = _shape(rng, count, int(rng.integers(1, 5)))
        x = np.arange(count, dtype=np.int32).reshape(shape)
        y, ops = x, []
        for _ in range(int(rng.integers(1, 6))):
            if rng.random() < 0.5:
                axes = tuple(int(a) for a in rng.permutation(y.ndim))
                y = y.transpose(axes)
                ops.append(("transpose", y.shape, axes))
            else:
                y = y.reshape(_shape(rng, count, int(rng.integers(1, 6))))
                ops.append(("reshape", y.shape, None))
        atoms = atom_permutation(shape, ops)
        if atoms is None:
            refused += 1
            continue
        out = np.full(y.shape, -1, np.int32)
        PermutedCopy(*atoms)(x, out)
        np.testing.assert_array_equal(out, y)
        found += 1
    assert found > 1000 and refused > 0


def test_no_permutation_is_refused() -> None:
    # (6, 4) transposed is (4, 6); as (3, 8) each row would take parts of two 4-runs
    assert atom_permutation((6, 4), [("transpose", (4, 6), (1, 0)),
                                     ("reshape", (3, 8), None)]) is None


def _unfold(b: int, c: int, h: int, w: int, patch: int) -> list[Step]:
    """MobileViT's patch unfold as its exporters write it."""
    nh, nw = h // patch, w // patch
    return [Step("reshape", {"newshape": [b * c * nh, patch, nw, patch]}),
            Step("transpose", {"axes": [0, 2, 1, 3]}),
            Step("reshape", {"newshape": [b, c, nh * nw, patch * patch]}),
            Step("transpose", {"axes": [0, 3, 2, 1]}),
            Step("reshape", {"newshape": [b * patch * patch, nh * nw, c]})]


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_mobilevit_unfold_and_fold_are_one_copy_each(dtype: str) -> None:
    b, c, h, w, patch = 2, 8, 8, 12, 2
    x = np.arange(b * c * h * w).astype(dtype).reshape(b, c, h, w)
    tokens = (b * patch * patch, h * w // patch ** 2, c)
    unfold = Chain("unfold", _unfold(b, c, h, w, patch)).prepare(
        cpu(0), [TensorSpec(x.shape, dtype)], [TensorSpec(tokens, dtype)], {})
    assert isinstance(unfold, PermutedCopy)
    want = x.reshape(b * c * (h // patch), patch, w // patch, patch).transpose(0, 2, 1, 3) \
        .reshape(b, c, -1, patch * patch).transpose(0, 3, 2, 1).reshape(tokens)
    out = np.empty(tokens, dtype)
    unfold(x, out)
    np.testing.assert_array_equal(out, want)
    nh, nw = h // patch, w // patch
    fold = Chain("fold", [
        Step("reshape", {"newshape": [b, patch * patch, nh * nw, c]}),
        Step("transpose", {"axes": [0, 3, 2, 1]}),
        Step("reshape", {"newshape": [b * c * nh, nw, patch, patch]}),
        Step("transpose", {"axes": [0, 2, 1, 3]}),
        Step("reshape", {"newshape": [b, c, h, w]})]).prepare(
        cpu(0), [TensorSpec(tokens, dtype)], [TensorSpec(x.shape, dtype)], {})
    assert isinstance(fold, PermutedCopy)
    back = np.empty(x.shape, dtype)
    fold(out, back)
    np.testing.assert_array_equal(back, x)


def test_two_layout_ops_and_other_ops_stay_a_chain() -> None:
    """Two layout ops are _layout_lead's (its copies keep NHWC neighbours' bytes); a chain with
    any other op is not a permutation."""
    x = TensorSpec((2, 3, 4), "float32")
    pair = Chain("pair", [Step("transpose", {"axes": [0, 2, 1]}),
                          Step("reshape", {"newshape": [2, 12]})])
    assert not isinstance(pair.prepare(cpu(0), [x], [TensorSpec((2, 12), "float32")], {}),
                          PermutedCopy)
    mixed = Chain("mixed", [Step("transpose", {"axes": [0, 2, 1]}), Step("relu"),
                            Step("reshape", {"newshape": [2, 12]})])
    run = mixed.prepare(cpu(0), [x], [TensorSpec((2, 12), "float32")], {})
    assert isinstance(run, PreparedChain)
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10
    out = np.empty((2, 12), np.float32)
    run(data, out)
    np.testing.assert_array_equal(out, np.maximum(data.transpose(0, 2, 1), 0).reshape(2, 12))
