"""CPU conv2d strategies over NCHW float32/float64 data: im2col + GEMM, 1x1 as GEMM, depthwise.

Every strategy writes out[n] = conv(data[n]) one image at a time, so that the fused epilogue
(bias, residual add, relu, clip: conv_epilogue.py) runs on a block still in cache, and the
GEMM output lands in NCHW with no transpose: out[n] = W[K, C*kh*kw] @ cols[C*kh*kw, OH*OW].
Winograd lives in winograd.py; which one runs is chosen in conv_choice.py.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...conv_params import ConvParams
from ..conv_epilogue import Epilogue
from ..conv_kernel import ConvKernel
from ..threads import num_threads, parallel_images

as_strided = np.lib.stride_tricks.as_strided


BLOCK_BYTES = 1 << 20  # im2col columns per work item: inside a core's L2 with the output


class Im2colConv(ConvKernel):
    """General conv2d (any stride, padding, dilation, groups): im2col per block, then one GEMM.

    Work items are blocks of output rows of one image, handed to parallel workers
    (threads.py), each with its own column buffer; a batch-1 conv may be split into blocks
    so that both its GEMM and its im2col run on every core (im2col_rows). A per-channel bias is
    folded into the GEMM: the columns get a constant row of ones and the weight matrix a column
    holding the bias, so no pass over the output adds it.
    """

    strategy = "im2col"

    def __init__(self, p: ConvParams, epilogue: Epilogue, split_rows: bool = False,
                 serial: bool = False) -> None:
        if split_rows:
            self.strategy = "im2col_rows"
        if serial:
            self.strategy = "im2col_serial"
        self.bias = epilogue.channel_bias()
        self.derived = (1,) if self.bias is None else (1, 2 + self.bias)
        super().__init__(p, epilogue.without(self.bias))
        self.kk = p.cg * p.kh * p.kw
        rows = self.kk + (self.bias is not None)
        self.workers = 1 if serial else max(1, num_threads())
        blocks = self._row_blocks(rows, split_rows)
        self.block_rows = -(-p.oh // max(1, min(blocks, p.oh)))
        self.blocks = -(-p.oh // self.block_rows) if p.oh else 0
        self.workers = max(1, min(self.workers, p.n * self.blocks))
        pt, pl, pb, pr = p.pad
        self.padded = self._alloc((p.n, p.c, p.h + pt + pb, p.w + pl + pr))
        self.interior = self.padded[:, :, pt:pt + p.h, pl:pl + p.w]
        s_n, s_c, s_h, s_w = self.padded.strides
        (sh, sw), (dh, dw) = p.strides, p.dilation
        self.windows = as_strided(self.padded,
                                  shape=(p.n, p.groups, p.cg, p.kh, p.kw, p.oh, p.ow),
                                  strides=(s_n, p.cg * s_c, s_c, dh * s_h, dw * s_w, sh * s_h,
                                           sw * s_w))
        self.cols = [self._alloc((p.groups, rows, self.block_rows * p.ow), 1.0)  # bias row = 1
                     for _ in range(self.workers)]
        # Per worker, (block width, its column buffer, its im2col view), made once per width.
        self._views: list[dict[int, tuple[Any, Any]]] = [{} for _ in range(self.workers)]
        self.w_aug = self._alloc((p.groups, p.og, rows))

    def __call__(self, data: Any, weight: Any, *rest: Any) -> None:
        p = self.p
        out = rest[-1]
        extras = rest[:-1]
        self._prepare(data, weight, extras)
        gemm_out = out.reshape(p.n, p.groups, p.og, p.oh * p.ow)
        ow, kk, step, blocks = p.ow, self.kk, self.block_rows, self.blocks

        def block(worker: int, item: int) -> None:
            n, b = divmod(item, blocks)
            r0 = b * step
            r1 = min(p.oh, r0 + step)
            width = (r1 - r0) * ow
            views = self._views[worker].get(width)
            if views is None:
                cols = self.cols[worker][:, :, :width]
                views = (cols, cols[:, :kk].reshape(p.groups, p.cg, p.kh, p.kw, r1 - r0, ow))
                self._views[worker][width] = views
            cols, taps = views
            np.copyto(taps, self.windows[n, :, :, :, :, r0:r1])
            np.matmul(self.w_aug, cols, out=gemm_out[n, :, :, r0 * ow:r1 * ow])
            self.epilogue.apply(out, n, n + 1, extras, (r0, r1))
        parallel_images(p.n * blocks, self.workers, block)

    def _prepare(self, data: Any, weight: Any, extras: Sequence[Any]) -> None:
        """The bias-augmented weight matrix (when stale) and the padded images, for the GEMMs."""
        p = self.p
        if self._stale():
            self.w_aug[:, :, :self.kk] = weight.reshape(p.groups, p.og, self.kk)
            if self.bias is not None:
                self.w_aug[:, :, self.kk] = extras[self.bias].reshape(p.groups, p.og)
        self.interior[...] = data

    def _row_blocks(self, rows: int, split_rows: bool) -> int:
        """Output-row blocks per image: columns within BLOCK_BYTES, or two per worker."""
        p = self.p
        per_image = rows * p.oh * p.ow * np.dtype(p.dtype).itemsize
        blocks = -(-per_image // BLOCK_BYTES)
        if split_rows:  # a batch-1 conv spread over the workers: two blocks each, to balance
            blocks = max(blocks, 2 * self.workers)
        return int(blocks)


class Im2colChannelsConv(Im2colConv):
    """Few images with few output pixels (a deep layer at batch 1): split output channels.

    Row blocks of a 7x7 output are too thin to share: each worker would stream the whole
    weight matrix for a sliver of columns. Here the image's columns are built once, by the
    caller (small here; a parallel gather cost more in hand-off than it saved), then each worker
    multiplies its own block of weight rows by all of them and applies the epilogue to its
    channels. groups == 1 only.
    """

    strategy = "im2col_channels"

    def _row_blocks(self, rows: int, split_rows: bool) -> int:
        return 1  # the whole image's columns at once, in one shared buffer

    def __call__(self, data: Any, weight: Any, *rest: Any) -> None:
        p = self.p
        out = rest[-1]
        extras = rest[:-1]
        self._prepare(data, weight, extras)
        cols = self.cols[0]
        taps = cols[:, :self.kk].reshape(p.groups, p.cg, p.kh, p.kw, p.oh, p.ow)
        gemm_out = out.reshape(p.n, p.groups, p.og, p.oh * p.ow)
        workers = num_threads()
        k_step = max(1, -(-p.og // max(1, min(p.og, 2 * workers))))
        for n in range(p.n):
            np.copyto(taps, self.windows[n])

            def multiply(worker: int, item: int) -> None:
                k0 = item * k_step
                k1 = min(p.og, k0 + k_step)
                np.matmul(self.w_aug[:, k0:k1], cols, out=gemm_out[n, :, k0:k1])
                self.epilogue.apply(out, n, n + 1, extras, channels=(k0, k1))
            parallel_images(-(-p.og // k_step), workers, multiply)


class Gemm1x1Conv(ConvKernel):
    """1x1, stride 1, unpadded: the data already is the column matrix, so one GEMM per image."""

    strategy = "gemm1x1"

    def __init__(self, p: ConvParams, epilogue: Epilogue, split: bool = False) -> None:
        super().__init__(p, epilogue)
        self.split = split
        if split:
            self.strategy = "gemm1x1_split"

    def __call__(self, data: Any, weight: Any, *rest: Any) -> None:
        p = self.p
        out = rest[-1]
        extras = rest[:-1]
        w = weight.reshape(p.groups, p.og, p.cg)
        x = data.reshape(p.n, p.groups, p.cg, p.h * p.w)
        y = out.reshape(p.n, p.groups, p.og, p.oh * p.ow)

        if self.split:
            self._split_images(w, x, y, out, extras)
            return

        def image(worker: int, n: int) -> None:
            np.matmul(w, x[n], out=y[n])
            self.epilogue.apply(out, n, n + 1, extras)
        parallel_images(p.n, min(num_threads(), p.n), image)

    def _split_images(self, w: Any, x: Any, y: Any, out: Any, extras: Sequence[Any]) -> None:
        """Each image's GEMM cut along its longer side (output rows or channels), two parts a
        worker: a batch smaller than the worker count still keeps every core busy. groups == 1.
        """
        p = self.p
        by_rows = p.h * p.w >= p.og
        size = p.h if by_rows else p.og
        step = max(1, -(-size // max(1, min(size, 2 * num_threads()))))
        parts = -(-size // step)

        def part(worker: int, item: int) -> None:
            n, i = divmod(item, parts)
            a, b = i * step, min(size, (i + 1) * step)
            if by_rows:
                np.matmul(w, x[n, :, :, a * p.w:b * p.w], out=y[n, :, :, a * p.w:b * p.w])
                self.epilogue.apply(out, n, n + 1, extras, rows=(a, b))
            else:
                np.matmul(w[:, a:b], x[n], out=y[n, :, a:b])
                self.epilogue.apply(out, n, n + 1, extras, channels=(a, b))
        parallel_images(p.n * parts, num_threads(), part)


class DepthwiseConv(ConvKernel):
    """groups == channels: per kernel tap, a strided window of the batch times w[c], summed.

    No GEMM at all (each output channel reads one input channel); kh*kw multiply-adds over
    whole (N, C, OH, OW) views, channel multipliers broadcast on their own axis.
    """

    strategy = "depthwise"

    def __init__(self, p: ConvParams, epilogue: Epilogue) -> None:
        super().__init__(p, epilogue)
        pt, pl, pb, pr = p.pad
        self.padded = self._alloc((p.n, p.c, p.h + pt + pb, p.w + pl + pr))
        self.interior = self.padded[:, :, pt:pt + p.h, pl:pl + p.w]
        self.tmp = self._alloc((p.n, p.c, p.og, p.oh, p.ow))
        s_n, s_c, s_h, s_w = self.padded.strides
        (sh, sw), (dh, dw) = p.strides, p.dilation
        self.taps = []
        for i in range(p.kh):
            for j in range(p.kw):
                base = self.padded[:, :, i * dh:, j * dw:]
                self.taps.append((i, j, as_strided(base, shape=(p.n, p.c, 1, p.oh, p.ow),
                                                   strides=(s_n, s_c, 0, sh * s_h, sw * s_w))))

    def __call__(self, data: Any, weight: Any, *rest: Any) -> None:
        p = self.p
        out = rest[-1]
        self.interior[...] = data
        w = weight.reshape(1, p.c, p.og, p.kh, p.kw)
        y = out.reshape(p.n, p.c, p.og, p.oh, p.ow)
        first = True
        for i, j, window in self.taps:
            if first:
                np.multiply(window, w[:, :, :, i:i + 1, j:j + 1], out=y)
                first = False
                continue
            np.multiply(window, w[:, :, :, i:i + 1, j:j + 1], out=self.tmp)
            np.add(y, self.tmp, out=y)
        self.epilogue.apply(out, 0, p.n, rest[:-1])
