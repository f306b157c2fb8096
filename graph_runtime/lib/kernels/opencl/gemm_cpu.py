"""GEMM for OpenCL CPU devices (PoCL): both operands packed into panels, register-blocked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..gpu_common import CL_TYPES, compute_type
from .args import ARRAY, BUFFER, buf, typed_kernel
from .source import cl_header, cl_load, cl_param, cl_pointer, cl_store

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend

# Packing copies K x 16 elements per work-item.
PACK_K = 16

Run = Callable[[Any, Any, Any], None]

# Element (m, k) of A and (k, n) of B, stored transposed when the source is built with
# trans_options(); shared with the GPU kernels of gemm_local.py.
INDEX_MACROS = """
#ifdef TRANS_A
#define A_INDEX(m, k) ((long)(k) * lda + (m))
#else
#define A_INDEX(m, k) ((long)(m) * lda + (k))
#endif
#ifdef TRANS_B
#define B_INDEX(k, n) ((long)(n) * ldb + (k))
#else
#define B_INDEX(k, n) ((long)(k) * ldb + (n))
#endif"""


@dataclass(frozen=True)
class Blocking:
    """A packed work-item's register block: mb rows x nv vectors of vw values of C.

    With AVX-512 (16 floats, 32 registers) 12 x 2 vectors keep 24 accumulators; on PoCL it was
    the steadiest of the blocks tried (docs/measurements.md). Narrower vectors (AVX2: 16
    registers) get 6 x 2.
    """

    vw: int
    mb: int = 12
    nv: int = 2

    @property
    def nb(self) -> int:
        """Columns of B per packed panel."""
        return self.vw * self.nv


def blocking(backend: OpenCLBackend, device_id: int, dtype: str) -> Blocking:
    """The device's native vector width for dtype's compute type, and a block that fits."""
    dev = backend.cl_device(device_id)
    native = dev.native_vector_width_double if dtype == "float64" else \
        dev.native_vector_width_float
    vw = native if native in (4, 8, 16) else 4
    wide = vw * (8 if dtype == "float64" else 4) >= 64
    return Blocking(vw, 12 if wide else 6, 2)


