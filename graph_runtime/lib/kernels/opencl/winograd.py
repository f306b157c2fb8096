"""Winograd F(2x2,3x3) and F(4x4,3x3) conv2d on OpenCL: transform kernels around a batched GEMM.

The same algorithm as winograd.py, with its matrices: an input transform kernel turns each
a x a tile of the zero-padded input into V[xi][c][tile], a*a GEMMs make
M[xi] = U[xi] (K x C) @ V[xi] (C x tiles) for all images at once, and an output transform
kernel writes Y = A^T M A per tile straight into NCHW, cropping overhanging tiles. A weight
kernel makes U = G g G^T on the device, redone only when the weight's InputVersion moved
(a weight computed by a node: every run, which then costs one more small kernel). The kernels'
source is winograd_source.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ...conv_params import ConvParams
from ..derived import DerivesFromInputs
from ..winograd_math import MATRICES, chunk_images, winograd_applies
from .args import ARRAY, BUFFER, typed_kernel
from .gemm import GemmShape, chosen_variant, is_cpu_device, make_gemm
from .gemm_cpu import blocking, blocks, packed_gemm, skewed_stride
from .winograd_source import winograd_source

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend

I32 = np.int32
I64 = np.int64
# On a CPU device the images go through in chunks whose V and M (a*a*(C + K) values per tile)
# fit this: on PoCL, chunks near 6-8 MiB ran fastest (docs/measurements.md). A GPU gets one
# chunk, as big a GEMM as possible (not measured: no GPU here).
CHUNK_BYTES = 8 << 20


class WinogradCl(DerivesFromInputs):
    """run(data, weight, out) for a 3x3 stride-1 conv2d by F(m x m, 3 x 3), m = 2 or 4.

    On a device whose GEMM is the packed CPU kernel the input and weight transforms write the
    GEMM's B and A panels; elsewhere V and U are plain arrays for make_gemm. panel (None: by
    the GEMM make_gemm would pick) forces either.
    """

    derived = (1,)

    def __init__(self, backend: OpenCLBackend, device_id: int, p: ConvParams, m: int,
                 panel: bool | None = None) -> None:
        super().__init__()
        assert winograd_applies(p) and m in MATRICES  # conv2d_cl checks before building
        self.p, self.m = p, m
        self._fresh = False
        a = m + 2
        self.queue = backend.queue(device_id)
        th, tw = -(-p.oh // m), -(-p.ow // m)
        dtype = np.dtype(p.dtype)
        size = dtype.itemsize
        per_image = a * a * (p.c + p.o) * th * tw * size
        budget = CHUNK_BYTES if is_cpu_device(backend, device_id) else p.n * per_image
        self.images = chunk_images(p.n, per_image, p.n, budget)
        self.chunks = p.n // self.images
        self.steps = (p.c * p.h * p.w * size * self.images, p.o * p.oh * p.ow * size * self.images)
        tiles = self.images * th * tw
        # The a*a planes of U, V and M lie an odd number of cache lines apart (skewed_stride):
        # the transforms write (or read) all planes at once.
        u_plane = skewed_stride(p.o * p.c, size)
        v_plane = skewed_stride(p.c * tiles, size)
        m_plane = skewed_stride(p.o * tiles, size)
        shape = GemmShape(p.o, tiles, p.c, p.dtype, batch=a * a, a_batches=a * a,
                          b_batches=a * a, a_stride=u_plane, b_stride=v_plane,
                          c_stride=m_plane)
        self.block = blocking(backend, device_id, p.dtype)
        if panel is None:
            panel = chosen_variant(backend, device_id, shape) == "packed"
        self.panel = panel
        nb = self.block.nb if self.panel else 0
        mb = self.block.mb
        if self.panel:
            u_plane = skewed_stride(blocks(p.o, mb) * mb * p.c, size)
            v_plane = skewed_stride(blocks(tiles, nb) * nb * p.c, size)
        self.u_plane = u_plane
        source = winograd_source(p.dtype, m, nb, mb if self.panel else 0)
        program = backend.program(device_id, source, name="conv2d winograd")
        ints = [I32] * 8
        self._weight = typed_kernel(program, "gr_wino_weight", [BUFFER, *ARRAY, I32, I32, I64])
        self._input = typed_kernel(program, "gr_wino_input", [BUFFER, *ARRAY, *ints, I64])
        self._output = typed_kernel(program, "gr_wino_output", [*ARRAY, BUFFER, *ints[:6], I64])
        self.mm = backend.empty(device_id, (a * a * m_plane,), dtype)
        self.weight_sizes = [p.o, p.c, u_plane]
        self.in_sizes = [p.c, p.h, p.w, th, tw, tiles, p.pad[0], p.pad[1], v_plane]
        self.out_sizes = [p.o, p.oh, p.ow, th, tw, tiles, m_plane]
        self.weight_grid = (p.c, blocks(p.o, mb) if self.panel else p.o)
        self.in_grid = (p.c, self.images * th)
        self.out_grid = (p.o, self.images * th)
        self.u: Any = None
        self.v: Any = None
        self.gemm: Callable[[Any, Any, Any], None]
        if self.panel:
            self.gemm = packed_gemm(backend, device_id, shape.with_defaults(), self._pack_v,
                                    self.block, self._pack_u, a_batch=u_plane,
                                    b_batch=v_plane)
        else:
            self.gemm = make_gemm(backend, device_id, shape)
            self.u = backend.empty(device_id, (a * a * u_plane,), dtype)
            self.v = backend.empty(device_id, (a * a * v_plane,), dtype)

    def __call__(self, data: Any, weight: Any, out: Any) -> None:
        self._fresh = self._stale()
        step_in, step_out = self.steps
        for chunk in range(self.chunks):
            # (buffer, byte offset) of the chunk's first image
            images = (data.base_data, data.offset + chunk * step_in)
            if self.panel:
                self.gemm(weight, images, self.mm)  # packs through _pack_u and _pack_v
            else:
                self._pack_u(weight, self.u.base_data)
                self._pack_v(images, self.v.base_data)
                self.gemm(self.u, self.v, self.mm)
            self._output(self.queue, self.out_grid, None, out.base_data,
                         out.offset + chunk * step_out, self.mm.base_data, *self.out_sizes)

    def _pack_v(self, images: tuple[Any, int], v: Any) -> None:
        self._input(self.queue, self.in_grid, None, v, *images, *self.in_sizes)

    def _pack_u(self, weight: Any, u: Any) -> None:
        """U into u (plain, or the packed GEMM's A panel) on a run's first chunk when the run's
        weight is new."""
        if self._fresh:
            self._transform_weight(weight, u)
            self._fresh = False

    def _transform_weight(self, weight: Any, u: Any) -> None:
        self._weight(self.queue, self.weight_grid, None, u, weight.base_data, weight.offset,
                     *self.weight_sizes)
