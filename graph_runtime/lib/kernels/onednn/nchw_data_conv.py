"""A first conv reading NCHW data itself: oneDNN's JIT kernel for few input channels.

A conv whose data arrives NCHW (a graph input) runs, as OnednnConv makes it, an NCHW -> NHWC
reorder and then the NHWC kernel. For few input channels oneDNN has a direct JIT kernel that
reads NCHW and writes channel-blocked output (nChw16c; nChw8c without AVX-512), which for one
block of output channels holds the same bytes as NHWC: the cnn example's 3->16 conv at batch 32
took 292 us this way against 360 for the reorder and the NHWC conv (same process, load 1.5).
Taken only where oneDNN picks a JIT kernel for it and the output's bytes are checked, once at
create(), to be NHWC's exactly.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ....errors import LibraryError
from ..address import address_of
from . import abi
from . import binding as dn
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .weights import PackedWeight

MAX_PROBE = 1 << 24  # distinct float32 integers: the byte check needs one value per element


class NchwDataConv:
    """The conv, NCHW data in, NHWC bytes out, one primitive per work item (the whole batch,
    or whole images for the runtime's workers); or None from make()."""

    def __init__(self, pd: PrimitiveDesc, conv: Any, batch: int) -> None:
        p = conv.p
        self.impl = pd.impl()
        self.weight = PackedWeight(MemoryDesc.plain((p.o, p.c, p.kh, p.kw)),
                                   pd.md(abi.QUERY_WEIGHTS_MD, (p.o, p.c, p.kh, p.kw)))
        dst_md = pd.md(abi.QUERY_DST_MD, (batch, p.o, p.oh, p.ow))
        # (primitive, src memory, its byte offset, dst memory, its byte offset) per item
        self.items: list[tuple[Primitive, Memory, int, Memory, int]] = []
        for image, _, _ in conv.pieces:
            first = max(image, 0)
            src = Memory(MemoryDesc.plain((batch, p.c, p.h, p.w)))
            dst = Memory(dst_md)
            args = [(abi.ARG_SRC, src), (abi.ARG_WEIGHTS, self.weight.memory),
                    (abi.ARG_DST, dst)]
            if conv.bias_mem is not None:
                args.append((abi.ARG_BIAS, conv.bias_mem))
            self.items.append((Primitive(pd, args), src, 4 * first * p.c * p.h * p.w,
                               dst, 4 * first * p.o * p.oh * p.ow))
        # the conv's last silu, where it leaves that to a pass over each item's rows
        self.silu_bands = conv.silu_after_items(conv.pieces)
        self.work: list[tuple[Any, ...]] = [(item[0],) + tuple(self.silu_bands[i:i + 1])
                                            for i, item in enumerate(self.items)]
        self._bound: tuple[int, int] = (0, 0)
        self._arrays: tuple[Any, Any] = (None, None)  # the data and out bound last

    @staticmethod
    def make(conv: Any) -> NchwDataConv | None:
        """For an OnednnConv with NCHW data, NHWC output, work items of whole images, no
        groups and no residual or binary add: the primitives, where oneDNN has a JIT kernel
        for them."""
        p = conv.p
        whole = all(r0 == 0 and r1 == p.oh for _, r0, r1 in conv.pieces)
        batch = p.n if conv.pieces[0][0] < 0 else 1
        # first-conv kernels read fewer channels than one block (16 with AVX-512, 8 with
        # AVX2), and more than one block of output channels is never NHWC's order
        block = dn.channel_block()
        if (p.groups != 1 or p.c >= block or p.o > block
                or conv.residual is not None or conv.adds
                or not whole or batch * p.o * p.oh * p.ow > MAX_PROBE):
            return None
        src = MemoryDesc.plain((batch, p.c, p.h, p.w))
        dst = MemoryDesc.plain((batch, p.o, p.oh, p.ow), abi.TAG_ANY)
        weights = MemoryDesc.plain((p.o, p.c, p.kh, p.kw), abi.TAG_ANY)
        attr, post_ops = dn.post_ops_attr(conv.append_post_ops)
        try:
            pd = PrimitiveDesc(
                conv.create, dn.library().engine, abi.FORWARD_INFERENCE, conv.algorithm,
                src.handle, weights.handle,
                None if conv.bias_mem is None else conv.bias_mem.desc.handle, dst.handle,
                dn.dims_array(p.strides), dn.dims_array([d - 1 for d in p.dilation]),
                dn.dims_array(p.pad[:2]), dn.dims_array(p.pad[2:]), attr)
        except LibraryError:
            return None
        finally:
            dn.free_attr(attr, post_ops)
        if pd.impl().startswith("ref") or not _nhwc_bytes(pd.md(abi.QUERY_DST_MD, (
                batch, p.o, p.oh, p.ow))):
            return None
        return NchwDataConv(pd, conv, batch)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes

    def bind(self, data: Any, weight: Any, refresh: bool, out: Any) -> None:
        """Point the items at data and out (the NCHW view of NHWC bytes) and the weight;
        refresh: the weight was written."""
        if self.weight.direct:
            self.weight.memory.bind(weight)
        elif refresh:
            self.weight.refresh(weight)
        if data is self._arrays[0] and out is self._arrays[1]:
            return  # bound already (held: their ids cannot be reused)
        self._arrays = (data, out)
        addresses = (address_of(data), address_of(out))
        if addresses != self._bound:
            for _, src, src_offset, dst, dst_offset in self.items:
                src.bind_address(addresses[0] + src_offset)
                dst.bind_address(addresses[1] + dst_offset)
            for band, item in zip(self.silu_bands, self.items):
                band.bind_address(addresses[1] + item[4])
            self._bound = addresses


def _nhwc_bytes(chosen: MemoryDesc) -> bool:
    """Whether a layout oneDNN chose puts every element where NHWC does: reordered into NHWC,
    distinct values (0, 1, 2, ...) must come out in the same places they went in."""
    shape = chosen.shape
    count = int(np.prod(shape))
    if chosen.size() != 4 * count:
        return False  # padded channel blocks
    nhwc = MemoryDesc.plain(shape, abi.TAG_ACDB)
    probe = np.arange(count, dtype=np.float32)
    out = np.empty_like(probe)
    src, dst = Memory(chosen), Memory(nhwc)
    src.bind(probe)
    dst.bind(out)
    Primitive(dn.reorder(chosen, nhwc), [(abi.ARG_FROM, src), (abi.ARG_TO, dst)]).run()
    return bool(np.array_equal(probe, out))