def _source(dtype: str, vw: int) -> str:
    acc = compute_type(dtype, "opencl")
    ctype = CL_TYPES[dtype]
    vt = f"{acc}{vw}"
    a_at = cl_load("a", dtype, "A_INDEX(m, k)")
    b_at = cl_load("b", dtype, "B_INDEX(k, n)")
    load16 = f"vload_half{PACK_K}" if dtype == "float16" else f"vload{PACK_K}"
    a_param = f"{cl_param('a_arr', dtype)}, const int lda, const long a_bs"
    b_param = f"{cl_param('b_arr', dtype)}, const int ldb, const long b_bs"
    c_param = f"{cl_param('c_arr', dtype, const=False)}, const int ldc, const long c_bs"
    if dtype == "float16":
        store_vec = f"{acc} t[{vw}]; vstore{vw}(v, 0, t); for (int e = 0; e < cols; ++e) " \
                    f"{{ {cl_store('c', dtype, 'at + e', 't[e]')} }}"
    else:
        store_vec = (f"if (cols == {vw}) {{ vstore{vw}(v, 0, c + at); return; }}\n"
                     f"    {acc} t[{vw}]; vstore{vw}(v, 0, t);\n"
                     f"    for (int e = 0; e < cols; ++e) c[at + e] = t[e];")
    return cl_header([dtype]) + INDEX_MACROS + f"""
#define NB (NV * {vw})

void store_row(__global {ctype}* c, long at, {vt} v, int cols) {{
    {store_vec}
}}

// ap[bat][i][k][r] = A[bat](i * MB + r, k), zero past M: the panel one packed work-item reads
// (a batch of ap is ap_bs elements).
__kernel void gr_pack_a(__global {acc}* ap, {a_param}, const int M, const int K,
                        const long ap_bs) {{
    const int k0 = get_global_id(0) * {PACK_K};
    const int i = get_global_id(1);
    const int bat = get_global_id(2);
    {cl_pointer("a_arr", dtype)}
    __global const {ctype}* a = a_arr + bat * a_bs;
    __global {acc}* dst = ap + bat * ap_bs + ((long)i * K + k0) * MB;
    const int kn = min({PACK_K}, K - k0);
    for (int r = 0; r < MB; ++r) {{
        const int m = i * MB + r;
        for (int e = 0; e < kn; ++e) {{
            const int k = k0 + e;
            dst[e * MB + r] = m < M ? ({acc}){a_at} : ({acc})0;
        }}
    }}
}}

// bp[bat][j][k][s] = B[bat](k, j * NB + s), zero past N; a batch of bp is bp_bs elements.
__kernel void gr_pack_b(__global {acc}* bp, {b_param}, const int N, const int K,
                        const long bp_bs) {{
    const int k0 = get_global_id(0) * {PACK_K};
    const int j = get_global_id(1);
    const int bat = get_global_id(2);
    {cl_pointer("b_arr", dtype)}
    __global const {ctype}* b = b_arr + bat * b_bs;
    __global {acc}* dst = bp + bat * bp_bs + ((long)j * K + k0) * NB;
    const int kn = min({PACK_K}, K - k0);
#ifdef TRANS_B
    // B's rows are K-contiguous: load 16 k of one row as a vector, scatter it down the panel.
    for (int s = 0; s < NB; ++s) {{
        const int n = j * NB + s;
        {acc} t[{PACK_K}];
        if (n < N && kn == {PACK_K}) {{
            vstore{PACK_K}({load16}(0, b + B_INDEX(k0, n)), 0, t);
        }} else {{
            for (int e = 0; e < kn; ++e) {{
                const int k = k0 + e;
                t[e] = n < N ? ({acc}){b_at} : ({acc})0;
            }}
        }}
        for (int e = 0; e < kn; ++e)
            dst[e * NB + s] = t[e];
    }}
#else
    for (int e = 0; e < kn; ++e) {{
        const int k = k0 + e;
        for (int s = 0; s < NB; ++s) {{
            const int n = j * NB + s;
            dst[e * NB + s] = n < N ? ({acc}){b_at} : ({acc})0;
        }}
    }}
#endif
}}

// numpy counterpart: c[bat] = a[bat % a_batches] @ b[bat % b_batches] from packed panels; each
// work-item owns an MB x NB block of C in private vectors (outer products, one k at a time).
__kernel void gr_gemm_packed(const int M, const int N, const int K,
                             __global const {acc}* ap, const long a_batches, const long ap_bs,
                             __global const {acc}* bp, const long b_batches, const long bp_bs,
                             {c_param}) {{
    // Row blocks vary fastest, so consecutive work-groups share one B panel (it stays in L2).
    const int i = get_global_id(0);
    const int j = get_global_id(1);
    const long bat = get_global_id(2);
    {cl_pointer("c_arr", dtype, const=False)}
    __global {ctype}* c = c_arr + bat * c_bs;
    __global const {acc}* pa = ap + (bat % a_batches) * ap_bs + (long)i * K * MB;
    __global const {acc}* pb = bp + (bat % b_batches) * bp_bs + (long)j * K * NB;
    {vt} acc[MB][NV];
    for (int r = 0; r < MB; ++r)
        for (int v = 0; v < NV; ++v)
            acc[r][v] = 0;
    for (int k = 0; k < K; ++k) {{
        {vt} bv[NV];
        #pragma unroll
        for (int v = 0; v < NV; ++v)
            bv[v] = vload{vw}(k * NV + v, pb);
        #pragma unroll
        for (int r = 0; r < MB; ++r) {{
            const {vt} av = ({vt})(pa[k * MB + r]);
            #pragma unroll
            for (int v = 0; v < NV; ++v)
                acc[r][v] = fma(av, bv[v], acc[r][v]);
        }}
    }}
    for (int r = 0; r < MB; ++r) {{
        const int m = i * MB + r;
        for (int v = 0; v < NV; ++v) {{
            const int n = j * NB + v * {vw};
            if (m < M && n < N)
                store_row(c, (long)m * ldc + n, acc[r][v], min({vw}, N - n));
        }}
    }}
}}

"""


I32 = np.int32
I64 = np.int64
PACK_ARGS = [BUFFER, *ARRAY, I32, I64, I32, I32, I64]
GEMM_ARGS = [I32, I32, I32, BUFFER, I64, I64, BUFFER, I64, I64, *ARRAY, I32, I64]


def trans_options(s: Any) -> list[str]:
    """The build options selecting INDEX_MACROS' layouts for GemmShape s."""
    options: list[str] = []
    if s.trans_a:
        options.append("-DTRANS_A")
    if s.trans_b:
        options.append("-DTRANS_B")
    return options


