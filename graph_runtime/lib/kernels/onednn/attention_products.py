"""Attention's two products on oneDNN: q kᵀ into the scores, p v into the output's head columns.

Each is one matmul primitive per block of heads over 4-D strided views of the arrays as the
graph holds them (batch, heads, tokens, head_dim): a head is columns [offset + h * head_dim, ...)
of q, k and v (or k's and v's own (batch, heads, tokens, head_dim) arrays), kᵀ is k read with
swapped strides, and the output heads are written into their
columns of out; nothing is transposed or copied. Against NumPy's matmul over the same views
(OpenBLAS per head) on Whisper-tiny's 2 heads of 200 tokens by 32: q kᵀ 26 against 30 us and
p v 22 against 28 us on one thread (docs/measurements.md). Grouped-query attention's k and v
(kv_heads heads) are 5-D, (batch, kv heads, 1, ...), which the matmul broadcasts over the
query heads of each kv head, (batch, kv heads, group, ...); blocks then hold whole groups.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..heads import head_strides
from . import abi
from . import binding as dn
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .policy import policy


def products_apply(dtype: str) -> bool:
    """Whether HeadProducts computes attention of this dtype (and the library is here)."""
    return dtype == "float32" and dn.available()


def _desc(dims: tuple[int, int, int, int], strides: tuple[int, int, int, int], group: int,
          kv: bool = False) -> MemoryDesc:
    """(batch, heads, rows, cols) with these strides; in groups of query heads, (batch, heads
    // group, group, rows, cols), and kv heads (kv) as (batch, kv heads, 1, rows, cols)."""
    if group == 1:
        return MemoryDesc.strided(dims, strides)
    (nb, nh, rows, cols), (sb, sh, sr, sc) = dims, strides
    if kv:
        return MemoryDesc.strided((nb, nh, 1, rows, cols), (sb, sh, sh, sr, sc))
    return MemoryDesc.strided((nb, nh // group, group, rows, cols), (sb, sh * group, sh, sr, sc))


class HeadProducts:
    """qk(i) and pv(i) run block i's two products; blocks are (first batch, end batch, first
    head, end head). bind() points them at a call's arrays."""

    def __init__(self, batch: int, heads: int, q_len: int, k_len: int, head_dim: int,
                 shapes: Sequence[tuple[int, ...]], offsets: tuple[int, int, int],
                 blocks: Sequence[tuple[int, int, int, int]], kv_heads: int = 0) -> None:
        self.openmp = policy().openmp
        dn.use_threads(self.openmp)
        self.dims = (batch, heads, q_len, k_len, head_dim)
        self.group = heads // (kv_heads or heads)  # query heads per kv head
        self.shapes, self.offsets = tuple(shapes), offsets
        self.blocks = list(blocks)
        self._qk: list[Primitive] = []
        self._pv: list[Primitive] = []
        # (memory, which array: q k v scores out, byte offset) to bind per call
        self._bindings: list[tuple[Memory, int, int]] = []
        self._addresses: tuple[int, ...] = ()
        self.impl = ""
        for block in self.blocks:
            self._make(block)

    def _make(self, block: tuple[int, int, int, int]) -> None:
        batch, heads, q_len, k_len, dim = self.dims
        (qb, qh, qt), (kb, kh, kt_), (vb, vh, vt) = (head_strides(shape, dim)
                                                     for shape in self.shapes)
        oq, ok, ov = self.offsets
        b0, b1, h0, h1 = block
        nb, nh, g = b1 - b0, h1 - h0, self.group
        q = _desc((nb, nh, q_len, dim), (qb, qh, qt, 1), g)
        kt = _desc((nb, nh // g, dim, k_len), (kb, kh, 1, kt_), g, kv=True)
        s = _desc((nb, nh, q_len, k_len), (heads * q_len * k_len, q_len * k_len, k_len, 1), g)
        v = _desc((nb, nh // g, k_len, dim), (vb, vh, vt, 1), g, kv=True)
        o = _desc((nb, nh, q_len, dim), (q_len * heads * dim, dim, heads * dim, 1), g)
        engine = dn.library().engine
        pd_qk = PrimitiveDesc("dnnl_matmul_primitive_desc_create", engine, q.handle, kt.handle,
                              None, s.handle, None)
        pd_pv = PrimitiveDesc("dnnl_matmul_primitive_desc_create", engine, s.handle, v.handle,
                              None, o.handle, None)
        self.impl = self.impl or f"{pd_qk.impl()}, {pd_pv.impl()}"
        mq, mk, ms, ms2, mv, mo = (Memory(d) for d in (q, kt, s, s, v, o))
        self._qk.append(Primitive(pd_qk, [(abi.ARG_SRC, mq), (abi.ARG_WEIGHTS, mk),
                                          (abi.ARG_DST, ms)]))
        self._pv.append(Primitive(pd_pv, [(abi.ARG_SRC, ms2), (abi.ARG_WEIGHTS, mv),
                                          (abi.ARG_DST, mo)]))
        kv_head = h0 // g
        scores = (b0 * heads + h0) * q_len * k_len
        self._bindings += [(mq, 0, 4 * (b0 * qb + oq + h0 * qh)),
                           (mk, 1, 4 * (b0 * kb + ok + kv_head * kh)),
                           (ms, 3, 4 * scores), (ms2, 3, 4 * scores),
                           (mv, 2, 4 * (b0 * vb + ov + kv_head * vh)),
                           (mo, 4, 4 * (b0 * q_len * heads * dim + h0 * dim))]

    def bind(self, q: Any, k: Any, v: Any, scores: Any, out: Any) -> bool:
        """Point the primitives at these arrays; False (nothing bound) unless all are
        C-contiguous float32 of the shapes made for, when the caller takes its other path."""
        batch, heads, q_len, k_len, dim = self.dims
        shapes = self.shapes + ((batch, heads, q_len, k_len), (batch, q_len, heads * dim))
        arrays = (q, k, v, scores, out)
        for array, shape in zip(arrays, shapes):
            if (array.dtype.name != "float32" or not array.flags.c_contiguous
                    or tuple(array.shape) != shape):
                return False
        addresses = tuple(a.ctypes.data for a in arrays)
        if addresses != self._addresses:
            for memory, which, offset in self._bindings:
                memory.bind_address(addresses[which] + offset)
            self._addresses = addresses
        return True

    def qk(self, index: int) -> None:
        """scores of block index = q kᵀ, on this thread (OpenMP inside in that mode)."""
        dn.use_threads(self.openmp)
        self._qk[index].run()

    def pv(self, index: int) -> None:
        dn.use_threads(self.openmp)
        self._pv[index].run()

    def qk_on_worker(self, index: int) -> None:
        """qk on a runtime worker, single-threaded there (policy.py's workers mode)."""
        dn.run_on_worker(self._qk[index])

    def pv_on_worker(self, index: int) -> None:
        dn.run_on_worker(self._pv[index])
