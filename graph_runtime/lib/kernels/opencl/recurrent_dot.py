"""Per-step pieces of recurrence on OpenCL: the product H(t-1) @ R^T for every direction and
batch row (register-blocked with explicit vectors), and the launcher of per-step kernels."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..gpu_common import compute_type
from .source import ClKernel, cl_param, cl_pointer

# A work item's register block: ROWS batch rows x one vector of up to 16 gate columns.
ROWS = 8


def dot_source(state: str, rows: int, width: int) -> str:
    """gr_rec_dot{width}: hr[d, b, q] = sum_k rt[d, k, q] * vec[d, b, k] for q0 <= q < q0 + nq.

    A work item computes rows batch rows x width columns with explicit vectors: PoCL does not
    vectorize this loop over work items by itself (about 60x slower measured, H=256, B=8)."""
    acc = compute_type(state, "opencl")
    vt = f"{acc}{width}" if width > 1 else acc
    load = (f"vload{width}(0, w + k * gw)" if width > 1 else "w[k * gw]")
    decl = " ".join(f"{vt} a{i} = 0;" for i in range(rows))
    rows_at = " ".join(f"__global const A* v{i} = vec + (d * B + min(b0 + {i}, B - 1)) * H;"
                       for i in range(rows))
    fma = " ".join(f"a{i} += w_k * v{i}[k];" for i in range(rows))
    stores = "\n    ".join(
        f"if (b0 + {i} < B) "
        + (f"vstore{width}(a{i}, 0, out + (d * B + b0 + {i}) * gw);" if width > 1
           else f"out[(d * B + b0 + {i}) * gw] = a{i};") for i in range(rows))
    return f"""__kernel void gr_rec_dot{width}({cl_param("hr", state, const=False)},
        {cl_param("rt", state)}, {cl_param("vec", state)}, long T, long D, long B, long H,
        long gw, long q0, long nq) {{
    long g = get_global_id(0);
    long cols = nq / {width}, blocks = (B + {rows - 1}) / {rows};
    if (g >= cols * blocks * D) return;
    {cl_pointer("hr", state, const=False)}
    {cl_pointer("rt", state)}
    {cl_pointer("vec", state)}
    long q = q0 + (g % cols) * {width}, b0 = (g / cols) % blocks * {rows}, d = g / (cols * blocks);
    __global const A* w = rt + d * H * gw + q;
    __global A* out = hr + q;
    {rows_at}
    {decl}
    for (long k = 0; k < H; ++k) {{
        {vt} w_k = {load};
        {fma}
    }}
    {stores}
}}"""


def vector_width(columns: int) -> int:
    """The widest vector (16, 8, 4, 2, 1 values) that tiles columns."""
    return next(w for w in (16, 8, 4, 2, 1) if columns % w == 0)


class StepKernel:
    """A kernel launched every step, its arguments set once a run for even and for odd steps
    (they differ in the state buffers read and written): a step sets at most s, then enqueues.

    NOTE: converting and setting ~20 array arguments costs about as much as PoCL's launch
    itself; for small hidden sizes that is most of a step."""

    def __init__(self, make: Callable[[str], ClKernel], entry: str, items: int,
                 takes_step: bool) -> None:
        import pyopencl as cl
        self._enqueue = cl.enqueue_nd_range_kernel
        self.pair = (make(entry), make(entry))
        self.items = items
        self.size = (-(-items // 64) * 64,)
        self.takes_step = takes_step
        self.step_index = 0
        self.typed = [False, False]

    def bind(self, parity: int, arrays: Sequence[Any], scalars: Sequence[Any]) -> None:
        knl = self.pair[parity]
        args = [*knl.args(arrays), *scalars] + ([np.int64(0)] if self.takes_step else [])
        self.step_index = len(args) - 1
        if not self.typed[parity]:
            # NOTE: undeclared, pyopencl inspects each NumPy scalar (~18 us apiece, see source.py).
            knl.kernel.set_scalar_arg_dtypes(
                [a.dtype if isinstance(a, np.generic) else None for a in args])
            self.typed[parity] = True
        knl.kernel.set_args(*args)

    def launch(self, s: int) -> None:
        if not self.items:
            return
        knl = self.pair[s % 2]
        if self.takes_step:
            knl.kernel.set_arg(self.step_index, np.int64(s))
        self._enqueue(knl.queue, knl.kernel, self.size, None)
