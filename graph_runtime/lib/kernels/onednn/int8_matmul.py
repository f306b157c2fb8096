"""qdense on oneDNN: an int8 matmul (u8/s8 rows, s8 weights, s32 accumulation) with the
requantization fused as int8_conv.py fuses it: per-column multiplier as the weights' runtime
scales, an f32 bias added after scaling, relu, and the zero points as runtime zero points.

The same rounding notes hold (int8_conv.py): oneDNN adds the output zero point before it rounds,
and may fuse acc * m + b into one multiply-add; each moves a result by one step only where it
lands on (or within a float32 ulp of) a half-step boundary. The weights are packed once into the
layout oneDNN picks, again when written; a large product is cut into bands of rows for the
runtime's workers, each a single-threaded primitive.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import abi
from . import binding as dn
from .int8_runs import Int8Runs
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .policy import policy
from .weights import PackedWeight

MIN_SPLIT_MACS = 16_000_000  # below this one work item (int8_conv.py's threshold and reason)


def int8_matmul_applies(x_dtype: str, w_dtype: str, m: int, n: int, k: int) -> bool:
    """Whether Int8Matmul computes this product here (library loaded, u8/s8 rows, s8 weights,
    an ISA whose int8 products are exact: binding.exact_int8; else the NumPy kernels do)."""
    if dn.onednn_mode() == "on":
        dn.library()  # GRAPH_RUNTIME_ONEDNN=on: a library that cannot load is an error
    return x_dtype in ("uint8", "int8") and w_dtype == "int8" and min(m, n, k) > 0 \
        and dn.available() and dn.exact_int8()


class Int8Matmul(Int8Runs):
    """run(x, w, m, b, out) on oneDNN: x (M, K) u8/s8, w (K, N) s8, m and b float32 (N,),
    out (M, N) u8/s8 (C-contiguous; callers pass 2-D views of their arrays)."""

    derived = (1,)

    def __init__(self, rows: int, n: int, k: int, x_dtype: str, out_dtype: str,
                 x_zero: int | None, y_zero: int, relu: bool) -> None:
        """out_dtype int32: the plain accumulator (MatMulInteger; no scales, bias or relu);
        float32: acc * x_scale * w_scale[n] + bias[n] (MatMulInteger -> Cast -> Mul -> Add);
        in both x_zero is None, read from the run's arguments (integer(), scaled())."""
        self.requantize = out_dtype not in ("int32", "float32")
        self.to_float = out_dtype == "float32"
        self.derived = (1,) if self.requantize else (2,)  # the weight's argument position
        super().__init__()
        self.openmp = policy().openmp
        dn.use_threads(self.openmp)
        self.shape = (rows, n, k)
        self.x_type = abi.DATA_TYPES[x_dtype]
        self.y_type = abi.DATA_TYPES[out_dtype]
        self.out_size = np.dtype(out_dtype).itemsize
        self.relu = relu
        zeros = ((abi.ARG_SRC, 1 if x_zero is None else x_zero), (abi.ARG_DST, y_zero))
        self.zero_arrays = {arg: np.array([z], np.int32) for arg, z in zeros if z}
        self.workers = policy().workers
        parts = 1
        if self.workers > 1 and rows * n * k >= MIN_SPLIT_MACS:
            parts = min(2 * self.workers, rows)
        step = -(-rows // parts)
        self.pieces = [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]
        pds: dict[int, PrimitiveDesc] = {}
        chosen: MemoryDesc | None = None
        for r0, r1 in self.pieces:
            if r1 - r0 not in pds:
                pds[r1 - r0] = self._pd(r1 - r0, chosen)
                if chosen is None:
                    chosen = pds[r1 - r0].md(abi.QUERY_WEIGHTS_MD, (k, n))
        assert chosen is not None
        self.impl = pds[self.pieces[0][1] - self.pieces[0][0]].impl()
        self.weight = PackedWeight(MemoryDesc.plain((k, n), dtype=abi.S8), chosen)
        self.scale_mem = Memory(MemoryDesc.plain((n,)))
        self.src_scale_mem = Memory(MemoryDesc.plain((1,)))
        self.bias_mem = Memory(MemoryDesc.plain((1, n)))
        self.zero_mems = {}
        for arg, array in self.zero_arrays.items():
            self.zero_mems[arg] = Memory(MemoryDesc.plain((1,), dtype=abi.S32))
            self.zero_mems[arg].bind(array)
        self.items = [self._item(pds[r1 - r0], r0, r1) for r0, r1 in self.pieces]
        self._arrays: tuple[Any, ...] = ()

    def _pd(self, rows: int, chosen: MemoryDesc | None) -> PrimitiveDesc:
        _, n, k = self.shape
        src = MemoryDesc.plain((rows, k), None, self.x_type)
        weights = chosen or MemoryDesc.plain((k, n), abi.TAG_ANY, abi.S8)
        bias = MemoryDesc.plain((1, n)) if self.requantize or self.to_float else None
        dst = MemoryDesc.plain((rows, n), None, self.y_type)
        attr, ops = self._quant_attr(2)  # the weights' N
        try:
            lib = dn.library()
            return PrimitiveDesc("dnnl_matmul_primitive_desc_create", lib.engine, src.handle,
                                 weights.handle, None if bias is None else bias.handle,
                                 dst.handle, attr)
        finally:
            dn.free_attr(attr, ops)

    def _item(self, pd: PrimitiveDesc, r0: int, r1: int) -> tuple[Primitive, Memory, int,
                                                                   Memory, int]:
        _, n, k = self.shape
        src = Memory(MemoryDesc.plain((r1 - r0, k), None, self.x_type))
        dst = Memory(MemoryDesc.plain((r1 - r0, n), None, self.y_type))
        args = self._item_args(src, dst)
        return Primitive(pd, args), src, r0 * k, dst, r0 * n * self.out_size

    def workspace_bytes(self) -> int:
        return self.weight.nbytes

    def _execute(self, x: Any, w: Any, out: Any) -> None:
        self._fresh_weight(w)
        if len(self._arrays) != 2 or x is not self._arrays[0] or out is not self._arrays[1]:
            base_x, base_out = x.ctypes.data, out.ctypes.data
            for _, src, src_offset, dst, dst_offset in self.items:
                src.bind_address(base_x + src_offset)
                dst.bind_address(base_out + dst_offset)
            self._arrays = (x, out)
        self._run_items()

    def __repr__(self) -> str:
        return f"Int8Matmul({self.impl})"

