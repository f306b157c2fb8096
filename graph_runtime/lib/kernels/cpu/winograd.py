"""Winograd F(2x2,3x3) and F(4x4,3x3) for 3x3 stride-1 conv2d on CPU, transforms as GEMMs.

Y = A^T [(G g G^T) . (B^T d B)] A per m x m output tile (Lavin & Gray, "Fast Algorithms for
Convolutional Neural Networks", 2015): the a x a = (m+2)^2 elementwise products become a*a GEMMs
U[xi] (K x C) @ V[xi] (C x tiles), 2.25x (F2) or 4x (F4) fewer multiplies than im2col. Tiles sit
on the last axis, so each 1-D transform is one GEMM over the whole (a, rest) plane. The weight
transform U is kept between runs and redone only when the weight's InputVersion moved.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...conv_params import ConvParams
from ..winograd_math import MATRICES, chunk_images, transform_weight, winograd_applies
from ..conv_kernel import ConvKernel
from .conv import as_strided
from ..conv_epilogue import Epilogue
from ..threads import num_threads, parallel_images

CHUNK_BYTES = 1 << 21  # transformed tiles of one chunk of images: about an L2's worth
# Bands pay only on big images: below about 1.5 MiB of transformed tiles the hand-off between
# workers costs more than the second worker saves (measured on 2 vCPUs; docs/measurements.md).
BAND_MIN_BYTES = 3 << 19


class WinogradConv(ConvKernel):
    """F(m x m, 3 x 3) with m = 2 or 4, over chunks of images sized to stay in cache."""

    derived = (1,)

    def __init__(self, p: ConvParams, epilogue: Epilogue, m: int) -> None:
        super().__init__(p, epilogue)
        self.strategy = f"winograd{m}" if m != 2 else "winograd"
        self.m = m
        a = m + 2
        self.a = a
        bt, _, at = MATRICES[m]
        dtype = p.dtype
        self.bt, self.at = bt.astype(dtype), at.astype(dtype)
        self.a_mat = np.ascontiguousarray(at.T).astype(dtype)  # A (a x m)
        self.th, self.tw = -(-p.oh // m), -(-p.ow // m)
        size = np.dtype(dtype).itemsize
        workers = num_threads()
        # Fewer images than workers (batch 1) with much to do per image: each image's tile
        # rows are cut into bands, two per worker, all read from one shared padded batch.
        self.banded = (0 < p.n < workers and self.th > 1
                       and a * a * max(p.c, p.o) * self.th * self.tw * size >= BAND_MIN_BYTES)
        self.band = -(-self.th // min(self.th, 2 * workers)) if self.banded else self.th
        self.bands = -(-self.th // self.band)
        tiles = self.band * self.tw
        # At least two chunks per worker when the batch allows, so workers can balance.
        self.nb = 1 if self.banded else chunk_images(
            max(p.n, 1), a * a * max(p.c, p.o) * tiles * size, max(1, p.n // (2 * workers)),
            CHUNK_BYTES)
        nb = self.nb
        self.exact = self.th * m == p.oh and self.tw * m == p.ow and not self.banded
        self.u = self._alloc((a * a, p.o, p.c))
        self.items = p.n // nb * self.bands
        self.workers = max(1, min(workers, self.items))
        self.spaces = [_WinogradSpace(self) for _ in range(self.workers)]
        self.band_tiles: list[Any] = []
        if self.banded:
            self.padded, self.interior = self._padded_batch(p.n, self.bands * self.band)
            for n in range(p.n):
                for b in range(self.bands):
                    base = self.padded[n:n + 1, :, b * self.band * m:]
                    self.band_tiles.append(self._tiles(base, self.band))

    def _padded_batch(self, n: int, tile_rows: int) -> tuple[np.ndarray, np.ndarray]:
        """A zeroed buffer for n padded images covering tile_rows rows of tiles, and the view
        of it the images are copied into."""
        p = self.p
        pt, pl = p.pad[0], p.pad[1]
        padded = self._alloc((n, p.c, tile_rows * self.m + 2, self.tw * self.m + 2))
        return padded, padded[:, :, pt:pt + p.h, pl:pl + p.w]

    def _tiles(self, padded: np.ndarray, tile_rows: int) -> np.ndarray:
        """The overlapping a x a input tiles of padded images as (a, a, C, N, tile_rows, tw)."""
        p, a, m = self.p, self.a, self.m
        s_n, s_c, s_h, s_w = padded.strides
        return as_strided(padded, shape=(a, a, p.c, padded.shape[0], tile_rows, self.tw),
                          strides=(s_h, s_w, s_c, s_n, m * s_h, m * s_w))

    def __call__(self, data: Any, weight: Any, *rest: Any) -> None:
        p = self.p
        out = rest[-1]
        extras = rest[:-1]
        if self._stale():
            self.u[...] = transform_weight(weight, self.m)
        a, m, nb, band = self.a, self.m, self.nb, self.band
        if self.banded:
            self.interior[...] = data

        def chunk(worker: int, index: int) -> None:
            w = self.spaces[worker]
            if self.banded:
                n0, b = divmod(index, self.bands)
                np.copyto(w.d, self.band_tiles[index])
            else:
                n0, b = index * nb, 0
                w.interior[...] = data[n0:n0 + nb]
                np.copyto(w.d, w.tiles)
            np.matmul(self.bt, w.d.reshape(a, -1), out=w.e.reshape(a, -1))
            np.matmul(self.bt[None], w.e, out=w.v)
            np.matmul(self.u, w.v.reshape(a * a, p.c, -1), out=w.mm)
            np.matmul(self.at, w.mm.reshape(a, -1), out=w.z.reshape(m, -1))
            # The last transform puts s (the tile column) innermost: y[r, (k, n, ty, tx), s],
            # so rows of whole output rows (tx, s) copy contiguously into NCHW.
            np.matmul(w.z.transpose(0, 2, 1), self.a_mat, out=w.y)
            rows = w.y.reshape(m, p.o, nb, band, self.tw * m).transpose(2, 1, 3, 0, 4)
            r0 = b * band * m
            r1 = min(p.oh, r0 + band * m)
            if self.exact:
                target = out[n0:n0 + nb].reshape(nb, p.o, band, m, self.tw * m)
                np.copyto(target, rows)
            else:
                full = w.full
                assert full is not None  # made whenever tiles overhang the image
                np.copyto(full.reshape(nb, p.o, band, m, self.tw * m), rows)
                out[n0:n0 + nb, :, r0:r1] = full[:, :, :r1 - r0, :p.ow]
            self.epilogue.apply(out, n0, n0 + nb, extras, rows=(r0, r1))
        parallel_images(self.items, self.workers, chunk)


class _WinogradSpace:
    """One worker's buffers for a chunk of nb images, tiles on the last axes."""

    def __init__(self, k: WinogradConv) -> None:
        p, a, m, nb, band = k.p, k.a, k.m, k.nb, k.band
        cols = nb * band * k.tw
        if not k.banded:  # banded kernels share one padded batch (WinogradConv.padded)
            self.padded, self.interior = k._padded_batch(nb, k.th)
            self.tiles = k._tiles(self.padded, k.th)
        self.d = k._alloc((a, a, p.c, nb, band, k.tw))
        self.e = k._alloc((a, a, p.c * cols))
        self.v = k._alloc((a, a, p.c * cols))
        self.mm = k._alloc((a * a, p.o, cols))
        self.z = k._alloc((m, a, p.o * cols))
        self.y = k._alloc((m, p.o * cols, m))
        # Output tiles that overhang the image (or a band's rows) go through `full`, then get
        # cropped.
        self.full = None if k.exact else k._alloc((nb, p.o, band * m, k.tw * m))
