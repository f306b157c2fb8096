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

import numpy as np

from ....errors import LibraryError

from ..heads import head_strides
from . import abi
from . import binding as dn
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .policy import policy

_FLOAT32 = np.dtype(np.float32)


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
                 blocks: Sequence[tuple[int, int, int, int]], kv_heads: int = 0,
                 softmax: tuple[float, tuple[int, ...] | None] | None = None) -> None:
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
        # the arrays bound last, held so that their ids cannot be reused: the same ones again
        # (every call of one site) are bound already; checking them again (their dtypes,
        # shapes and addresses) cost 15 us of T5's 150 us attention
        self._arrays: tuple[Any, ...] = ()
        self.impl = ""
        # with softmax: each block's q kᵀ scaled (and the mask added) as its post-ops, then
        # oneDNN's softmax over its scores, on the same thread or OpenMP threads, for every
        # block or none. A compiled softmax pass between the products runs on one core:
        # MobileViT's 16 heads of 256 by 256 took 0.70 ms against 0.46 on two OpenMP threads,
        # and in 8 blocks on the workers beside a busy core 2.3-2.7 against 1.9-2.2
        self._softmax: list[Primitive] = []
        self.mask_shape: tuple[int, ...] | None = None
        for block in self.blocks:
            if not self._make(block, softmax) and softmax is not None:
                # a block oneDNN would not fuse: none fused (the compiled pass scales them all)
                self._qk, self._pv, self._bindings, self._softmax = [], [], [], []
                self.mask_shape, softmax, self.impl = None, None, ""
                for again in self.blocks:
                    self._make(again)
                break

    @property
    def softmax_fused(self) -> bool:
        """Whether qk(i) leaves block i's scores scaled and masked and softmax(i) normalises
        them."""
        return bool(self._softmax)

    def _make(self, block: tuple[int, int, int, int],
              softmax: tuple[float, tuple[int, ...] | None] | None = None) -> bool:
        """Block's two products (and with softmax, its scale, mask and softmax); whether
        the softmax was fused (False where it was not asked)."""
        batch, heads, q_len, k_len, dim = self.dims
        (qb, qh, qt), (kb, kh, kt_), (vb, vh, vt) = (head_strides(shape, dim)
                                                     for shape in self.shapes)
        oq, ok, ov = self.offsets
        b0, b1, h0, h1 = block
        nb, nh, g = b1 - b0, h1 - h0, self.group
        q = _desc((nb, nh, q_len, dim), (qb, qh, qt, 1), g)
        kt = _desc((nb, nh // g, dim, k_len), (kb, kh, 1, kt_), g, kv=True)
        # a block's scores are one dense run (one batch's heads h0..h1, or every head): strides
        # of its own dims, which oneDNN's fast kernels take with a mask post-op (a block of one
        # head of four, with its batch stride over four heads, got the reference kernel)
        s = _desc((nb, nh, q_len, k_len), (nh * q_len * k_len, q_len * k_len, k_len, 1), g)
        v = _desc((nb, nh // g, k_len, dim), (vb, vh, vt, 1), g, kv=True)
        o = _desc((nb, nh, q_len, dim), (q_len * heads * dim, dim, heads * dim, 1), g)
        engine = dn.library().engine
        pd_qk = mask = None
        mask_at = 0  # the block's first mask value, in bytes
        if softmax is not None:
            mask_dims = None
            if softmax[1] is not None:  # the block's part of the mask (dims of 1 broadcast)
                mb, mh, rows, cols = softmax[1]
                mask_dims = (nb if mb > 1 else 1, nh if mh > 1 else 1, rows, cols)
                mask_at = 4 * ((b0 if mb > 1 else 0) * mh + (h0 if mh > 1 else 0)) * rows * cols
            pd_qk, mask = _scaled_qk(q, kt, s, softmax[0], mask_dims, g)
            if pd_qk is None:
                return False
        else:
            pd_qk = PrimitiveDesc("dnnl_matmul_primitive_desc_create", engine, q.handle,
                                  kt.handle, None, s.handle, None)
        pd_pv = PrimitiveDesc("dnnl_matmul_primitive_desc_create", engine, s.handle, v.handle,
                              None, o.handle, None)
        self.impl = self.impl or f"{pd_qk.impl()}, {pd_pv.impl()}"
        mq, mk, ms, ms2, mv, mo = (Memory(d) for d in (q, kt, s, s, v, o))
        kv_head = h0 // g
        scores = (b0 * heads + h0) * q_len * k_len
        qk_args = [(abi.ARG_SRC, mq), (abi.ARG_WEIGHTS, mk), (abi.ARG_DST, ms)]
        if softmax is not None:
            scale = Memory(MemoryDesc.plain((1,)))
            scale.bind(np.array([softmax[0]], np.float32))  # the memory holds the array
            qk_args.append((abi.ARG_ATTR_SCALES | abi.ARG_SRC, scale))
            if mask is not None:
                mm = Memory(mask)
                qk_args.append((abi.ARG_POST_OP_BASE | abi.ARG_SRC_1, mm))
                self._bindings.append((mm, 5, mask_at))
                self.mask_shape = softmax[1]
            plain = MemoryDesc.plain((nb, nh, q_len, k_len))
            pd_sm = PrimitiveDesc("dnnl_softmax_forward_primitive_desc_create", engine,
                                  abi.FORWARD_INFERENCE, abi.SOFTMAX_ACCURATE, plain.handle,
                                  plain.handle, 3, None)
            ms3 = Memory(plain)
            self._softmax.append(Primitive(pd_sm, [(abi.ARG_SRC, ms3), (abi.ARG_DST, ms3)]))
            self._bindings.append((ms3, 3, 4 * scores))
        self._qk.append(Primitive(pd_qk, qk_args))
        self._pv.append(Primitive(pd_pv, [(abi.ARG_SRC, ms2), (abi.ARG_WEIGHTS, mv),
                                          (abi.ARG_DST, mo)]))
        self._bindings += [(mq, 0, 4 * (b0 * qb + oq + h0 * qh)),
                           (mk, 1, 4 * (b0 * kb + ok + kv_head * kh)),
                           (ms, 3, 4 * scores), (ms2, 3, 4 * scores),
                           (mv, 2, 4 * (b0 * vb + ov + kv_head * vh)),
                           (mo, 4, 4 * (b0 * q_len * heads * dim + h0 * dim))]
        return softmax is not None

    def bind(self, q: Any, k: Any, v: Any, scores: Any, out: Any, mask: Any = None) -> bool:
        """Point the primitives at these arrays; False (nothing bound) unless all are
        C-contiguous float32 of the shapes made for (the mask too, where q kᵀ adds it), when
        the caller takes its other path."""
        batch, heads, q_len, k_len, dim = self.dims
        shapes = self.shapes + ((batch, heads, q_len, k_len), (batch, q_len, heads * dim))
        arrays: tuple[Any, ...] = (q, k, v, scores, out)
        if self.mask_shape is not None:
            shapes += (self.mask_shape,)
            arrays += (mask,)
        if len(arrays) == len(self._arrays) and all(
                a is b for a, b in zip(arrays, self._arrays)):
            return True
        for array, shape in zip(arrays, shapes):
            if (array.dtype != _FLOAT32 or not array.flags.c_contiguous
                    or tuple(array.shape) != shape):
                return False
        addresses = tuple(a.ctypes.data for a in arrays)
        if addresses != self._addresses:
            for memory, which, offset in self._bindings:
                memory.bind_address(addresses[which] + offset)
            self._addresses = addresses
        self._arrays = arrays
        return True

    def qk(self, index: int) -> None:
        """scores of block index = q kᵀ, on this thread (OpenMP inside in that mode)."""
        dn.use_threads(self.openmp)
        self._qk[index].run()

    def pv(self, index: int) -> None:
        dn.use_threads(self.openmp)
        self._pv[index].run()

    def softmax(self, index: int = 0) -> None:
        """Block index's scores q kᵀ left (scaled, masked) made softmax's, in place
        (softmax_fused), on this thread (OpenMP inside in that mode)."""
        dn.use_threads(self.openmp)
        self._softmax[index].run()

    def qk_on_worker(self, index: int) -> None:
        """qk on a runtime worker, single-threaded there (policy.py's workers mode)."""
        dn.run_on_worker(self._qk[index])

    def pv_on_worker(self, index: int) -> None:
        dn.run_on_worker(self._pv[index])

    def softmax_on_worker(self, index: int) -> None:
        dn.run_on_worker(self._softmax[index])


def _scaled_qk(q: MemoryDesc, kt: MemoryDesc, s: MemoryDesc, scale: float,
               mask_shape: tuple[int, ...] | None,
               group: int) -> tuple[PrimitiveDesc | None, MemoryDesc | None]:
    """q kᵀ with the scale (and the additive mask, a C-contiguous (batch, heads, rows, cols)
    array of mask_shape that broadcasts to the scores) as post-ops, and the mask's descriptor;
    (None, None) where oneDNN refuses them (the compiled pass then applies both)."""
    mask = None
    if mask_shape is not None:
        b, h, rows, cols = mask_shape  # 4-D: ops/attention.py refuses any other mask
        if group > 1:  # as the scores: (batch, heads // group, group, rows, cols)
            mask = MemoryDesc.strided((b, max(1, h // group), group if h > 1 else 1, rows,
                                       cols), (h * rows * cols, group * rows * cols,
                                               rows * cols, cols, 1))
        else:
            mask = MemoryDesc.plain(mask_shape)

    def build(lib: Any, ops: Any) -> None:
        if mask is not None:
            lib.call("dnnl_post_ops_append_binary", ops, abi.BINARY_ADD, mask.handle)

    attr, post_ops = dn.post_ops_attr(build)
    try:
        # the scale as q's (one value, given at run time): free in oneDNN's brgemm kernels,
        # where an eltwise post-op took q kᵀ from 0.23 to 0.50 ms in gemm:jit's
        dn.library().call("dnnl_primitive_attr_set_scales_mask", attr, abi.ARG_SRC, 0)
        pd = PrimitiveDesc("dnnl_matmul_primitive_desc_create", dn.library().engine,
                           q.handle, kt.handle, None, s.handle, attr)
    except LibraryError:
        return None, None
    finally:
        dn.free_attr(attr, post_ops)
    # oneDNN's reference code takes what its fast kernels refuse (a grouped-query mask's 5-D
    # broadcast): slower than the plain product and the compiled pass
    return (None, None) if pd.impl().startswith("ref") else (pd, mask)
