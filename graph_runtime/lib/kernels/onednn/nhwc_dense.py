"""A oneDNN dense reading flattened NCHW features from their NHWC bytes, weight rows permuted.

batch_flatten of an (N, C, H, W) tensor kept NHWC (runtime/layouts.py) needs a reorder back to
NCHW (39 us for the cnn example's 32x32x16x16 features at batch 32) before its copy; the dense
after it can instead read the NHWC bytes as (N, H*W*C) rows if its weight's K rows are taken in
the same order (kernels/nhwc_features.py: the permutation, and when the copy pays).
"""
from __future__ import annotations

from typing import Any

from ...library import InputVersion
from ..nhwc_features import permute_features
from ..derived import DerivesFromInputs
from .matmul import OnednnMatmul
from .weights import aligned_buffer


class NhwcFeaturesMatmul(DerivesFromInputs):
    """run(features, weight, *extras, out) as `dense` computes it, features (N, H*W*C) NHWC."""

    derived = (1,)

    def __init__(self, dense: OnednnMatmul, shape: tuple[int, ...]) -> None:
        super().__init__()
        batch, m, n, k, trans_a, trans_b, a_batches, b_batches = dense.shape
        _, c, h, w = shape
        self.chw = (c, h, w)
        self.trans_b = trans_b
        # the product reads the permuted weight as a plain (K, N) matrix of its own
        self.inner = OnednnMatmul(batch, m, n, k, trans_a, False, a_batches, b_batches,
                                  split=dense.split, tail=dense.tail, extras=dense.extras,
                                  after=dense.after, after_args=dense.after_args)
        self.permuted = aligned_buffer(4 * k * n)[:k * n].reshape(k, n)
        self._written = InputVersion()
        self.inner.bind_versions({1: self._written})

    def __call__(self, features: Any, weight: Any, *rest: Any) -> None:
        if self._stale():
            # (K, N): the product reads it plain
            permute_features(weight.T if self.trans_b else weight, self.permuted, self.chw,
                             trans_b=False)
            self._written.count()
        self.inner(features, self.permuted, *rest)

    @property
    def impl(self) -> str:
        return self.inner.impl

    def note(self) -> str:
        """What `graphrun profile` says of it."""
        return self.inner.note() + ", reading NHWC features"

    def workspace_bytes(self) -> int:
        return int(self.permuted.nbytes) + self.inner.workspace_bytes()

    def uses_workers(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"NhwcFeaturesMatmul({self.inner!r})"
