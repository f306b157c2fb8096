"""dense / matmul / batch_matmul on oneDNN: one matmul primitive per node, float32.

Operands are described with their real strides (a transposed operand is a strided view, no
copy). A 2-D product's right operand (dense's weight) is packed into the layout oneDNN picks
(format `any`), once and again when written; a batched right operand is read in place, since
it is usually an activation that changes every run.
"""
from __future__ import annotations

from typing import Any

from ..cpu.threads import parallel_images
from ..derived import DerivesFromInputs
from . import abi
from . import binding as dn
from .policy import policy
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .weights import PackedWeight

MIN_SPLIT_FLOPS = 4_000_000  # below this one work item (conv.py's threshold, same reason)


def matmul_applies(dtype: str, batch: int, m: int, n: int, k: int) -> bool:
    """Whether OnednnMatmul computes this product (and the library is here)."""
    return dtype == "float32" and min(batch, m, n, k) > 0 and dn.available()


def _operand(batches: int, rows: int, cols: int, transposed: bool,
             two_d: bool) -> MemoryDesc:
    """The (batches, rows, cols) operand, stored transposed as (batches, cols, rows) if asked."""
    strides = (rows * cols, 1, rows) if transposed else (rows * cols, cols, 1)
    if two_d:
        return MemoryDesc.strided((rows, cols), strides[1:])
    return MemoryDesc.strided((batches, rows, cols), strides)


class OnednnMatmul(DerivesFromInputs):
    """run(a, b, out): out[i] = op(a[i % a_batches]) @ op(b[i % b_batches]) on oneDNN.

    A large product is cut into work items for the runtime's workers (as a conv's bands):
    blocks of output rows of a 2-D product (sharing its packed weight), or of the batch.
    """

    def __init__(self, batch: int, m: int, n: int, k: int, trans_a: bool, trans_b: bool,
                 a_batches: int, b_batches: int) -> None:
        two_d = batch == a_batches == b_batches == 1
        self.derived = (1,) if two_d else ()
        super().__init__()
        threads = policy()
        self.openmp = threads.openmp
        dn.use_threads(self.openmp)
        self.shape = (batch, m, n, k, trans_a, trans_b, a_batches, b_batches)
        self.two_d = two_d
        self.workers = threads.workers
        w_shape = (k, n) if two_d else (b_batches, k, n)
        pieces = self._pieces()
        pds = {}
        chosen: MemoryDesc | None = None
        for piece in pieces:
            geometry = (piece[1] - piece[0], piece[3] - piece[2])
            if geometry not in pds:
                pds[geometry] = self._pd(piece, chosen)
                if chosen is None:
                    chosen = pds[geometry].md(abi.QUERY_WEIGHTS_MD, w_shape)
        assert chosen is not None
        self.impl = pds[(pieces[0][1] - pieces[0][0], pieces[0][3] - pieces[0][2])].impl()
        user_w = _operand(b_batches, k, n, trans_b, two_d)
        # a batched right operand is read in place by each item (its own memory, not this one)
        self.weight = PackedWeight(user_w, chosen if two_d else user_w)
        self.items: list[tuple[Primitive, list[tuple[Memory, int, int]]]] = []
        for piece in pieces:
            pd = pds[(piece[1] - piece[0], piece[3] - piece[2])]
            self.items.append(self._item(pd, piece))
        self._arrays: tuple[Any, ...] = ()

    def _pieces(self) -> list[tuple[int, int, int, int]]:
        """(first batch, end batch, first row, end row) work items."""
        batch, m, n, k = self.shape[:4]
        parts = 1
        if self.workers > 1 and 2 * batch * m * n * k >= MIN_SPLIT_FLOPS:
            parts = min(2 * self.workers, m if self.two_d else batch)
        if self.two_d:
            step = -(-m // parts)
            return [(0, 1, r0, min(m, r0 + step)) for r0 in range(0, m, step)]
        step = -(-batch // parts)
        return [(b0, min(batch, b0 + step), 0, m) for b0 in range(0, batch, step)]

    def _descs(self, piece: tuple[int, int, int, int]) -> tuple[MemoryDesc, ...]:
        """(src, user weights, dst) descriptors of one work item."""
        _, _, n, k, trans_a, trans_b, a_batches, b_batches = self.shape
        m = self.shape[1]
        b0, b1, r0, r1 = piece
        rows = r1 - r0
        if self.two_d:
            strides = (1, m) if trans_a else (k, 1)
            return (MemoryDesc.strided((rows, k), strides), _operand(1, k, n, trans_b, True),
                    MemoryDesc.plain((rows, n)))
        count = b1 - b0
        return (_operand(count if a_batches > 1 else 1, m, k, trans_a, False),
                _operand(count if b_batches > 1 else 1, k, n, trans_b, False),
                MemoryDesc.plain((count, m, n)))

    def _pd(self, piece: tuple[int, int, int, int], chosen: MemoryDesc | None) -> PrimitiveDesc:
        src, user_w, dst = self._descs(piece)
        weights = user_w
        if self.two_d:
            weights = chosen or MemoryDesc.plain(user_w.shape, abi.TAG_ANY)
        return PrimitiveDesc("dnnl_matmul_primitive_desc_create", dn.library().engine,
                             src.handle, weights.handle, None, dst.handle, None)

    def _item(self, pd: PrimitiveDesc, piece: tuple[int, int, int, int]
              ) -> tuple[Primitive, list[tuple[Memory, int, int]]]:
        """The item's primitive and its (memory, operand 0-2, byte offset) to bind each run."""
        _, m, n, k, trans_a, _, a_batches, b_batches = self.shape
        b0, _, r0, _ = piece
        src_desc, w_desc, dst_desc = self._descs(piece)
        src, dst = Memory(src_desc), Memory(dst_desc)
        if self.two_d:
            bindings = [(src, 0, 4 * (r0 if trans_a else r0 * k)), (dst, 2, 4 * r0 * n)]
            weights = self.weight.memory
        else:
            weights = Memory(w_desc)
            bindings = [(src, 0, 4 * b0 * m * k if a_batches > 1 else 0),
                        (weights, 1, 4 * b0 * k * n if b_batches > 1 else 0),
                        (dst, 2, 4 * b0 * m * n)]
        primitive = Primitive(pd, [(abi.ARG_SRC, src), (abi.ARG_WEIGHTS, weights),
                                   (abi.ARG_DST, dst)])
        return primitive, bindings

    def workspace_bytes(self) -> int:
        return self.weight.nbytes

    def uses_workers(self) -> bool:
        """Its work items go to the runtime's workers (OpenBLAS held at one thread beside it)."""
        return True

    def __call__(self, a: Any, b: Any, out: Any) -> None:
        dn.use_threads(self.openmp)
        if self.two_d:
            if self.weight.direct:
                self.weight.memory.bind(b)
            elif self._stale():
                self.weight.refresh(b)
        arrays = (a, b, out)
        if len(self._arrays) != 3 or any(x is not y for x, y in zip(arrays, self._arrays)):
            bases = [x.ctypes.data for x in arrays]
            for _, bindings in self.items:
                for memory, which, offset in bindings:
                    memory.bind_address(bases[which] + offset)
            self._arrays = arrays
        items = self.items
        if len(items) == 1:
            items[0][0].run()
            return
        parallel_images(len(items), self.workers, lambda worker, i: _run(items[i][0]))

    def __repr__(self) -> str:
        return f"OnednnMatmul({self.impl})"


def _run(primitive: Primitive) -> None:
    """One work item on a runtime worker, oneDNN single-threaded there."""
    dn.use_threads(1)
    primitive.run()
