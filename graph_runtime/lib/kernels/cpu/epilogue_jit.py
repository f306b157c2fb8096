"""A conv epilogue (bias, residual add, relu/clip) as one compiled pass over an output block."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .loops_jit import compiled, inlined

_NO_OPERAND = {np.dtype(name): np.zeros((1, 1, 1, 1), name) for name in ("float32", "float64")}


@compiled
def _bias_residual_clamp(out: Any, n0: int, n1: int, c0: int, c1: int, r0: int, r1: int,
                         bias: Any, bc: int, res: Any, rn: int, rc: int, ry: int, rx: int,
                         has_res: bool, lo: Any, hi: Any) -> None:
    """out[n0:n1, c0:c1, r0:r1] = clamp(out + bias[c * bc] + res, lo, hi) in out's dtype, res
    broadcast by the (rn, rc, ry, rx) multipliers (0 on an axis it does not span; bc 0: the
    bias is one zero). NaN stays NaN, as with np.clip."""
    width = out.shape[3]
    for n in range(n0, n1):
        for c in range(c0, c1):
            b = bias[0, c * bc, 0, 0]
            for y in range(r0, r1):
                row = out[n, c, y]
                rrow = res[n * rn, c * rc, y * ry]
                # NOTE: one loop per residual layout, so each vectorizes (an index x * rx does not)
                if has_res and rx:
                    for x in range(width):
                        row[x] = _clamp(row[x] + b + rrow[x], lo, hi)
                elif has_res:
                    r = rrow[0]
                    for x in range(width):
                        row[x] = _clamp(row[x] + b + r, lo, hi)
                else:
                    for x in range(width):
                        row[x] = _clamp(row[x] + b, lo, hi)


@inlined
def _clamp(v: Any, lo: Any, hi: Any) -> Any:
    """max then min, as np.clip; a NaN fails both tests and stays NaN."""
    if v < lo:
        v = lo
    if v > hi:
        v = hi
    return v

def apply_folded(folded: tuple[int | None, Any, float, float, Any], out: Any,
                 extras: Sequence[Any], n0: int, n1: int, c0: int, c1: int, r0: int,
                 r1: int) -> None:
    """Epilogue.apply's compiled path, given Epilogue.folded whose remainder is empty: the bias
    operand's index or None, the residual add (operand, shape) or None, and the clamp."""
    bias, residual, lo, hi, _ = folded
    zero = _NO_OPERAND[out.dtype]
    bias_4d = zero if bias is None else extras[bias].reshape(1, -1, 1, 1)
    res, rn, rc, ry, rx = zero, 0, 0, 0, 0
    if residual is not None:
        res = extras[residual.operand].reshape(residual.shape)
        rn, rc, ry, rx = (int(s != 1) for s in residual.shape)
    scalar = out.dtype.type
    _bias_residual_clamp(out, n0, n1, c0, c1, r0, r1, bias_4d, int(bias is not None), res, rn,
                         rc, ry, rx, residual is not None, scalar(lo), scalar(hi))
