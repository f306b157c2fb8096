"""Batched GEMM on OpenCL: a register-tiled kernel of our own, or CLBlast through pyclblast."""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import LibraryError
from .ops._gpu import CL_TYPES, cl_header, cl_load, cl_param, cl_pointer, cl_store, compute_type

IMPL_ENV = "GRAPH_RUNTIME_OPENCL_GEMM"
# Output tile per work-group (TSM x TSN), depth of a K step (TSK), outputs per work-item (WM x WN).
# Measured on PoCL (bench/opencl_gemm.py): 64x64x64 with 4x16 per work-item was the fastest tried.
LARGE_TILE = (64, 64, 64, 4, 16)
# Few rows (dense with a small batch): a 16-row tile wastes less work.
SMALL_TILE = (16, 64, 64, 1, 16)
# Thinner than this (rows or K), one work-item per output element beats any tile.
DIRECT_MAX_M = 4
DIRECT_MAX_K = 16


@dataclass(frozen=True)
class GemmShape:
    """C[b] = op(A[b]) @ op(B[b]) for b < batch; strides and offsets in elements.

    A is logically M x K (stored K x M when trans_a), B logically K x N (stored N x K when
    trans_b), C is M x N with row stride ldc. Operand batch index is b % x_batches, so 1 batch
    broadcasts and (N*G, G) reads a per-group weight for convolution.
    """

    m: int
    n: int
    k: int
    dtype: str
    trans_a: bool = False
    trans_b: bool = False
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    batch: int = 1
    a_batches: int = 1
    b_batches: int = 1
    a_stride: int = 0
    b_stride: int = 0
    c_stride: int = 0

    def with_defaults(self) -> "GemmShape":
        """Fill zero leading dimensions with the packed ones."""
        lda = self.lda or max(self.m if self.trans_a else self.k, 1)
        ldb = self.ldb or max(self.k if self.trans_b else self.n, 1)
        ldc = self.ldc or max(self.n, 1)
        return GemmShape(self.m, self.n, self.k, self.dtype, self.trans_a, self.trans_b, lda, ldb,
                         ldc, self.batch, self.a_batches, self.b_batches, self.a_stride,
                         self.b_stride, self.c_stride)


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
    return cl_header([dtype]) + f"""
#ifdef TRANS_A
#define A_INDEX(m, k) ((long)(k) * lda + (m))
#else
#define A_INDEX(m, k) ((long)(m) * lda + (k))
#endif
#ifdef TRANS_B
#define B_INDEX(k, n) ((long)(n) * ldb + (k))
#else
#define B_INDEX(k, n) ((long)(k) * ldb + (n))
#endif
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


def clblast_available() -> bool:
    """Whether pyclblast imports (it needs the CLBlast shared library, e.g. libclblast-dev)."""
    try:
        importlib.import_module("pyclblast")
    except ImportError:
        return False
    return True


def tiled_gemm(backend: Any, device_id: int, shape: GemmShape,
               tile: tuple[int, int, int, int, int] | None = None) -> Callable[[Any, Any, Any],
                                                                                None]:
    """run(a, b, c) computing shape's GEMM with the tiled kernel; arrays may be views."""
    s = shape.with_defaults()
    direct = tile is None and (s.m <= DIRECT_MAX_M or s.k <= DIRECT_MAX_K)
    if tile is None:
        tile = SMALL_TILE if s.m <= 16 else LARGE_TILE
    tsm, tsn, tsk, wm, wn = tile
    options = [f"-DTSM={tsm}", f"-DTSN={tsn}", f"-DTSK={tsk}", f"-DWM={wm}", f"-DWN={wn}"]
    if s.trans_a:
        options.append("-DTRANS_A")
    if s.trans_b:
        options.append("-DTRANS_B")
    import pyopencl as cl
    queue = backend.queue(device_id)
    program = backend.program(device_id, _source(s.dtype), options, name="gemm")
    knl = cl.Kernel(program, "gr_gemm_direct" if direct else "gr_gemm")
    # NOTE: a zero-size operand may have no buffer; OpenCL still wants one in every slot.
    dummy = backend.alloc(device_id, 1)
    local: tuple[int, int, int] | None = (tsn // wn, tsm // wm, 1)
    grid = ((s.n + tsn - 1) // tsn * (tsn // wn), (s.m + tsm - 1) // tsm * (tsm // wm), s.batch)
    if direct:
        local = None
        grid = (s.n, s.m, s.batch)
    i32 = np.int32
    i64 = np.int64
    if s.m == 0 or s.n == 0 or s.batch == 0:
        return _nothing

    def run(a: Any, b: Any, c: Any) -> None:
        knl(queue, grid, local, i32(s.m), i32(s.n), i32(s.k),
            _buf(a, dummy), i64(a.offset), i32(s.lda), i64(s.a_batches), i64(s.a_stride),
            _buf(b, dummy), i64(b.offset), i32(s.ldb), i64(s.b_batches), i64(s.b_stride),
            _buf(c, dummy), i64(c.offset), i32(s.ldc), i64(s.c_stride))
    return run


def clblast_gemm(backend: Any, device_id: int, shape: GemmShape) -> Callable[[Any, Any, Any],
                                                                             None]:
    """run(a, b, c) through CLBlast (pyclblast); LibraryError when it cannot serve shape."""
    s = shape.with_defaults()
    try:
        import pyclblast
    except ImportError as e:
        raise LibraryError("gemm: pyclblast is not installed (pip install pyclblast; it needs "
                           "the CLBlast library, e.g. Debian's libclblast-dev)") from e
    if s.dtype not in ("float32", "float64"):
        raise LibraryError(f"gemm: the CLBlast path takes float32 or float64, got {s.dtype}")
    if s.a_batches not in (1, s.batch) or s.b_batches not in (1, s.batch):
        raise LibraryError("gemm: the CLBlast path cannot cycle a per-group operand over batches")
    queue = backend.queue(device_id)
    itemsize = np.dtype(s.dtype).itemsize
    if s.m == 0 or s.n == 0 or s.batch == 0:
        return _nothing
    a_bs = s.a_stride if s.a_batches > 1 else 0
    b_bs = s.b_stride if s.b_batches > 1 else 0
    # NOTE: CLBlast refuses a zero C stride even for one batch.
    c_bs = s.c_stride or s.m * s.ldc

    def run(a: Any, b: Any, c: Any) -> None:
        if s.k == 0:
            # NOTE: CLBlast refuses K == 0; the product is all zeros.
            c.fill(0)
            return
        # NOTE: pyclblast uses each array's buffer but not its offset; pass it in elements.
        offsets = {"a_offset": a.offset // itemsize, "b_offset": b.offset // itemsize,
                   "c_offset": c.offset // itemsize}
        a2 = _as_matrix(a)
        b2 = _as_matrix(b)
        c2 = _as_matrix(c)
        # One routine for every batch count: each CLBlast routine costs a long first compile.
        pyclblast.gemmStridedBatched(queue, s.m, s.n, s.k, s.batch, a2, b2, c2, s.lda, s.ldb,
                                     s.ldc, a_stride=a_bs, b_stride=b_bs, c_stride=c_bs,
                                     a_transp=s.trans_a, b_transp=s.trans_b, **offsets)
    return run


def _buf(arr: Any, dummy: Any) -> Any:
    return arr.base_data if arr.base_data is not None else dummy


def _nothing(a: Any, b: Any, c: Any) -> None:
    """The GEMM of an empty output."""


def _as_matrix(arr: Any) -> Any:
    return arr.reshape(-1, 1) if arr.ndim != 2 else arr


def make_gemm(backend: Any, device_id: int, shape: GemmShape,
              impl: str | None = None) -> Callable[[Any, Any, Any], None]:
    """run(a, b, c) for shape.

    Args:
        impl: "tiled" (our kernel), "clblast", or "auto" (CLBlast when importable and able to
            serve shape, else tiled). None reads $GRAPH_RUNTIME_OPENCL_GEMM, default "tiled":
            on PoCL the tiled kernel matched or beat CLBlast (bench/opencl_gemm.py), needs no
            CLBlast compile on first use, and also serves float16 and per-group weights.
    """
    if impl is None:
        impl = os.environ.get(IMPL_ENV, "tiled")
    if impl == "tiled":
        return tiled_gemm(backend, device_id, shape)
    if impl == "clblast":
        return clblast_gemm(backend, device_id, shape)
    if impl == "auto":
        if clblast_available():
            try:
                return clblast_gemm(backend, device_id, shape)
            except LibraryError:
                pass
        return tiled_gemm(backend, device_id, shape)
    raise LibraryError(f"gemm: impl {impl!r} (${IMPL_ENV}): expected 'tiled', 'clblast' or "
                       "'auto'")
