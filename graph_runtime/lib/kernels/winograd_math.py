"""Winograd F(2x2,3x3) and F(4x4,3x3) arithmetic both backends share: the transform matrices,
where it applies, the float64 weight transform, and how many images one chunk holds.

Y = A^T [(G g G^T) . (B^T d B)] A per m x m output tile (Lavin & Gray, "Fast Algorithms for
Convolutional Neural Networks", 2015).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..conv_params import ConvParams

# Interpolation points 0, 1, -1 (F2) and 0, 1, -1, 2, -2 (F4), plus infinity.
_F2 = (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
       np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64),
       np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64))
_F4 = (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                 [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64),
       np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                 [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64),
       np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                 [0, 1, -1, 8, -8, 1]], np.float64))
MATRICES = {2: _F2, 4: _F4}


def winograd_applies(p: ConvParams) -> bool:
    return (p.kh == p.kw == 3 and p.strides == (1, 1) and p.dilation == (1, 1)
            and p.groups == 1 and p.c > 0 and p.dtype in ("float32", "float64"))


def transform_weight(weight: Any, m: int) -> np.ndarray:
    """U = G g G^T for every (k, c), as (a*a, K, C) float64 (F4's 1/6 and 1/24 lose bits in
    float32); weight is the (K, C, 3, 3) host array."""
    g64 = MATRICES[m][1]
    a = m + 2
    o, c = weight.shape[:2]
    g = np.asarray(weight, np.float64).transpose(2, 3, 0, 1).reshape(3, 3 * o * c)
    half = (g64 @ g).reshape(a, 3, o * c)
    u = np.matmul(g64[None], half)  # (a, a, K*C)
    return u.reshape(a * a, o, c)


def chunk_images(n: int, per_image: int, most: int, budget: int) -> int:
    """Images per chunk: the largest divisor of n, at most `most`, whose tiles fit budget."""
    best = 1
    for d in range(1, min(n, most) + 1):
        if n % d == 0 and d * per_image <= budget:
            best = d
    return best
