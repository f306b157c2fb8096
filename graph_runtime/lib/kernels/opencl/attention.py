"""Multi-head attention on OpenCL: one work item per (batch, head, query row), scores in place.

Each work item reads its head's columns of q, k and v straight from the (batch, tokens, width)
arrays (no transposed copies), writes its row of scaled, masked scores into a workspace, turns
them into probabilities as NumPy's softmax does (max, exp, sum: a NaN anywhere, or a row masked
everywhere, gives a NaN row; nan_to_zero zeroes it, as the exporters' where(isnan(p), 0, p)
does) and adds p_j * v_j into its row of the output. With kv_heads below heads (grouped-query
attention) head h reads k's and v's head h / (heads / kv_heads); k and v may be (batch, kv heads,
tokens, head_dim) arrays (their strides are given).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...prepared import PreparedKernel
from ..heads import head_strides
from ..gpu_common import compute_type
from .source import ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param, cl_pointer, cl_store

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend


def attention_source(dtype: str) -> str:
    """gr_attention for dtype, computing in its compute type."""
    acc = compute_type(dtype, "opencl")
    return cl_header([dtype]) + f"""
// numpy counterpart: kernels/cpu/attention.py (matmul, scale + mask + softmax, matmul)
__kernel void gr_attention({cl_param("out", dtype, const=False)}, {cl_param("q", dtype)},
        {cl_param("k", dtype)}, {cl_param("v", dtype)}, {cl_param("mask", dtype)},
        {cl_param("s", dtype, const=False)}, long rows, long H, long Q, long K, long D,
        long wq, long kb, long kh, long kt, long vb, long vh, long vt,
        long oq, long ok, long ov, long G,
        long m0, long m1, long m2, long m3, {acc} scale, int has_mask, int nan_to_zero) {{
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("q", dtype)}
    {cl_pointer("k", dtype)}
    {cl_pointer("v", dtype)}
    {cl_pointer("mask", dtype)}
    {cl_pointer("s", dtype, const=False)}
    long r = get_global_id(0);
    if (r >= rows) return;
    long i = r % Q;
    long h = (r / Q) % H;
    long b = r / (Q * H);
    long qrow = (b * Q + i) * wq + oq + h * D;
    long kh0 = b * kb + ok + (h / G) * kh;  // the kv head this query head reads
    long vh0 = b * vb + ov + (h / G) * vh;
    long srow = r * K;
    {acc} m = -INFINITY;
    for (long j = 0; j < K; ++j) {{
        long krow = kh0 + j * kt;
        {acc} dot = 0;
        for (long d = 0; d < D; ++d)
            dot += ({acc}){cl_load("q", dtype, "qrow + d")}
                   * ({acc}){cl_load("k", dtype, "krow + d")};
        {acc} x = dot * scale;
        if (has_mask) x += {cl_load("mask", dtype, "b * m0 + h * m1 + i * m2 + j * m3")};
        s[srow + j] = x;
        if (x > m || x != x) m = x;
    }}
    {acc} sum = 0;
    for (long j = 0; j < K; ++j) {{
        {acc} e = exp(s[srow + j] - m);
        s[srow + j] = e;
        sum += e;
    }}
    // NaN sum: a NaN row (as NumPy's softmax gives); nan_to_zero makes its probabilities 0
    int zero = nan_to_zero && sum != sum;
    long orow = (b * Q + i) * H * D + h * D;
    for (long d = 0; d < D; ++d) {{
        {acc} a = 0;
        for (long j = 0; j < K; ++j) {{
            {acc} p = zero ? 0 : s[srow + j] / sum;
            a += p * ({acc}){cl_load("v", dtype, "vh0 + j * vt + d")};
        }}
        {cl_store("out", dtype, "orow + d", "a")}
    }}
}}
"""


class AttentionCl(PreparedKernel):
    """run(q, k, v, [mask,] out) on an OpenCL device; the scores live in a device workspace."""

    def __init__(self, backend: OpenCLBackend, device_id: int, batch: int, heads: int,
                 q_len: int, k_len: int, head_dim: int, offsets: tuple[int, int, int],
                 scale: float, nan_to_zero: bool, mask_shape: tuple[int, ...] | None,
                 dtype: str, shapes: tuple[tuple[int, ...], ...], kv_heads: int = 0) -> None:
        check_cl_dtypes("attention", backend, device_id, [dtype])
        self.kernel = ClKernel(backend, device_id, attention_source(dtype), "gr_attention",
                               "attention")
        acc = np.dtype(dtype)  # float32 and float64 compute in their own type
        self.rows = batch * heads * q_len
        self.scores = backend.empty(device_id, (max(self.rows * k_len, 1),), acc)
        self.no_mask = backend.empty(device_id, (1,), np.dtype(dtype))
        mask_strides = [0, 0, 0, 0]  # a broadcast axis (or no mask) reads one element
        if mask_shape is not None:
            for a in range(4):
                if mask_shape[a] != 1:
                    mask_strides[a] = int(np.prod(mask_shape[a + 1:]))
        self.has_mask = mask_shape is not None
        self.scalars = (np.int64(self.rows), np.int64(heads), np.int64(q_len),
                        np.int64(k_len), np.int64(head_dim),
                        np.int64(shapes[0][2]),  # q's width, then k's and v's strides
                        *(np.int64(s) for kv in shapes[1:] for s in head_strides(kv, head_dim)),
                        *(np.int64(o) for o in offsets),
                        np.int64(heads // (kv_heads or heads)),
                        *(np.int64(s) for s in mask_strides), acc.type(scale),
                        np.int32(self.has_mask), np.int32(nan_to_zero))

    def workspace_bytes(self) -> int:
        return int(self.scores.nbytes)

    def __call__(self, q: Any, k: Any, v: Any, *rest: Any) -> None:
        out = rest[-1]
        mask = rest[0] if self.has_mask else self.no_mask
        self.kernel.launch(self.rows, None, out, q, k, v, mask, self.scores, *self.scalars)
