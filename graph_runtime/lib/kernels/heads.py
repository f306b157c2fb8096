"""How attention's operands hold their heads, for every backend's attention kernels: strided
views (NumPy's API) and element strides (oneDNN's and OpenCL's descriptors)."""
from __future__ import annotations

from typing import Any


def head_strides(shape: tuple[int, ...], head_dim: int) -> tuple[int, int, int]:
    """Element strides of batch, head and token of the heads of an array of this shape:
    (batch, tokens, width) with the heads side by side, or (batch, heads, tokens, head_dim)."""
    if len(shape) == 4:
        return shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3]
    return shape[1] * shape[2], head_dim, shape[2]


def head_view(x: Any, offset: int, heads: int, head_dim: int, kv_heads: int = 0) -> Any:
    """(batch, heads, tokens, head_dim) view of columns [offset, offset + heads * head_dim)
    (of x itself where x is in that layout, a KV cache's); with kv_heads, (batch, kv_heads,
    heads // kv_heads, tokens, head_dim): the heads in groups, one per kv head (k's and v's
    own kv heads: heads = kv_heads, groups of one, which matmul broadcasts over the query heads
    of each group)."""
    if x.ndim == 4:
        return x[:, :, None] if kv_heads else x  # only k's and v's: kv_heads = heads
    batch, tokens = x.shape[:2]
    cols = x[:, :, offset:offset + heads * head_dim]
    if kv_heads:
        return cols.reshape(batch, tokens, kv_heads, heads // kv_heads, head_dim) \
            .transpose(0, 2, 3, 1, 4)
    return cols.reshape(batch, tokens, heads, head_dim).transpose(0, 2, 1, 3)
