"""max/avg/global pools on oneDNN: one pooling primitive per node over NCHW float32 arrays.

ONNX's ceil_mode overhang becomes extra end padding, which oneDNN never counts (max ignores
it, avg_exclude_padding does not divide by it); an avg pool that counts explicit padding
(count_include_pad) and has an overhang is not expressible, so stays with today's kernel.
"""
from __future__ import annotations

from typing import Any

from ...prepared import PreparedKernel
from . import abi
from . import binding as dn
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc


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
        dn.use_threads(dn.CALLER_THREADS)
        end = pool_window(shape[2:], kernel, out_shape[2:], strides, dilation, begin)
        if is_max:
            alg = abi.POOLING_MAX
        elif count_include_pad:
            alg = abi.POOLING_AVG_INCLUDE_PADDING
        else:
            alg = abi.POOLING_AVG_EXCLUDE_PADDING
        src = MemoryDesc.plain(shape)
        dst = MemoryDesc.plain(out_shape)
        pd = PrimitiveDesc("dnnl_pooling_forward_primitive_desc_create", dn.library().engine,
                           abi.FORWARD_INFERENCE, alg, src.handle, dst.handle, dn.dims_array(strides),
                           dn.dims_array(kernel), dn.dims_array([d - 1 for d in dilation]),
                           dn.dims_array(begin), dn.dims_array(end), None)
        self.impl = pd.impl()
        self.src = Memory(src)
        self.dst = Memory(dst)
        self.primitive = Primitive(pd, [(abi.ARG_SRC, self.src), (abi.ARG_DST, self.dst)])

    def __call__(self, data: Any, out: Any) -> None:
        dn.use_threads(dn.CALLER_THREADS)
        self.src.bind(data)
        self.dst.bind(out)
        self.primitive.run()

    def uses_workers(self) -> bool:
        """OpenBLAS is held at one thread beside it (a spinning BLAS thread stalls oneDNN)."""
        return True

    def __repr__(self) -> str:
        return f"OnednnPool({self.impl})"
