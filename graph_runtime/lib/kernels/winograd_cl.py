"""Winograd F(2x2,3x3) and F(4x4,3x3) conv2d on OpenCL: transform kernels around a batched GEMM.

The same algorithm as winograd.py (its matrices, its float64 weight transform): an input
transform kernel turns each a x a tile of the zero-padded input into V[xi][c][tile], a*a
GEMMs make M[xi] = U[xi] (K x C) @ V[xi] (C x tiles) for all images at once, and an output
transform kernel writes Y = A^T M A per tile straight into NCHW, cropping overhanging tiles.
U = G g G^T is made on the host in float64 and uploaded, and redone only when the weight's
InputVersion moved (a weight computed by a node: every run, through a host round trip).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..conv_params import ConvParams
from .derived import DerivesFromInputs
from .gpu import CL_TYPES, cl_header, cl_param, cl_pointer
from .opencl_args import ARRAY, BUFFER, typed_kernel
from .opencl_gemm import GemmShape, chosen_variant, make_gemm
from .opencl_gemm_cpu import blocking, blocks, packed_gemm, skewed_stride
from .winograd import MATRICES, transform_weight, winograd_applies

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

I32 = np.int32
I64 = np.int64


def _combine(row: np.ndarray, terms: list[str], suffix: str) -> str:
    """C expression sum_j row[j] * terms[j]; zero coefficients dropped, +-1 without a multiply."""
    parts = []
    for coef, term in zip(row.tolist(), terms):
        if coef == 0:
            continue
        sign = "-" if coef < 0 else "+"
        size = abs(coef)
        parts.append(f"{sign} {term}" if size == 1 else f"{sign} {size:.1f}{suffix} * {term}")
    if not parts:
        return "0"
    text = " ".join(parts)
    return text[2:] if text[0] == "+" else "-" + text[2:]


def _transform(mat: np.ndarray, src: str, dst: str, ctype: str, suffix: str) -> str:
    """Statements defining dst{i}_{j} = (mat @ src @ mat^T)[i][j] from scalars src{k}_{l}."""
    rows, cols = mat.shape
    lines = []
    for i in range(rows):
        for j in range(cols):
            terms = [f"{src}{k}_{j}" for k in range(cols)]
            lines.append(f"const {ctype} {dst}h{i}_{j} = {_combine(mat[i], terms, suffix)};")
    for i in range(rows):
        for j in range(rows):
            terms = [f"{dst}h{i}_{k}" for k in range(cols)]
            lines.append(f"const {ctype} {dst}{i}_{j} = {_combine(mat[j], terms, suffix)};")
    return "\n    ".join(lines)


def _source(dtype: str, m: int, panel: int) -> str:
    """Both transform kernels for F(m x m, 3 x 3); panel is the packed GEMM's NB (0: plain V).

    A work-item walks one row of tiles of one channel: on PoCL a few long work-items beat a
    work-item per tile (1x64x56x56, F2: 2.8 ms per tile against 0.4 per row for the input
    transform), and neighbouring input tiles share a - m columns, kept in registers.
    """
    a = m + 2
    bt, _, at = MATRICES[m]
    ctype = CL_TYPES[dtype]
    suffix = "f" if dtype == "float32" else ""
    cells = [(i, j) for i in range(a) for j in range(a)]
    if panel:
        # The packed GEMM's B panel: [xi][t / NB][c][t % NB], zeros past T (see packed_gemm).
        v_index = f"((long)(xi) * VS + ((long)(t) / {panel} * C + (c)) * {panel} + (t) % {panel})"
        pad_panel = f"""if (row == get_global_size(1) - 1)
        for (int t = T; t % {panel}; ++t)
            for (int xi = 0; xi < {a * a}; ++xi)
                v[V_INDEX(xi, c, t)] = 0;"""
    else:
        v_index = "((long)(xi) * VS + (long)(c) * T + (t))"
        pad_panel = ""

    def load(j: int, x: str) -> str:
        return "\n        ".join(f"d{i}_{j} = in{i} && {x} >= 0 && {x} < W ? src[o{i} + {x}] : 0;"
                                 for i in range(a))
    first = "\n    ".join(load(j, f"({j} - PL)") for j in range(a - m))
    fresh = "\n        ".join(load(j, f"(x0 + {j})") for j in range(a - m, a))
    shift = "\n        ".join(f"d{i}_{j} = d{i}_{j + m};" for i in range(a) for j in range(a - m))
    rows_in = "\n    ".join(f"const long o{i} = (long)(y0 + {i}) * W;\n    "
                           f"const bool in{i} = y0 + {i} >= 0 && y0 + {i} < H;" for i in range(a))
    stores_v = "\n        ".join(f"v[V_INDEX({i * a + j}, c, t)] = v{i}_{j};" for i, j in cells)
    loads_m = "\n        ".join(f"const {ctype} s{i}_{j} = src[{i * a + j} * MS + tx];"
                               for i, j in cells)
    outs = [(i, j) for i in range(m) for j in range(m)]
    inner_y = "\n            ".join(f"dst[{i} * OW + ox + {j}] = y{i}_{j};" for i, j in outs)
    edge_y = "\n            ".join(
        f"if ({i} < rows && ox + {j} < OW) dst[{i} * OW + ox + {j}] = y{i}_{j};" for i, j in outs)
    return cl_header([dtype]) + f"""
