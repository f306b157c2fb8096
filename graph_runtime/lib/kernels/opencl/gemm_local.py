"""GEMM kernels for OpenCL GPUs: work-group tiles staged in local memory, and a direct kernel."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..gpu_common import CL_TYPES, compute_type
from .args import ARRAY, buf, typed_kernel
from .gemm_cpu import INDEX_MACROS, trans_options
from .source import cl_header, cl_load, cl_param, cl_pointer, cl_store

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend

# Output tile per work-group (TSM x TSN), depth of a K step (TSK), outputs per work-item (WM x WN).
# Measured on PoCL (bench/opencl_gemm.py, before the CPU kernels existed): 64x64x64 with 4x16 per
# work-item was the fastest tried. Real GPUs have not been measured.
LARGE_TILE = (64, 64, 64, 4, 16)
# Few rows (dense with a small batch): a 16-row tile wastes less work.
SMALL_TILE = (16, 64, 64, 1, 16)
# Both kernels' arguments: M, N, K, then per matrix (buffer, offset), leading dimension, batch
# count (a, b) and batch stride.
ARG_TYPES = ([np.int32] * 3 + [*ARRAY, np.int32, np.int64, np.int64]
             + [*ARRAY, np.int32, np.int64, np.int64] + [*ARRAY, np.int32, np.int64])


def _source(dtype: str) -> str:
    acc = compute_type(dtype, "opencl")
    a_at = cl_load("a", dtype, "A_INDEX(m, k)")
    b_at = cl_load("b", dtype, "B_INDEX(k, n)")
    ctype = CL_TYPES[dtype]
    # Both kernels take the same arguments: sizes, then per matrix its buffer, leading dimension,
    # batch count and batch stride (a and b cycle over their batches).
    params = ", ".join(["const int M, const int N, const int K",
                        f"{cl_param('a_arr', dtype)}, const int lda, const long a_batches, "
                        "const long a_bs",
                        f"{cl_param('b_arr', dtype)}, const int ldb, const long b_batches, "
                        "const long b_bs",
                        f"{cl_param('c_arr', dtype, const=False)}, const int ldc, const long c_bs"])
    pointers = "\n    ".join([cl_pointer("a_arr", dtype), cl_pointer("b_arr", dtype),
                               cl_pointer("c_arr", dtype, const=False)])
    batch = "\n    ".join([f"__global const {ctype}* a = a_arr + (bat % a_batches) * a_bs;",
                            f"__global const {ctype}* b = b_arr + (bat % b_batches) * b_bs;",
                            f"__global {ctype}* c = c_arr + bat * c_bs;"])
    return cl_header([dtype]) + INDEX_MACROS + f"""
#define RM (TSM / WM)
#define RN (TSN / WN)
// numpy counterpart: c[b] = a[b % a_batches] @ b[b % b_batches]
__kernel __attribute__((reqd_work_group_size(RN, RM, 1)))
void gr_gemm({params})
{{
    {pointers}
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int tid = ty * RN + tx;
    const int n0 = get_group_id(0) * TSN;
    const int m0 = get_group_id(1) * TSM;
    const long bat = get_global_id(2);
    {batch}
    __local {acc} As[TSK][TSM];
    __local {acc} Bs[TSK][TSN];
    {acc} acc[WM][WN];
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j)
            acc[i][j] = 0;
    for (int k0 = 0; k0 < K; k0 += TSK) {{
        for (int i = tid; i < TSM * TSK; i += RM * RN) {{
            const int m = m0 + i / TSK;
            const int k = k0 + i % TSK;
            As[i % TSK][i / TSK] = (m < M && k < K) ? ({acc}){a_at} : ({acc})0;
        }}
        for (int i = tid; i < TSK * TSN; i += RM * RN) {{
            const int k = k0 + i / TSN;
            const int n = n0 + i % TSN;
            Bs[i / TSN][i % TSN] = (k < K && n < N) ? ({acc}){b_at} : ({acc})0;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TSK; ++kk) {{
            {acc} ar[WM];
            {acc} br[WN];
            for (int i = 0; i < WM; ++i)
                ar[i] = As[kk][ty + i * RM];
            for (int j = 0; j < WN; ++j)
                br[j] = Bs[kk][tx + j * RN];
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j)
                    acc[i][j] += ar[i] * br[j];
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    for (int i = 0; i < WM; ++i) {{
        const int m = m0 + ty + i * RM;
        for (int j = 0; j < WN; ++j) {{
            const int n = n0 + tx + j * RN;
            if (m < M && n < N) {{
                {cl_store("c", dtype, "(long)m * ldc + n", "acc[i][j]")}
            }}
        }}
    }}
}}

// One work-item per element of C, no local memory: for thin products (few rows, short K)
// where a 64-wide tile would idle most of its work-items.
__kernel void gr_gemm_direct({params})
{{
    {pointers}
    const int n = get_global_id(0);
    const int m = get_global_id(1);
    const long bat = get_global_id(2);
    if (n >= N || m >= M) return;
    {batch}
    {acc} sum = 0;
    for (int k = 0; k < K; ++k)
        sum += ({acc}){a_at} * ({acc}){b_at};
    {cl_store("c", dtype, "(long)m * ldc + n", "sum")}
}}
"""



def local_gemm(backend: OpenCLBackend, device_id: int, s: Any, direct: bool,
               tile: tuple[int, int, int, int, int] | None = None) -> Callable[[Any, Any, Any],
                                                                                None]:
    """run(a, b, c) for GemmShape s (defaults filled) with local-memory tiles, or the direct
    kernel (one work-item per output) when direct; tile is (TSM, TSN, TSK, WM, WN)."""
    if tile is None:
        tile = SMALL_TILE if s.m <= 16 else LARGE_TILE
    tsm, tsn, tsk, wm, wn = tile
    options = [f"-DTSM={tsm}", f"-DTSN={tsn}", f"-DTSK={tsk}", f"-DWM={wm}", f"-DWN={wn}",
               *trans_options(s)]
    queue = backend.queue(device_id)
    program = backend.program(device_id, _source(s.dtype), options, name="gemm")
    knl = typed_kernel(program, "gr_gemm_direct" if direct else "gr_gemm", ARG_TYPES)
    # NOTE: a zero-size operand may have no buffer; OpenCL still wants one in every slot.
    dummy = backend.alloc(device_id, 1)
    local: tuple[int, int, int] | None = (tsn // wn, tsm // wm, 1)
    grid = ((s.n + tsn - 1) // tsn * (tsn // wn), (s.m + tsm - 1) // tsm * (tsm // wm), s.batch)
    if direct:
        local = None
        grid = (s.n, s.m, s.batch)

    def run(a: Any, b: Any, c: Any) -> None:
        knl(queue, grid, local, s.m, s.n, s.k,
            buf(a, dummy), a.offset, s.lda, s.a_batches, s.a_stride,
            buf(b, dummy), b.offset, s.ldb, s.b_batches, s.b_stride,
            buf(c, dummy), c.offset, s.ldc, s.c_stride)
    return run
