"""Multi-head attention on the CPU: strided head views into BLAS, one compiled softmax pass.

q, k and v are (batch, tokens, width) arrays whose columns [offset, offset + heads * head_dim)
hold the heads side by side, as the projections (or one packed QKV GEMM) wrote them. Each
head is a strided view of them, never a transposed copy: NumPy's matmul hands every (tokens x
head_dim) view to BLAS with its row stride, the scores land in one workspace, a compiled pass
applies scale, additive mask and softmax (and zeroes NaN rows when the model did) row by row in
cache, and the second matmul writes each head's columns of the output directly.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

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


def attention_kernel(batch: int, heads: int, q_len: int, k_len: int, head_dim: int,
                     offsets: tuple[int, int, int], scale: float, nan_to_zero: bool,
                     mask_shape: tuple[int, ...] | None, dtype: str) -> Callable[..., None]:
    """run(q, k, v, [mask,] out) with out (batch, q_len, heads * head_dim)."""
    scores = np.empty((batch, heads, q_len, k_len), dtype)
    no_mask = np.zeros((1, 1, 1, 1), dtype)
    full = (batch, heads, q_len, k_len)

    def run(q: Any, k: Any, v: Any, *rest: Any) -> None:
        out = rest[-1]
        mask = np.broadcast_to(rest[0], full) if mask_shape is not None else \
            np.broadcast_to(no_mask, full)
        qh = head_view(q, offsets[0], heads, head_dim)
        kh = head_view(k, offsets[1], heads, head_dim)
        vh = head_view(v, offsets[2], heads, head_dim)
        np.matmul(qh, kh.transpose(0, 1, 3, 2), out=scores)
        _scale_mask_softmax(scores, mask, scale, nan_to_zero, mask_shape is not None)
        oh = out.reshape(batch, q_len, heads, head_dim).transpose(0, 2, 1, 3)
        np.matmul(scores, vh, out=oh)
    run.workspace_bytes = scores.nbytes  # type: ignore[attr-defined]
    return run
