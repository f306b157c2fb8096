"""A dense reading flattened NCHW features from their NHWC bytes: its weight's K rows permuted.

batch_flatten of an (N, C, H, W) tensor kept NHWC (runtime/layouts.py) costs a reorder back to
NCHW every run; the dense after it can read the NHWC bytes as (N, H*W*C) rows instead when its
weight's K rows are taken in the same order (runtime/flatten_reads.py). The permuted weight is
derived data, made again whenever the weight is written. This module holds the rule for when
that copy is worth its memory and the permutation, for OpenBLAS's call (NhwcFeaturesDot here),
and what the products that read the copy through a counter of their own share
(PermutedWeightProduct: oneDNN's matmul in onednn/nhwc_dense.py, the team GEMV in
cpu/team_gemv.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import replay
from ..library import InputVersion
from .derived import DerivesFromInputs

# A permuted weight up to this size is kept whatever the batch: a classifier head's (the cnn
# example's 8192 x 10: 320 KB) costs less memory than the features' reorder costs time, 3-6 us
# of its 80 us run at batch 1. Above it, only where the weight is no larger than the features
# (units <= rows): not a VGG-sized classifier's 400 MB at batch 1.
SMALL_WEIGHT_BYTES = 1 << 20


def permuting_pays(m: int, n: int, k: int, itemsize: int) -> bool:
    """Whether a dense of m rows, n units and k features may keep a permuted weight."""
    return n <= m or n * k * itemsize <= SMALL_WEIGHT_BYTES


def permute_features(weight: Any, out: np.ndarray, chw: tuple[int, int, int],
                     trans_b: bool) -> None:
    """weight's K rows (features in C, H, W order) into out in H, W, C order; out has
    weight's orientation: (N, K) where trans_b, else (K, N)."""
    c, h, w = chw
    if trans_b:
        n = weight.shape[0]
        np.copyto(out.reshape(n, h, w, c), weight.reshape(n, c, h, w).transpose(0, 2, 3, 1))
    else:
        n = weight.shape[1]
        np.copyto(out.reshape(h, w, c, n), weight.reshape(c, h, w, n).transpose(1, 2, 0, 3))


class NhwcFeaturesDot(DerivesFromInputs):
    """run(features, weight, out) as np.dot computes a 2-D dense, features (M, H*W*C) NHWC:
    OpenBLAS's call on a permuted copy of the weight, in the weight's own orientation (the
    same GEMV or GEMM as the plain call's)."""

    derived = (1,)

    def __init__(self, m: int, n: int, k: int, trans_b: bool, dtype: str,
                 chw: tuple[int, int, int]) -> None:
        super().__init__()
        self.chw = chw
        self.trans_b = trans_b
        self.permuted = np.empty((n, k) if trans_b else (k, n), dtype)
        self._out_shape = (m, n)

    def __call__(self, features: Any, weight: Any, out: Any) -> None:
        if self._stale():
            permute_features(weight, self.permuted, self.chw, self.trans_b)
        b = self.permuted.T if self.trans_b else self.permuted
        c = out if out.shape == self._out_shape else out.reshape(self._out_shape)
        np.dot(features, b, out=c)

    def workspace_bytes(self) -> int:
        return int(self.permuted.nbytes)

    def note(self) -> str:
        return "OpenBLAS, reading NHWC features"


class PermutedWeightProduct(DerivesFromInputs):
    """run(features, weight, *rest) as `inner` computes it on `permuted`, a copy of the weight
    with its K in H, W, C order (in permuted_trans_b's orientation: (N, K) where true, else
    (K, N); the weight as given is (N, K) where weight_trans_b), features (M, H*W*C) NHWC.
    The copy is made again when the weight's counter moves, and the inner product reads it
    through a counter of its own (its packed or reordered copy made again then)."""

    derived = (1,)

    def __init__(self, inner: Any, permuted: np.ndarray, chw: tuple[int, int, int],
                 weight_trans_b: bool, permuted_trans_b: bool) -> None:
        super().__init__()
        self.inner, self.permuted, self.chw = inner, permuted, chw
        self.weight_trans_b, self.permuted_trans_b = weight_trans_b, permuted_trans_b
        self._written = InputVersion()  # the permuted copy's writes, as the product sees them
        inner.bind_versions({1: self._written})

    def __call__(self, features: Any, weight: Any, *rest: Any) -> None:
        if self._stale():
            given = weight if self.weight_trans_b == self.permuted_trans_b else weight.T
            permute_features(given, self.permuted, self.chw, self.permuted_trans_b)
            # set, not counted (InputVersion.changes): the weight's own write or change was
            # counted already; a weight written without a count is permuted every call, and
            # the product derives nothing from the copy
            self._written.volatile = self._volatile()
            self._written.value += 1
        if replay.recording_here() is None:
            self.inner(features, self.permuted, *rest)
        elif replay.vouched(self.inner, features, self.permuted, *rest) \
                and not self._volatile():
            replay.whole_call(self)

    def note(self) -> str:
        """What `graphrun profile` says of it."""
        return self.inner.note() + ", reading NHWC features"

    def workspace_bytes(self) -> int:
        return int(self.permuted.nbytes) + self.inner.workspace_bytes()
