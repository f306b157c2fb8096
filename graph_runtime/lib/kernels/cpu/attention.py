"""Multi-head attention on the CPU: strided head views into BLAS, one compiled softmax pass.

q, k and v are (batch, tokens, width) arrays whose columns [offset, offset + heads * head_dim)
hold the heads side by side, as the projections (or one packed QKV GEMM) wrote them. Each
head is a strided view of them, never a transposed copy: NumPy's matmul hands every (tokens x
head_dim) view to BLAS with its row stride, the scores land in one workspace, a compiled pass
applies scale, additive mask and softmax (and zeroes NaN rows when the model did) row by row in
cache, and the second matmul writes each head's columns of the output directly.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...prepared import PreparedKernel
from .loops_jit import compiled
from .rows_jit import softmax_row


@compiled
def _scale_mask_softmax(s: Any, mask: Any, scale: float, nan_to_zero: bool,
                        has_mask: bool) -> None:
    """s[b, h, i, :] = softmax(s * scale + mask[b, h, i, :]) in place (mask broadcast).

    As NumPy's softmax: a NaN, or a row masked everywhere (-inf - -inf), gives a NaN row;
    nan_to_zero then zeroes NaNs, as the exporters' where(isnan(p), 0, p) does.
    """
    nb, nh, nq, nk = s.shape
    for b in range(nb):
        for h in range(nh):
            for i in range(nq):
                row = s[b, h, i]
                if has_mask:
                    mrow = mask[b, h, i]
                    for j in range(nk):
                        row[j] = row[j] * scale + mrow[j]
                else:
                    for j in range(nk):
                        row[j] = row[j] * scale
                softmax_row(row, nan_to_zero)


def head_view(x: np.ndarray, offset: int, heads: int, head_dim: int) -> np.ndarray:
    """(batch, heads, tokens, head_dim) view of columns [offset, offset + heads * head_dim)."""
    cols = x[:, :, offset:offset + heads * head_dim]
    return cols.reshape(x.shape[0], x.shape[1], heads, head_dim).transpose(0, 2, 1, 3)


class AttentionKernel(PreparedKernel):
    """run(q, k, v, [mask,] out) with out (batch, q_len, heads * head_dim); the scores of every
    head live in one workspace made at prepare time."""

    def __init__(self, batch: int, heads: int, q_len: int, k_len: int, head_dim: int,
                 offsets: tuple[int, int, int], scale: float, nan_to_zero: bool,
                 mask_shape: tuple[int, ...] | None, dtype: str) -> None:
        self.batch, self.heads, self.q_len, self.head_dim = batch, heads, q_len, head_dim
        self.offsets, self.scale, self.nan_to_zero = offsets, scale, nan_to_zero
        self.has_mask = mask_shape is not None
        self.full = (batch, heads, q_len, k_len)
        self.scores = np.empty(self.full, dtype)
        self.no_mask = np.broadcast_to(np.zeros((1, 1, 1, 1), dtype), self.full)

    def workspace_bytes(self) -> int:
        return int(self.scores.nbytes)

    def __call__(self, q: Any, k: Any, v: Any, *rest: Any) -> None:
        out = rest[-1]
        mask = np.broadcast_to(rest[0], self.full) if self.has_mask else self.no_mask
        heads, dim = self.heads, self.head_dim
        qh = head_view(q, self.offsets[0], heads, dim)
        kh = head_view(k, self.offsets[1], heads, dim)
        vh = head_view(v, self.offsets[2], heads, dim)
        np.matmul(qh, kh.transpose(0, 1, 3, 2), out=self.scores)
        _scale_mask_softmax(self.scores, mask, self.scale, self.nan_to_zero, self.has_mask)
        oh = out.reshape(self.batch, self.q_len, heads, dim).transpose(0, 2, 1, 3)
        np.matmul(self.scores, vh, out=oh)
