"""qconv2d on oneDNN: an int8 convolution (u8/s8 data, s8 weights, s32 accumulation) with its
requantization fused: per-channel multiplier as weight scales, bias, relu, zero points.

The op (lib/ops/quantized.py) computes out = saturate(rint(relu?(acc * m[o] + b[o])) + y_zero)
with acc the exact integer sum of (x - x_zero) * w. oneDNN 3.2 does the same with m as the
weights' runtime scales (DNNL_ARG_ATTR_SCALES, one per output channel), b as an f32 bias added
after scaling, x_zero and y_zero as runtime zero points (DNNL_ARG_ATTR_ZERO_POINTS), and relu as
an eltwise post-op. What rounds differently from the NumPy reference: oneDNN adds the output
zero point before it rounds half to even (the reference, as ONNX, rounds and then adds: the two
differ by one step at an exact tie with an odd zero point), and may fuse acc * m + b into one
multiply-add (one rounding instead of two, moving a result by one step only within a float32 ulp
of a tie). The same primitive gives ConvInteger's plain int32 accumulator (integer()) and its
float32 form scaled by a runtime source scale with bias (scaled(); fuse_integer.py).

Data and output are NHWC inside (oneDNN's direct int8 kernels); an NCHW argument is reordered
in or out by one oneDNN reorder, or skipped when the executor keeps the entry NHWC between
such kernels (runtime/layouts.py). Work is cut into bands of output rows for the runtime's
workers, as the float32 conv does (conv.py), each a single-threaded primitive.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ....errors import LibraryError
from ...conv_params import ConvParams
from . import abi
from . import binding as dn
from .int8_runs import Int8Runs
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .layout import bands, rows_read
from .policy import policy
from .weights import PackedWeight, aligned_buffer

MIN_SPLIT_MACS = 16_000_000  # below this one work item: about 50 us on one core, where
# handing items to the workers cost as much (BERT-tiny's 64x128x512 products: 1.1-1.8 ms in four
# items on a loaded machine, 0.1 ms in one)


def int8_conv_applies(p: ConvParams, x_dtype: str, w_dtype: str) -> bool:
    """Whether Int8Conv computes this conv here (library loaded, u8/s8 data, s8 weights, an
    ISA whose int8 products are exact: binding.exact_int8; else the NumPy kernels do, even with
    GRAPH_RUNTIME_ONEDNN=on)."""
    if dn.onednn_mode() == "on":
        dn.library()  # GRAPH_RUNTIME_ONEDNN=on: a library that cannot load is an error
    return (x_dtype in ("uint8", "int8") and w_dtype == "int8" and dn.available()
            and min(p.n, p.c, p.o, p.oh, p.ow) > 0 and dn.exact_int8())


_rows_in = rows_read  # the float32 conv's rows (layout.rows_read)


class Int8Conv(Int8Runs):
    """run(x, w, m, b, out) on oneDNN: x (N, C, H, W) u8/s8, w (O, C/g, kh, kw) s8, m and b
    float32 (O,), out (N, O, OH, OW) u8/s8."""

    derived = (1,)

    def __init__(self, p: ConvParams, x_dtype: str, out_dtype: str, x_zero: int | None,
                 y_zero: int, relu: bool) -> None:
        """out_dtype int32: the plain accumulator (ConvInteger; no scales, bias or relu);
        float32: acc * x_scale * w_scale[o] + bias[o] (ConvInteger -> Cast -> Mul -> Add);
        in both x_zero is None, read from the run's arguments (integer(), scaled())."""
        self.requantize = out_dtype not in ("int32", "float32")
        self.to_float = out_dtype == "float32"
        self.derived = (1,) if self.requantize else (2,)  # the weight's argument position
        self.out_position = 4 if self.requantize else (6 if self.to_float else 3)
        super().__init__()
        self.openmp = policy().openmp
        dn.use_threads(self.openmp)
        self.p = p
        self.x_type = abi.DATA_TYPES[x_dtype]
        self.y_type = abi.DATA_TYPES[out_dtype]
        self.out_size = np.dtype(out_dtype).itemsize
        self.relu = relu
        zeros = {abi.ARG_SRC: 1 if x_zero is None else x_zero, abi.ARG_DST: y_zero}
        self.zero_arrays = {arg: np.array([z], np.int32) for arg, z in zeros.items() if z}
        w_shape: tuple[int, ...] = (p.o, p.cg, p.kh, p.kw)
        if p.groups > 1:
            w_shape = (p.groups, p.og, p.cg, p.kh, p.kw)  # goihw: the same bytes as OIHW
        self.w_shape = w_shape
        self.workers = policy().workers
        macs = p.n * p.o * p.oh * p.ow * p.cg * p.kh * p.kw
        self.pieces = bands(p.n, p.oh, self.workers if macs >= MIN_SPLIT_MACS else 1)
        if any(_rows_in(p, r0, r1 - r0)[1] == 0 for _, r0, r1 in self.pieces):
            self.pieces = [(-1, 0, p.oh)]  # a band that reads padding only: one item
        self._pds: dict[tuple[int, ...], PrimitiveDesc] = {}
        first = self._pd(*self.pieces[0])
        chosen = first.md(abi.QUERY_WEIGHTS_MD, w_shape)
        self.impl = first.impl()
        self.weight = PackedWeight(MemoryDesc.plain(w_shape, dtype=abi.S8), chosen)
        self.scale_mem = Memory(MemoryDesc.plain((p.o,)))
        self.src_scale_mem = Memory(MemoryDesc.plain((1,)))
        self.bias_mem = Memory(MemoryDesc.plain((p.o,)))
        self.zero_mems = {arg: Memory(MemoryDesc.plain((1,), dtype=abi.S32))
                          for arg in self.zero_arrays}
        for arg, mem in self.zero_mems.items():
            mem.bind(self.zero_arrays[arg])
        self.items = [self._item(*piece) for piece in self.pieces]
        self.nhwc: frozenset[int] = frozenset()
        self._wire()

    def _pd(self, n: int, r0: int, r1: int) -> PrimitiveDesc:
        """The primitive descriptor for output rows r0..r1 of one image (n >= 0) or of all."""
        p = self.p
        _, h_in, top, bottom = _rows_in(p, r0, r1 - r0)
        batch = p.n if n < 0 else 1
        key = (batch, h_in, top, bottom, r1 - r0)
        if key in self._pds:
            return self._pds[key]
        src = MemoryDesc.plain((batch, p.c, h_in, p.w), abi.TAG_ACDB, self.x_type)
        dst = MemoryDesc.plain((batch, p.o, r1 - r0, p.ow), abi.TAG_ACDB, self.y_type)
        weights = MemoryDesc.plain(self.w_shape, abi.TAG_ANY, abi.S8)
        bias = MemoryDesc.plain((p.o,)) if self.requantize or self.to_float else None
        attr, ops = self._quant_attr(3 if p.groups > 1 else 1)  # the weights' output channels
        try:
            lib = dn.library()
            pd = PrimitiveDesc(
                "dnnl_convolution_forward_primitive_desc_create", lib.engine,
                abi.FORWARD_INFERENCE, abi.CONVOLUTION_DIRECT, src.handle, weights.handle,
                None if bias is None else bias.handle, dst.handle, dn.dims_array(p.strides),
                dn.dims_array([d - 1 for d in p.dilation]), dn.dims_array((top, p.pad[1])),
                dn.dims_array((bottom, p.pad[3])), attr)
        finally:
            dn.free_attr(attr, ops)
        self._pds[key] = pd
        return pd

    def _item(self, n: int, r0: int, r1: int) -> tuple[Primitive, Memory, int, Memory, int]:
        """A work item's primitive, and its source and destination memories with their byte
        offsets into the NHWC arrays (bound each run)."""
        p = self.p
        a_in, h_in, _, _ = _rows_in(p, r0, r1 - r0)
        batch = p.n if n < 0 else 1
        image = max(n, 0)
        src = Memory(MemoryDesc.plain((batch, p.c, h_in, p.w), abi.TAG_ACDB, self.x_type))
        dst = Memory(MemoryDesc.plain((batch, p.o, r1 - r0, p.ow), abi.TAG_ACDB, self.y_type))
        args = self._item_args(src, dst)
        src_offset = (image * p.h + a_in) * p.w * p.c
        dst_offset = (image * p.oh + r0) * p.ow * p.o * self.out_size
        return Primitive(self._pd(n, r0, r1), args), src, src_offset, dst, dst_offset

    def channels_last_positions(self) -> tuple[int, ...]:
        """The data and a requantized output may be NHWC arrays."""
        return (0, self.out_position) if self.requantize else (0,)

    def use_channels_last(self, positions: Any) -> None:
        self.nhwc = frozenset(positions)
        self._wire()

    def _wire(self) -> None:
        """NHWC buffers and whole-tensor reorders for an NCHW data or output argument."""
        p = self.p
        self._arrays: tuple[Any, ...] = ()
        self.src_buf = self.dst_buf = None
        self.reorder_in = self.reorder_out = None
        if 0 not in self.nhwc:
            self.src_buf = aligned_buffer(p.n * p.c * p.h * p.w)
            self.reorder_in = _Reorder((p.n, p.c, p.h, p.w), self.x_type, to_nhwc=True)
        if self.out_position not in self.nhwc:
            self.dst_buf = aligned_buffer(p.n * p.o * p.oh * p.ow * self.out_size)
            self.reorder_out = _Reorder((p.n, p.o, p.oh, p.ow), self.y_type, to_nhwc=False)

    def workspace_bytes(self) -> int:
        buffers = [b for b in (self.src_buf, self.dst_buf) if b is not None]
        return self.weight.nbytes + sum(int(b.nbytes) for b in buffers)

    def _execute(self, x: Any, w: Any, out: Any) -> None:
        self._fresh_weight(w)
        if len(self._arrays) != 2 or x is not self._arrays[0] or out is not self._arrays[1]:
            self._bind(x, out)
        if self.reorder_in is not None:
            self.reorder_in.run()
        self._run_items()
        if self.reorder_out is not None:
            self.reorder_out.run()

    def _bind(self, x: Any, out: Any) -> None:
        if self.reorder_in is not None:
            if not x.flags.c_contiguous:
                raise LibraryError(f"qconv2d data: expected an NCHW array, got strides "
                                      f"{x.strides} for shape {x.shape}")
            assert self.src_buf is not None
            self.reorder_in.bind(x.ctypes.data, self.src_buf.ctypes.data)
        if self.reorder_out is not None:
            assert self.dst_buf is not None
            self.reorder_out.bind(self.dst_buf.ctypes.data, out.ctypes.data)
        src = x.ctypes.data if self.src_buf is None else self.src_buf.ctypes.data
        dst = out.ctypes.data if self.dst_buf is None else self.dst_buf.ctypes.data
        for _, src_mem, src_offset, dst_mem, dst_offset in self.items:
            src_mem.bind_address(src + src_offset)
            dst_mem.bind_address(dst + dst_offset)
        self._arrays = (x, out)

    def __repr__(self) -> str:
        return f"Int8Conv({self.impl})"


class _Reorder:
    """One (N, C, H, W) tensor copied between NCHW and NHWC arrays by oneDNN."""

    def __init__(self, shape: tuple[int, int, int, int], dtype: int, to_nhwc: bool) -> None:
        nchw = MemoryDesc.plain(shape, None, dtype)
        nhwc = MemoryDesc.plain(shape, abi.TAG_ACDB, dtype)
        src, dst = (nchw, nhwc) if to_nhwc else (nhwc, nchw)
        self.src, self.dst = Memory(src), Memory(dst)
        self.primitive = Primitive(dn.reorder(src, dst),
                                   [(abi.ARG_FROM, self.src), (abi.ARG_TO, self.dst)])

    def bind(self, src: int, dst: int) -> None:
        self.src.bind_address(src)
        self.dst.bind_address(dst)

    def run(self) -> None:
        self.primitive.run()

