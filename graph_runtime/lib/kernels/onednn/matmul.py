"""dense / matmul / batch_matmul on oneDNN: one matmul primitive per node, float32.

Operands are described with their real strides (a transposed operand is a strided view, no
copy). A 2-D product's right operand (dense's weight) is packed into the layout oneDNN picks
(format `any`), once and again when written; a batched right operand is read in place, since
it is usually an activation that changes every run.
"""
from __future__ import annotations

from typing import Any

from ..derived import DerivesFromInputs
from . import abi
from . import binding as dn
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .weights import PackedWeight


def matmul_applies(dtype: str, m: int, n: int, k: int) -> bool:
    """Whether OnednnMatmul computes this product (and the library is here)."""
    return dtype == "float32" and min(m, n, k) > 0 and dn.available()


def _operand(batches: int, rows: int, cols: int, transposed: bool,
             two_d: bool) -> MemoryDesc:
    """The (batches, rows, cols) operand, stored transposed as (batches, cols, rows) if asked."""
    strides = (rows * cols, 1, rows) if transposed else (rows * cols, cols, 1)
    if two_d:
        return MemoryDesc.strided((rows, cols), strides[1:])
    return MemoryDesc.strided((batches, rows, cols), strides)


class OnednnMatmul(DerivesFromInputs):
    """run(a, b, out): out[i] = op(a[i % a_batches]) @ op(b[i % b_batches]) on oneDNN."""

    uses_workers = True  # library.UsesWorkers: OpenBLAS held at one thread beside it

    def __init__(self, batch: int, m: int, n: int, k: int, trans_a: bool, trans_b: bool,
                 a_batches: int, b_batches: int) -> None:
        two_d = batch == a_batches == b_batches == 1
        self.derived = (1,) if two_d else ()
        super().__init__()
        dn.use_threads(dn.CALLER_THREADS)
        src = _operand(a_batches, m, k, trans_a, two_d)
        user_w = _operand(b_batches, k, n, trans_b, two_d)
        dst = MemoryDesc.plain((m, n) if two_d else (batch, m, n))
        w_shape = (k, n) if two_d else (b_batches, k, n)
        w_any = MemoryDesc.plain(w_shape, abi.TAG_ANY) if two_d else user_w
        pd = PrimitiveDesc("dnnl_matmul_primitive_desc_create", dn.library().engine,
                           src.handle, w_any.handle, None, dst.handle, None)
        self.impl = pd.impl()
        self.weight = PackedWeight(user_w, pd.md(abi.QUERY_WEIGHTS_MD, w_shape))
        self.src = Memory(src)
        self.dst = Memory(dst)
        self.primitive = Primitive(pd, [(abi.ARG_SRC, self.src),
                                        (abi.ARG_WEIGHTS, self.weight.memory),
                                        (abi.ARG_DST, self.dst)])

    def workspace_bytes(self) -> int:
        return self.weight.nbytes

    def __call__(self, a: Any, b: Any, out: Any) -> None:
        dn.use_threads(dn.CALLER_THREADS)
        if self.weight.direct:
            self.weight.memory.bind(b)
        elif self._stale():
            self.weight.refresh(b)
        self.src.bind(a)
        self.dst.bind(out)
        self.primitive.run()

    def __repr__(self) -> str:
        return f"OnednnMatmul({self.impl})"
