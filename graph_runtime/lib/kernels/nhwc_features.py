"""A dense reading flattened NCHW features from their NHWC bytes: its weight's K rows permuted.

batch_flatten of an (N, C, H, W) tensor kept NHWC (runtime/layouts.py) costs a reorder back to
NCHW every run; the dense after it can read the NHWC bytes as (N, H*W*C) rows instead when its
weight's K rows are taken in the same order (runtime/flatten_reads.py). The permuted weight is
derived data, made again whenever the weight is written. This module holds the rule for when
that copy is worth its memory and the permutation, for OpenBLAS's call (NhwcFeaturesDot here)
and oneDNN's matmul (onednn/nhwc_dense.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np

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