#define V_INDEX(xi, c, t) {v_index}

// numpy counterpart: winograd.py's d = padded tiles, V = B^T d B, for the tiles of one row.
__kernel void gr_wino_input(__global {ctype}* v, {cl_param("data", dtype)}, const int C,
                            const int H, const int W, const int TH, const int TW, const int T,
                            const int PT, const int PL, const long VS) {{
    const int c = get_global_id(0);
    const int row = get_global_id(1);
    {cl_pointer("data", dtype)}
    const int y0 = row % TH * {m} - PT;
    __global const {ctype}* src = data + ((long)(row / TH) * C + c) * H * W;
    {rows_in}
    {ctype} {", ".join(f"d{i}_{j}" for i, j in cells)};
    {first}
    for (int tx = 0; tx < TW; ++tx) {{
        const int x0 = tx * {m} - PL;
        const int t = row * TW + tx;
        {fresh}
        {_transform(bt, "d", "v", ctype, suffix)}
        {stores_v}
        {shift}
    }}
    {pad_panel}
}}

// numpy counterpart: winograd.py's Y = A^T M A, cropped into out[n, k] (NCHW), for one row.
__kernel void gr_wino_output({cl_param("out", dtype, const=False)},
                             __global const {ctype}* mm, const int K, const int OH,
                             const int OW, const int TH, const int TW, const int T,
                             const long MS) {{
    const int k = get_global_id(0);
    const int row = get_global_id(1);
    {cl_pointer("out", dtype, const=False)}
    const int oy = row % TH * {m};
    const int rows = min({m}, OH - oy);
    __global const {ctype}* src = mm + (long)k * T + (long)row * TW;
    __global {ctype}* dst = out + (((long)(row / TH) * K + k) * OH + oy) * OW;
    for (int tx = 0; tx < TW; ++tx) {{
        {loads_m}
        {_transform(at, "s", "y", ctype, suffix)}
        const int ox = tx * {m};
        if (rows == {m} && ox + {m} <= OW) {{
            {inner_y}
        }} else {{
            {edge_y}
        }}
    }}
}}
"""


class WinogradCl(DerivesFromInputs):
    """run(data, weight, out) for a 3x3 stride-1 conv2d by F(m x m, 3 x 3), m = 2 or 4.

    On a device whose GEMM is the packed CPU kernel the input transform writes the GEMM's B
    panel and the transformed weight is uploaded as its A panel; elsewhere V and U are plain
    arrays for make_gemm. panel (None: by the GEMM make_gemm picks) forces either.
    """

    derived = (1,)

    def __init__(self, backend: OpenCLBackend, device_id: int, p: ConvParams, m: int,
                 panel: bool | None = None) -> None:
        super().__init__()
        assert winograd_applies(p) and m in MATRICES  # conv2d_cl checks before building
        self.backend, self.device_id, self.p, self.m = backend, device_id, p, m
        a = m + 2
        self.queue = backend.queue(device_id)
        th, tw = -(-p.oh // m), -(-p.ow // m)
        tiles = p.n * th * tw
        dtype = np.dtype(p.dtype)
        # The a*a planes of V and M lie an odd number of cache lines apart (skewed_stride).
        v_plane = skewed_stride(p.c * tiles, dtype.itemsize)
        m_plane = skewed_stride(p.o * tiles, dtype.itemsize)
        shape = GemmShape(p.o, tiles, p.c, p.dtype, batch=a * a, a_batches=a * a,
                          b_batches=a * a, a_stride=p.o * p.c, b_stride=v_plane,
                          c_stride=m_plane)
        self.block = blocking(backend, device_id, p.dtype)
        if panel is None:
            panel = chosen_variant(backend, device_id, shape) == "packed"
        self.panel = panel
        nb = self.block.nb if self.panel else 0
        if self.panel:
            v_plane = skewed_stride(blocks(tiles, nb) * nb * p.c, dtype.itemsize)
        program = backend.program(device_id, _source(p.dtype, m, nb), name="conv2d winograd")
        ints = [I32] * 8
        self._input = typed_kernel(program, "gr_wino_input", [BUFFER, *ARRAY, *ints, I64])
        self._output = typed_kernel(program, "gr_wino_output", [*ARRAY, BUFFER, *ints[:6], I64])
        self.mm = backend.empty(device_id, (a * a * m_plane,), dtype)
        self.in_sizes = [p.c, p.h, p.w, th, tw, tiles, p.pad[0], p.pad[1], v_plane]
        self.out_sizes = [p.o, p.oh, p.ow, th, tw, tiles, m_plane]
        self.in_grid = (p.c, p.n * th)
        self.out_grid = (p.o, p.n * th)
        self.u: Any = None
        self.v: Any = None
        self.gemm: Callable[[Any, Any, Any], None]
        if self.panel:
            self.gemm = packed_gemm(backend, device_id, shape.with_defaults(), self._pack_v,
                                    self.block, self._pack_u, b_batch=v_plane)
        else:
            self.gemm = make_gemm(backend, device_id, shape)
            self.u = backend.empty(device_id, (a * a, p.o, p.c), dtype)
            self.v = backend.empty(device_id, (a * a * v_plane,), dtype)

    def __call__(self, data: Any, weight: Any, out: Any) -> None:
        if self.panel:
            self.gemm(weight, data, self.mm)  # packs through _pack_u and _pack_v
        else:
            if self._stale():
                self._upload(weight, self.u.base_data, transposed=False)
            self._pack_v(data, self.v.base_data)
            self.gemm(self.u, self.v, self.mm)
        self._output(self.queue, self.out_grid, None, out.base_data, out.offset,
                     self.mm.base_data, *self.out_sizes)

    def _pack_v(self, data: Any, v: Any) -> None:
        self._input(self.queue, self.in_grid, None, v, data.base_data, data.offset,
                    *self.in_sizes)

    def _pack_u(self, weight: Any, panel: Any) -> None:
        if self._stale():
            self._upload(weight, panel, transposed=True)

    def _upload(self, weight: Any, target: Any, transposed: bool) -> None:
        """U from this run's weight into target: (a*a, K, C), or the packed GEMM's A panel
        [a*a][K / MB][C][MB] with zero rows past K when transposed."""
        p = self.p
        u = transform_weight(self.backend.to_host(weight), self.m).astype(p.dtype)
        if transposed:
            mb = self.block.mb
            rows = blocks(p.o, mb) * mb
            padded = np.zeros((u.shape[0], rows, p.c), u.dtype)
            padded[:, :p.o] = u
            u = padded.reshape(u.shape[0], rows // mb, mb, p.c).transpose(0, 1, 3, 2)
        host = np.ascontiguousarray(u)
        self.backend.from_host(host, self.backend.view(target, 0, host.shape, host.dtype))
