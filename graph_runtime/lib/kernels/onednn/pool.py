"""max/avg/global pools on oneDNN: one pooling primitive per node over float32 arrays, NCHW or
(kept so between oneDNN nodes: runtime/layouts.py) NHWC.

ONNX's ceil_mode overhang becomes extra end padding, which oneDNN never counts (max ignores
it, avg_exclude_padding does not divide by it); an avg pool that counts explicit padding
(count_include_pad) and has an overhang is not expressible, so stays with today's kernel.
"""
from __future__ import annotations

from typing import Any, Collection

from ...prepared import PreparedKernel
from .. import replay
from ..address import address_of
from . import abi
from . import binding as dn
from .policy import policy
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .layout import NCHW, NHWC, BandedReorder
from .weights import aligned_buffer


def pool_window(size: tuple[int, ...], kernel: tuple[int, ...], out: tuple[int, ...],
                strides: tuple[int, ...], dilation: tuple[int, ...],
                begin: tuple[int, ...]) -> tuple[int, ...]:
    """End padding per axis that gives oneDNN's output size `out` (covers any overhang)."""
    return tuple((o - 1) * s + d * (k - 1) + 1 - n - b
                 for n, k, o, s, d, b in zip(size, kernel, out, strides, dilation, begin))


def pool_applies(dtype: str, size: tuple[int, ...], kernel: tuple[int, ...],
                 out: tuple[int, ...], strides: tuple[int, ...], dilation: tuple[int, ...],
                 begin: tuple[int, ...], end: tuple[int, ...], is_max: bool,
                 count_include_pad: bool) -> bool:
    """Whether OnednnPool computes this 2-D pool exactly (and the library is here)."""
    if dtype != "float32" or len(size) != 2 or min(out) < 1 or not dn.available():
        return False
    ends = pool_window(size, kernel, out, strides, dilation, begin)
    if min(ends) < 0:
        return False  # ONNX drops a ceil_mode window oneDNN would keep; rare, keep today's
    span = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    if any(b >= s or e >= s for b, e, s in zip(begin, ends, span)):
        return False  # a window of padding only: oneDNN and NumPy disagree on what it gives
    overhang = any(e > want for e, want in zip(ends, end))
    return is_max or not (count_include_pad and overhang)


class OnednnPool(PreparedKernel):
    """run(data, out) for one NCHW float32 pool: a oneDNN pooling primitive."""

    def __init__(self, shape: tuple[int, ...], out_shape: tuple[int, ...],
                 kernel: tuple[int, ...], strides: tuple[int, ...], dilation: tuple[int, ...],
                 begin: tuple[int, ...], is_max: bool, count_include_pad: bool) -> None:
        self.openmp = policy().openmp
        dn.use_threads(self.openmp)
        end = pool_window(shape[2:], kernel, out_shape[2:], strides, dilation, begin)
        if is_max:
            alg = abi.POOLING_MAX
        elif count_include_pad:
            alg = abi.POOLING_AVG_INCLUDE_PADDING
        else:
            alg = abi.POOLING_AVG_EXCLUDE_PADDING
        self._make = (shape, out_shape, alg, strides, kernel, dilation, begin, end)
        self._build(NCHW, NCHW)
        # NOTE: NHWC is offered only where oneDNN has a JIT kernel for it (a global pool over a
        # few channels fell to its reference code).
        self._nhwc = not self._desc(NHWC, NHWC).impl().startswith("ref")

    def _desc(self, src_layout: str, dst_layout: str) -> PrimitiveDesc:
        """The primitive descriptor for data and output in these layouts (nchw or nhwc)."""
        shape, out_shape, alg, strides, kernel, dilation, begin, end = self._make
        tags = {NCHW: None, NHWC: abi.TAG_ACDB}
        src = MemoryDesc.plain(shape, tags[src_layout])
        dst = MemoryDesc.plain(out_shape, tags[dst_layout])
        return PrimitiveDesc("dnnl_pooling_forward_primitive_desc_create", dn.library().engine,
                             abi.FORWARD_INFERENCE, alg, src.handle, dst.handle,
                             dn.dims_array(strides), dn.dims_array(kernel),
                             dn.dims_array([d - 1 for d in dilation]), dn.dims_array(begin),
                             dn.dims_array(end), None)

    def _build(self, src_layout: str, dst_layout: str) -> None:
        """The primitive for data and output in these layouts; where oneDNN has no JIT kernel
        for the mixed pair, the NHWC pool with a reorder on the NCHW side."""
        shape, out_shape = self._make[:2]
        pd = self._desc(src_layout, dst_layout)
        self.before: BandedReorder | None = None
        self.after: BandedReorder | None = None
        self.buffer: Any = None
        if src_layout != dst_layout and pd.impl().startswith("ref"):
            pd = self._desc(NHWC, NHWC)
            n, c, h, w = shape if src_layout == NCHW else out_shape
            self.buffer = aligned_buffer(4 * n * c * h * w)
            whole = [(-1, 0, h)]
            if src_layout == NCHW:
                self.before = BandedReorder((n, c, h, w), NCHW, NHWC, whole)
            else:
                self.after = BandedReorder((n, c, h, w), NHWC, NCHW, whole)
        self.impl = pd.impl()
        self.src = Memory(pd.md(abi.QUERY_SRC_MD, shape))
        self.dst = Memory(pd.md(abi.QUERY_DST_MD, out_shape))
        self.primitive = Primitive(pd, [(abi.ARG_SRC, self.src), (abi.ARG_DST, self.dst)])

    def channels_last_positions(self) -> tuple[int, ...]:
        """Data and output may be NHWC arrays (where oneDNN has a JIT kernel for it)."""
        return (0, 1) if self._nhwc else ()

    def use_channels_last(self, positions: Collection[int]) -> None:
        self._build(NHWC if 0 in positions else NCHW, NHWC if 1 in positions else NCHW)

    def workspace_bytes(self) -> int:
        return 0 if self.buffer is None else int(self.buffer.nbytes)

    def __call__(self, data: Any, out: Any) -> None:
        dn.use_threads(self.openmp)
        if self.before is not None:
            self.before.bind(address_of(data), address_of(self.buffer))
            self.before.items[0].run()
            self.src.bind(self.buffer)
        else:
            self.src.bind(data)
        self.dst.bind(out if self.after is None else self.buffer)
        self.primitive.run()
        if self.after is not None:
            self.after.bind(address_of(self.buffer), address_of(out))
            self.after.items[0].run()
        if replay.active is not None and all(
                isinstance(r.items[0], dn.Primitive) for r in (self.before, self.after)
                if r is not None):
            # primitives alone (kernels/replay.py); the reorders' buffer kept by a replay
            replay.note_arrays([self.buffer])
            replay.whole_call(self)

    def uses_workers(self) -> bool:
        """OpenBLAS is held at one thread beside it (a spinning BLAS thread stalls oneDNN)."""
        return True

    def __repr__(self) -> str:
        return f"OnednnPool({self.impl})"
