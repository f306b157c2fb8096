"""qadd_layer_norm on the CPU: per row, the float32 row from one table of byte pairs (qadd's
table composed with the sum's DQ), layer_norm_rows' own steps normalize it (rows_jit.py: float64 sums in vector lanes, the
same formula), and the result is quantized as convert_quant.quantize writes it, in one call."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from . import jit_setup
from .loops_jit import compiled
from .rows_jit import _row_squares, _row_sum


def _rows(a: Any, b: Any, table: Any, gamma: Any, beta: Any, eps: float, params: Any,
          row: Any, out: Any) -> None:
    scale, zero, lo, hi = (np.float32(params[0]), np.int32(params[1]), np.int32(params[2]),
                           np.int32(params[3]))
    rows, n = a.shape
    # NOTE: the lookup, the normalization and the quantization in their own loops: the last two
    # vectorize (12.8 us for BERT-tiny's 64 rows of 128 in one loop with two lookups, 10.4 so)
    for r in range(rows):
        ra = a[r]
        rb = b[r % b.shape[0]]
        for j in range(n):
            row[j] = table[(np.int32(ra[j]) << 8) | np.int32(rb[j])]
        mean = _row_sum(row) / n
        inv = 1.0 / math.sqrt(_row_squares(row, mean) / n + eps)
        for j in range(n):
            row[j] = np.float32((row[j] - mean) * inv * gamma[j] + beta[j])
        dst = out[r]
        for j in range(n):
            q = np.int32(np.rint(row[j] / scale)) + zero
            dst[j] = min(max(q, lo), hi)


_rows_compiled = compiled(_rows)


def qadd_layer_norm_kernel(rows: int, width: int, epsilon: float,
                           params: tuple[float, int, int, int],
                           b_rows: int | None = None) -> Callable[..., None]:
    """run(a, b, sum_table, gamma, beta, out) over rows of width elements, b's b_rows rows
    repeated along a's; params: the output's (scale, zero point, lowest, highest)."""
    jit_setup.start()
    b_rows = rows if b_rows is None else b_rows
    row = np.empty(width, np.float32)
    quant = np.array(params, np.float64)

    def run(a: Any, b: Any, sum_table: Any, gamma: Any, beta: Any, out: Any) -> None:
        _rows_compiled(a.reshape(rows, width).view(np.uint8), b.reshape(b_rows, width).view(
            np.uint8), sum_table, gamma, beta, epsilon, quant, row, out.reshape(rows, width))
    return run
