"""A oneDNN dense reading flattened NCHW features from their NHWC bytes, weight rows permuted.

batch_flatten of an (N, C, H, W) tensor kept NHWC (runtime/layouts.py) needs a reorder back to
NCHW (39 us for the cnn example's 32x32x16x16 features at batch 32) before its copy; the dense
after it can instead read the NHWC bytes as (N, H*W*C) rows if its weight's K rows are taken in
the same order (kernels/nhwc_features.py: the permutation, and when the copy pays).
"""
from __future__ import annotations

from ..nhwc_features import PermutedWeightProduct
from .matmul import OnednnMatmul
from .weights import aligned_buffer


class NhwcFeaturesMatmul(PermutedWeightProduct):
    """run(features, weight, *extras, out) as `dense` computes it, features (N, H*W*C) NHWC."""

    def __init__(self, dense: OnednnMatmul, shape: tuple[int, ...]) -> None:
        batch, m, n, k, trans_a, trans_b, a_batches, b_batches = dense.shape
        _, c, h, w = shape
        # the product reads the permuted weight as a plain (K, N) matrix of its own
        inner = OnednnMatmul(batch, m, n, k, trans_a, False, a_batches, b_batches,
                             split=dense.split, tail=dense.tail, extras=dense.extras,
                             after=dense.after, after_args=dense.after_args)
        super().__init__(inner, aligned_buffer(4 * k * n)[:k * n].reshape(k, n), (c, h, w),
                         weight_trans_b=trans_b, permuted_trans_b=False)

    @property
    def impl(self) -> str:
        return self.inner.impl

    def uses_workers(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"NhwcFeaturesMatmul({self.inner!r})"
