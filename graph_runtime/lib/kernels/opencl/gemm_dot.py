"""GEMM for OpenCL CPU devices when both operands are K-contiguous: vector dot products."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..gpu_common import CL_TYPES, compute_type
from .args import ARRAY, buf, typed_kernel
from .gemm_cpu import Blocking, Run, blocking, blocks
from .source import cl_header, cl_load, cl_param, cl_pointer, cl_store

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend

# A work-item's block: DOT_MB rows of A against DOT_NB rows of B, each a K-long dot product
# (4 x 4 measured best); a single row (GEMV) takes blocks of 1 x DOT_NB.
DOT_MB = 4
DOT_NB = 4
I32 = np.int32
I64 = np.int64
DOT_ARGS = [I32, I32, I32, *ARRAY, I32, I64, I64, *ARRAY, I32, I64, I64, *ARRAY, I32, I64]


def _source(dtype: str, vw: int) -> str:
    acc = compute_type(dtype, "opencl")
    ctype = CL_TYPES[dtype]
    vt = f"{acc}{vw}"
    load_vec = f"vload_half{vw}" if dtype == "float16" else f"vload{vw}"
    a_param = f"{cl_param('a_arr', dtype)}, const int lda, const long a_bs"
    b_param = f"{cl_param('b_arr', dtype)}, const int ldb, const long b_bs"
    c_param = f"{cl_param('c_arr', dtype, const=False)}, const int ldc, const long c_bs"
    return cl_header([dtype]) + f"""
// numpy counterpart: c[bat] = a[bat % a_batches] @ b[bat % b_batches].T with a (M, K) and
// b (N, K) both K-contiguous: vector dot products, no packing (dense with few rows).
__kernel void gr_gemm_dot(const int M, const int N, const int K, {a_param},
                          const long a_batches, {b_param}, const long b_batches, {c_param}) {{
    const int j0 = get_global_id(0) * DNB;
    const int i0 = get_global_id(1) * DMB;
    const long bat = get_global_id(2);
    {cl_pointer("a_arr", dtype)}
    {cl_pointer("b_arr", dtype)}
    {cl_pointer("c_arr", dtype, const=False)}
    __global {ctype}* c = c_arr + bat * c_bs;
    // Rows past the edge re-read the last row (in bounds); their sums are not stored.
    __global const {ctype}* pa[DMB];
    __global const {ctype}* pb[DNB];
    for (int r = 0; r < DMB; ++r)
        pa[r] = a_arr + (bat % a_batches) * a_bs + (long)min(i0 + r, M - 1) * lda;
    for (int s = 0; s < DNB; ++s)
        pb[s] = b_arr + (bat % b_batches) * b_bs + (long)min(j0 + s, N - 1) * ldb;
    {vt} acc[DMB][DNB];
    for (int r = 0; r < DMB; ++r)
        for (int s = 0; s < DNB; ++s)
            acc[r][s] = 0;
    int k0 = 0;
    for (; k0 + {vw} <= K; k0 += {vw}) {{
        {vt} av[DMB];
        {vt} bv[DNB];
        #pragma unroll
        for (int r = 0; r < DMB; ++r)
            av[r] = {load_vec}(0, pa[r] + k0);
        #pragma unroll
        for (int s = 0; s < DNB; ++s)
            bv[s] = {load_vec}(0, pb[s] + k0);
        #pragma unroll
        for (int r = 0; r < DMB; ++r)
            #pragma unroll
            for (int s = 0; s < DNB; ++s)
                acc[r][s] = fma(av[r], bv[s], acc[r][s]);
    }}
    for (int r = 0; r < DMB; ++r) {{
        for (int s = 0; s < DNB; ++s) {{
            {acc} t[{vw}];
            vstore{vw}(acc[r][s], 0, t);
            {acc} sum = 0;
            for (int e = 0; e < {vw}; ++e)
                sum += t[e];
            __global const {ctype}* a = pa[r];
            __global const {ctype}* b = pb[s];
            for (int k = k0; k < K; ++k)
                sum = fma(({acc}){cl_load("a", dtype, "k")}, ({acc}){cl_load("b", dtype, "k")},
                          sum);
            if (i0 + r < M && j0 + s < N) {{
                {cl_store("c", dtype, "(long)(i0 + r) * ldc + j0 + s", "sum")}
            }}
        }}
    }}
}}
"""


def dot_gemm(backend: OpenCLBackend, device_id: int, s: Any, block: Blocking | None = None) -> Run:
    """run(a, b, c) for s with A (M, K) and B (N, K): K-contiguous dot products, no workspace;
    block.vw is the vector width (None asks the device)."""
    blk = block or blocking(backend, device_id, s.dtype)
    queue = backend.queue(device_id)
    dmb = DOT_MB if s.m > 1 else 1
    options = [f"-DDMB={dmb}", f"-DDNB={DOT_NB}"]
    program = backend.program(device_id, _source(s.dtype, blk.vw), options, name="gemm")
    gemm = typed_kernel(program, "gr_gemm_dot", DOT_ARGS)
    grid = (blocks(s.n, DOT_NB), blocks(s.m, dmb), s.batch)
    dummy = backend.alloc(device_id, 1)

    def run(a: Any, b: Any, c: Any) -> None:
        gemm(queue, grid, (1, 1, 1), s.m, s.n, s.k,
             buf(a, dummy), a.offset, s.lda, s.a_stride, s.a_batches,
             buf(b, dummy), b.offset, s.ldb, s.b_stride, s.b_batches,
             buf(c, dummy), c.offset, s.ldc, s.c_stride)
    return run
