"""qdense_add_packed's CPU pass after the integer product: requantize each column with its own
multiplier, bias and zero point, then map the byte through that column's table (its qadd with
the column's constant), in one compiled loop over the int32 accumulators."""
from __future__ import annotations

from typing import Any

import numpy as np

from .loops_jit import compiled


def _requantize_columns(acc: Any, m: Any, b: Any, zero: Any, lo: Any, hi: Any, colmap: Any,
                        out: Any) -> None:
    """out[r, c] = colmap[c, byte(clip(rint(float32(acc[r, c]) * m[c] + b[c]) + zero[c]))]:
    quantized.requantize's float32 steps, column by column."""
    rows, n = acc.shape
    q = np.empty(n, np.int32)
    # NOTE: the arithmetic and the lookup in two loops: the first vectorizes, the gather does
    # not (in one loop neither did: 24 us for BERT-tiny's 64 x 384 projections, 4 split)
    for r in range(rows):
        row = acc[r]
        dst = out[r]
        for c in range(n):
            t = np.float32(row[c]) * m[c] + b[c]
            q[c] = np.int32(min(max(np.rint(t) + np.float32(zero[c]), lo), hi))
        for c in range(n):
            dst[c] = colmap[c, q[c] & 255]


requantize_columns = compiled(_requantize_columns)
