"""A oneDNN dense reading flattened NCHW features from their NHWC bytes, weight rows permuted.

batch_flatten of an (N, C, H, W) tensor kept NHWC (runtime/layouts.py) needs a reorder back to
NCHW (39 us for the cnn example's 32x32x16x16 features) before its copy; the dense after it can
instead read the NHWC bytes as (N, H*W*C) rows if its weight's K rows are taken in the same
order. The permuted weight is derived data: made again whenever the weight is written.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...library import InputVersion
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
            c, h, w = self.chw
            kn = weight.T if self.trans_b else weight  # (K, N), K in C, H, W order
            n = kn.shape[1]
            np.copyto(self.permuted.reshape(h, w, c, n),
                      kn.reshape(c, h, w, n).transpose(1, 2, 0, 3))
            self._written.value += 1
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
