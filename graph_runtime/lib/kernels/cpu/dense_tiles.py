"""Batched dense products in tiles on the CPU workers, each tile's compiled tail applied in cache.

x[m, k] @ w[n, k].T for m > 1 (a transformer's projections and MLPs) on OpenBLAS's own threads
splits each call statically over the cores, so one core taken by another process stalls every
GEMM (issue 22: the same model ran 1.0-7.8x ONNX Runtime's time from run to run). Here the output
is cut into tiles (column blocks, or row blocks) handed out one at a time to the runtime's workers
(threads.parallel_images), each tile on one BLAS thread, so a worker that has a core takes more
tiles; and the chain's elementwise tail after the dense (bias, residual add, GELU: chain_jit.py)
runs on each tile right after its GEMM, while the tile is in cache, instead of one more pass over
the whole output. Kernels of this module claim the workers, so the run holds OpenBLAS at one
thread throughout (runtime/executor.py). One tile on the caller, column blocks or row blocks:
candidates of dense's one set (dense_choice.py; column blocks are its base for large products
without oneDNN).

GRAPH_RUNTIME_DENSE_TILES: auto (default, measured), whole, cols, rows, off (OpenBLAS's threads
and a separate tail pass, as before).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...prepared import PreparedKernel
from ..threads import ONE_BLAS_THREAD, num_threads, parallel_images

MIN_FLOPS = 2e5  # below this the product is too short for the workers or a choice to matter
MIN_COLUMNS = 64  # per column block: narrower GEMMs lose BLAS efficiency
MIN_ROWS = 16
# From here column tiles are the base, kept unless one tile is clearly faster (work spread over
# the workers: _timing.KEEP_SPEEDUP says why). Below this size (ViT-small's 197x192 by 768x192,
# 58 MFLOP) one tile measured 1.1-1.2x faster and the measurement decides.
SPREAD_FLOPS = 1e8

Tile = tuple[int, int, int, int]  # rows [r0, r1), columns [c0, c1)


def tilings(m: int, n: int, k: int) -> list[str]:
    """The tilings worth racing for x[m, k] @ w[n, k].T: one tile, and the column and row blocks
    that cut it (none below MIN_FLOPS)."""
    if 2.0 * m * n * k < MIN_FLOPS:
        return ["whole"]
    return ["whole"] + [t for t in ("cols", "rows") if len(tiles(t, m, n)) > 1]


def tiles(kind: str, m: int, n: int) -> list[Tile]:
    """The tiles of an (m, n) output: one, column blocks (a multiple of 16 wide, about four per
    worker) or row blocks (about two per worker)."""
    workers = num_threads()
    if kind == "cols":
        count = min(4 * workers, n // MIN_COLUMNS)
        if workers > 1 and count > 1:
            step = -(-(-(-n // count)) // 16) * 16
            return [(0, m, c, min(n, c + step)) for c in range(0, n, step)]
    elif kind == "rows":
        count = min(2 * workers, m // MIN_ROWS)
        if workers > 1 and count > 1:
            return [(r * m // count, (r + 1) * m // count, 0, n) for r in range(count)]
    return [(0, m, 0, n)]


class DenseTiles(PreparedKernel):
    """run(x, w, *tail_inputs, out): out[m, n] = tail(x[m, k] @ w[n, k].T, ...) tile by tile.

    tail is a chain_jit.CompiledChain over the (m, n) output (None: the product alone); its
    inputs follow w, the product being written to out and read back from it.
    """

    def __init__(self, m: int, n: int, k: int, tile_list: Sequence[Tile],
                 tail: Any = None) -> None:
        self.shapes = ((m, k), (n, k), (m, n))
        self.tiles = list(tile_list)
        self.workers = min(num_threads(), len(self.tiles))
        self.tail = tail

    def with_tail(self, tail: Any) -> DenseTiles:
        """This product with a compiled tail applied per tile."""
        m, k = self.shapes[0]
        return DenseTiles(m, self.shapes[1][0], k, self.tiles, tail)

    def with_tile_tail(self, tail: Any) -> DenseTiles:
        return self.with_tail(tail)

    def uses_workers(self) -> bool:
        return True

    def note(self) -> str:
        """What `graphrun profile` says of it: the tiles, and the tail they apply."""
        text = f"dense in {len(self.tiles)} tile{'s' if len(self.tiles) > 1 else ''}"
        if self.tail is not None:
            text += ", compiled tail " + "+".join(self.tail.ops)
        return text

    def workspace_bytes(self) -> int:
        return 0 if self.tail is None else self.tail.workspace_bytes()

    def __call__(self, a: Any, b: Any, *rest: Any) -> None:
        a_shape, b_shape, c_shape = self.shapes
        x = a if a.shape == a_shape else a.reshape(a_shape)
        w = b if b.shape == b_shape else b.reshape(b_shape)
        out = rest[-1]
        y = out if out.shape == c_shape else out.reshape(c_shape)
        tail = self.tail
        flat = tail.flat_arrays(rest) if tail is not None else ()
        width = c_shape[1]
        tile_list = self.tiles

        def tile(worker: int, index: int) -> None:
            r0, r1, c0, c1 = tile_list[index]
            if c0 == 0 and c1 == width:
                np.dot(x[r0:r1], w.T, out=y[r0:r1])
            else:
                np.matmul(x[r0:r1], w[c0:c1].T, out=y[r0:r1, c0:c1])
            if tail is not None:
                tail.run_block(r0, r1, c0, c1, width, flat)

        if self.workers <= 1:
            with ONE_BLAS_THREAD:
                for index in range(len(tile_list)):
                    tile(0, index)
            return
        parallel_images(len(tile_list), self.workers, tile)