def blocks(size: int, block: int) -> int:
    return max((size + block - 1) // block, 1)


def skewed_stride(elements: int, itemsize: int) -> int:
    """elements rounded up so that the byte stride is an odd number of 64-byte lines.

    Streams that many such strides apart fall into distinct L1 sets. At a multiple of 4 KiB
    they share one set and evict each other: Winograd's input transform, writing 16 planes on
    PoCL, ran several times slower at the packed stride than one line off it
    (docs/measurements.md).
    """
    line = 64 // itemsize
    lines = -(-elements // line)
    return (lines + 1 - lines % 2) * line


def packed_gemm(backend: OpenCLBackend, device_id: int, s: Any,
                pack_b: Callable[[Any, Any], None] | None = None,
                block: Blocking | None = None,
                pack_a: Callable[[Any, Any], None] | None = None, a_batch: int = 0,
                b_batch: int = 0) -> Run:
    """run(a, b, c) for GemmShape s (defaults filled): pack both operands, then register blocks.

    The panels are workspace allocated here, once; packing reads each operand once per call,
    which is O(MK + KN) against the O(MNK) product and makes every kernel load contiguous.

    Args:
        pack_b: pack_b(b, panel) fills B's panel, laid out [b_batches][N / NB][K][NB] in the
            compute type with zeros past N, batches b_batch elements apart, from run's b
            argument (conv2d's im2col writes it directly); None packs b as the matrix s
            describes.
        pack_a: pack_a(a, panel) fills A's panel, laid out [a_batches][M / MB][K][MB] in the
            compute type with zeros past M (MB from block, which the caller then passes),
            batches a_batch elements apart, from run's a argument; the panel keeps its
            contents between calls, so an A that rarely changes (Winograd's transformed weight) is packed only then. None packs a as the
            matrix s describes.
        block: the register block; None asks the device (blocking()).
        a_batch, b_batch: elements from one batch of A's (B's) panel to the next, at least
            (and by default) M / MB * K * MB (N / NB * K * NB): a pack_a (pack_b) writing every
            batch at once pads it (skewed_stride).
    """
    blk = block or blocking(backend, device_id, s.dtype)
    queue = backend.queue(device_id)
    options = [f"-DMB={blk.mb}", f"-DNV={blk.nv}", *trans_options(s)]
    program = backend.program(device_id, _source(s.dtype, blk.vw), options, name="gemm")
    pack_a_kernel = typed_kernel(program, "gr_pack_a", PACK_ARGS)
    pack_b_kernel = typed_kernel(program, "gr_pack_b", PACK_ARGS)
    gemm = typed_kernel(program, "gr_gemm_packed", GEMM_ARGS)
    nb = blk.nb
    m_blocks = blocks(s.m, blk.mb)
    n_blocks = blocks(s.n, nb)
    k_chunks = blocks(s.k, PACK_K)
    itemsize = np.dtype(np.float64 if s.dtype == "float64" else np.float32).itemsize
    a_batch = max(a_batch, m_blocks * blk.mb * s.k)
    a_panel = backend.alloc(device_id, s.a_batches * a_batch * itemsize)
    b_batch = max(b_batch, n_blocks * nb * s.k)
    b_panel = backend.alloc(device_id, s.b_batches * b_batch * itemsize)
    dummy = backend.alloc(device_id, 1)
    one = (1, 1, 1)

    def run(a: Any, b: Any, c: Any) -> None:
        if s.k > 0:
            if pack_a is None:
                pack_a_kernel(queue, (k_chunks, m_blocks, s.a_batches), None, a_panel,
                              buf(a, dummy), a.offset, s.lda, s.a_stride, s.m, s.k, a_batch)
            else:
                pack_a(a, a_panel)
            if pack_b is None:
                pack_b_kernel(queue, (k_chunks, n_blocks, s.b_batches), None, b_panel,
                              buf(b, dummy), b.offset, s.ldb, s.b_stride, s.n, s.k, b_batch)
            else:
                pack_b(b, b_panel)
        gemm(queue, (m_blocks, n_blocks, s.batch), one, s.m, s.n, s.k, a_panel, s.a_batches,
             a_batch, b_panel, s.b_batches, b_batch, buf(c, dummy), c.offset, s.ldc,
             s.c_stride)
    return run
