"""conv2d_transpose on oneDNN: one deconvolution primitive per node, the chain's epilogue as its
post-ops.

It is OnednnConv (conv.py) with a deconvolution primitive: made at create() for NHWC data and
output (handed NCHW, oneDNN 3.2 runs its deconvolution through an im2col GEMM, gemm:jit; on NHWC
through its direct backward-data convolutions, brgconv_strided / jit), the weight packed into
the layout oneDNN picks and repacked when written, a leading per-channel add as its bias, the
rest of the epilogue as post-ops, and the same reorders to and from NCHW (none between oneDNN
neighbours). ONNX's output_padding needs no argument: the output size given to oneDNN carries it.
Only the work split differs: whole images over the runtime's workers (workers mode, large
enough batches), never bands of rows; a batch-1 deconvolution is one primitive on the caller.
"""
from __future__ import annotations

from ...conv_params import ConvParams
from ..conv_epilogue import Epilogue
from . import abi
from .binding import MemoryDesc
from .conv import MIN_SPLIT_FLOPS, OnednnConv, conv_applies


def output_padding(p: ConvParams) -> tuple[int, int]:
    """The (height, width) output padding that made p's output size (conv2d_transpose_params)."""
    extra = []
    for out, size, k, s, d, before, after in ((p.oh, p.h, p.kh, p.strides[0], p.dilation[0],
                                               p.pad[0], p.pad[2]),
                                              (p.ow, p.w, p.kw, p.strides[1], p.dilation[1],
                                               p.pad[1], p.pad[3])):
        extra.append(out - ((size - 1) * s - before - after + d * (k - 1) + 1))
    return extra[0], extra[1]


def deconv_applies(p: ConvParams, epilogue: Epilogue) -> bool:
    """Whether OnednnDeconv computes this conv2d_transpose and epilogue (and oneDNN is here).

    oneDNN checks (out + pads - kernel span) // stride + 1 == in: output padding up to the
    stride passes by the floor; ONNX allows it up to the dilation, which oneDNN refuses.
    """
    return conv_applies(p, epilogue) and all(
        e < s for e, s in zip(output_padding(p), p.strides))


class OnednnDeconv(OnednnConv):
    """A conv2d_transpose on oneDNN over NCHW float32 arrays, NHWC inside (OnednnConv's wiring).

    The weight is ONNX's (C_in, C_out / groups, KH, KW); oneDNN's deconvolution takes weights
    (C_out, C_in, KH, KW), with groups (G, C_out / G, C_in / G, KH, KW): the op's bytes are
    oneDNN's iohw / giohw, described here by their strides.
    """

    op_name = "conv2d_transpose"
    create = "dnnl_deconvolution_forward_primitive_desc_create"
    algorithm = abi.DECONVOLUTION_DIRECT

    def _user_weight(self) -> MemoryDesc:
        p = self.p
        taps = p.kh * p.kw
        if p.groups > 1:
            return MemoryDesc.strided(self._w_shape, (p.cg * p.og * taps, taps, p.og * taps,
                                                      p.kw, 1))
        return MemoryDesc.strided(self._w_shape, (taps, p.o * taps, p.kw, 1))

    def _pieces(self) -> list[tuple[int, int, int]]:
        """Whole images for the workers where there are two or more and enough work, else
        one item: the batch on this thread (bands of a deconvolution's rows are not cut)."""
        p = self.p
        flops = 2 * p.n * p.c * p.h * p.w * p.og * p.kh * p.kw
        if self.workers > 1 and p.n > 1 and flops >= MIN_SPLIT_FLOPS:
            return [(i, 0, p.oh) for i in range(p.n)]
        return [(-1, 0, p.oh)]

    def _rows_in(self, r0: int, rows: int) -> tuple[int, int, int, int]:
        """Every input row, and the op's own top and bottom padding (items are whole images)."""
        assert r0 == 0 and rows == self.p.oh
        return 0, self.p.h, self.p.pad[0], self.p.pad[2]

    def __repr__(self) -> str:
        return f"OnednnDeconv({self.strategy}: {self.impl})"
