"""The compiled depthwise conv2d strategy: loops_jit's loop per (image, channel range) item."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...conv_params import ConvParams
from . import jit_setup
from ..conv_kernel import ConvKernel
from ..conv_epilogue import Epilogue, fold_epilogue
from ..threads import channel_split, chunk_bounds, parallel_items

# Below this many outputs one worker is faster: handing items to a second worker costs more
# than it saves (measured on 2 cores; docs/measurements.md).
SERIAL_OUTPUTS = 1 << 18


class DepthwiseJitConv(ConvKernel):
    """groups == input channels (any multiplier, kernel, stride, dilation, padding), compiled.

    Each output row is made while it sits in L1 (3x3: its 9 taps in one pass; padding handled by
    skipping the taps that fall outside the image, so no padded copy), with the bias, a residual
    add and relu/clip applied before it leaves (fold_epilogue). Items are an image's channel
    ranges, a few per worker; when ops the loop cannot take remain, items are whole images and
    Epilogue.apply finishes each.
    """

    strategy = "depthwise_jit"

    def __init__(self, p: ConvParams, epilogue: Epilogue) -> None:
        from . import loops_jit  # NOTE: numba loads (slow) only once a compiled kernel is built

        jit_setup.start()
        self.bias, self.residual, lo, hi, remaining = fold_epilogue(epilogue)
        super().__init__(p, remaining)
        scalar = np.dtype(p.dtype).type
        self.lo = scalar(lo)
        self.hi = scalar(hi)
        self.zero_bias = self._alloc((p.o,)) if self.bias is None else None
        self.no_residual = np.zeros((1, 1, 1, 1), p.dtype)
        shape = self.residual.shape if self.residual is not None else (1, 1, 1, 1)
        self.spans = tuple(int(s != 1) for s in shape)
        # Ops the loop cannot take run per whole image after it: one channel range per image.
        self.chunks, self.workers = channel_split(p.n, 1 if remaining.ops else p.o,
                                                  p.n * p.o * p.oh * p.ow, SERIAL_OUTPUTS)
        self.loop = loops_jit.depthwise_conv2d
        loops_jit.warm_depthwise(p.dtype)  # compile now: create() pays for it, not the first run

    def __call__(self, data: Any, weight: Any, *rest: Any) -> None:
        p = self.p
        out = rest[-1]
        extras = rest[:-1]
        bias = self.zero_bias if self.bias is None else extras[self.bias].reshape(p.o)
        residual = self.no_residual
        if self.residual is not None:
            residual = extras[self.residual.operand].reshape(self.residual.shape)
        rn, rc, ry, rx = self.spans
        (sh, sw), (dh, dw) = p.strides, p.dilation
        pt, pl = p.pad[0], p.pad[1]
        chunks = self.chunks
        has_residual = self.residual is not None

        def item(worker: int, i: int) -> None:
            n, chunk = divmod(i, chunks)
            c0, c1 = chunk_bounds(p.o, chunks, chunk)
            self.loop(data, weight, bias, residual, out, n, c0, c1, p.og, sh, sw, dh, dw, pt, pl,
                      rn, rc, ry, rx, has_residual, self.lo, self.hi)
            self.epilogue.apply(out, n, n + 1, extras)
        parallel_items(p.n * chunks, self.workers, item)
