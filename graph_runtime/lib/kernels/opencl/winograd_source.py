"""The OpenCL C of winograd.py's three transforms, unrolled from winograd_math.py's matrices.

Each transform is straight-line code on named scalars (d0_0, d0_1, ...), so the tile stays in
registers; zero coefficients are dropped and +-1 multiplies left out.

Every a*a set of planes (U, V, M) is addressed as plane * stride + offset in plane, with the
stride a kernel argument (winograd.py pads it off multiples of 4 KiB). In "panel" layouts
U and V are the packed GEMM's A and B panels (gemm_cpu.packed_gemm), else plain
row-major matrices for make_gemm.
"""
from __future__ import annotations

import numpy as np

from ..gpu_common import CL_TYPES
from ..winograd_math import MATRICES
from .source import cl_header, cl_param, cl_pointer


def _combine(row: np.ndarray, terms: list[str], suffix: str) -> str:
    """C expression sum_j row[j] * terms[j]; zero coefficients dropped, +-1 without a multiply."""
    parts = []
    for coef, term in zip(row.tolist(), terms):
        if coef == 0:
            continue
        sign = "-" if coef < 0 else "+"
        size = abs(coef)
        parts.append(f"{sign} {term}" if size == 1 else f"{sign} {size!r}{suffix} * {term}")
    if not parts:
        return "0"
    text = " ".join(parts)
    return text[2:] if text[0] == "+" else "-" + text[2:]


def _transform(mat: np.ndarray, src: str, dst: str, ctype: str, suffix: str,
               indent: int) -> str:
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
    return _lines(lines, indent)


def _lines(lines: list[str], indent: int) -> str:
    return ("\n" + " " * indent).join(lines)


def _weight_kernel(dtype: str, m: int, mb: int) -> str:
    """gr_wino_weight: U[xi](k, c) = (G g[k, c] G^T)[i][j], xi = i * a + j; mb > 0 writes the
    A panel [xi][k / mb][c][k % mb] with zero rows past K."""
    a = m + 2
    ctype = CL_TYPES[dtype]
    suffix = "f" if dtype == "float32" else ""
    taps = [(i, j) for i in range(3) for j in range(3)]
    if mb:
        index = f"((long)(xi) * US + ((long)(k) / {mb} * C + (c)) * {mb} + (k) % {mb})"
    else:
        index = "((long)(xi) * US + (long)(k) * C + (c))"
    rows = max(mb, 1)
    loads = _lines([f"g{i}_{j} = weight[((long)k * C + c) * 9 + {i * 3 + j}];"
                    for i, j in taps], 12)
    zeros = _lines([f"g{i}_{j} = 0;" for i, j in taps], 12)
    stores = _lines([f"u[U_INDEX({i * a + j}, k, c)] = u{i}_{j};"
                     for i in range(a) for j in range(a)], 8)
    return f"""
#define U_INDEX(xi, k, c) {index}

// numpy counterpart: winograd.transform_weight (which works in float64, this in the dtype:
// measured 3e-8 of max |U| off for float32, against 1.5e-8 for rounding the float64 result).
// A work-item makes {rows} consecutive k (a run of the A panel's rows).
__kernel void gr_wino_weight(__global {ctype}* u, {cl_param("weight", dtype)}, const int K,
                             const int C, const long US) {{
    const int c = get_global_id(0);
    {cl_pointer("weight", dtype)}
    for (int k = get_global_id(1) * {rows}; k < (get_global_id(1) + 1) * {rows}; ++k) {{
        {ctype} {", ".join(f"g{i}_{j}" for i, j in taps)};
        if (k < K) {{
            {loads}
        }} else {{
            {zeros}
        }}
        {_transform(MATRICES[m][1], "g", "u", ctype, suffix, 8)}
        {stores}
    }}
}}
"""


def _input_kernel(dtype: str, m: int, nb: int) -> str:
    """gr_wino_input: V[xi][c][t] = (B^T d B)[i][j] for the input tile d of tile t, reads
    outside the image 0; nb > 0 writes the B panel [xi][t / nb][c][t % nb], zeros past T.

    A work-item walks one row of tiles of one channel: neighbouring tiles share a - m columns,
    kept in registers, which on PoCL ran nearly twice as fast as a work-item per tile
    (docs/measurements.md).
    """
    a = m + 2
    ctype = CL_TYPES[dtype]
    suffix = "f" if dtype == "float32" else ""
    cells = [(i, j) for i in range(a) for j in range(a)]
    pad_panel = ""
    if nb:
        index = f"((long)(xi) * VS + ((long)(t) / {nb} * C + (c)) * {nb} + (t) % {nb})"
        pad_panel = f"""if (row == get_global_size(1) - 1)
        for (int t = T; t % {nb}; ++t)
            for (int xi = 0; xi < {a * a}; ++xi)
                v[V_INDEX(xi, c, t)] = 0;"""
    else:
        index = "((long)(xi) * VS + (long)(c) * T + (t))"

    def load(j: int, x: str, indent: int) -> str:
        return _lines([f"d{i}_{j} = in{i} && {x} >= 0 && {x} < W ? src[o{i} + {x}] : 0;"
                       for i in range(a)], indent)
    first = _lines([load(j, f"({j} - PL)", 4) for j in range(a - m)], 4)
    fresh = _lines([load(j, f"(x0 + {j})", 8) for j in range(a - m, a)], 8)
    shift = _lines([f"d{i}_{j} = d{i}_{j + m};" for i in range(a) for j in range(a - m)], 8)
    rows_in = _lines([f"const long o{i} = (long)(y0 + {i}) * W;\n    "
                      f"const bool in{i} = y0 + {i} >= 0 && y0 + {i} < H;" for i in range(a)], 4)
    stores = _lines([f"v[V_INDEX({i * a + j}, c, t)] = v{i}_{j};" for i, j in cells], 8)
    return f"""
#define V_INDEX(xi, c, t) {index}

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
        {_transform(MATRICES[m][0], "d", "v", ctype, suffix, 8)}
        {stores}
        {shift}
    }}
    {pad_panel}
}}
"""


def _output_kernel(dtype: str, m: int) -> str:
    """gr_wino_output: Y = A^T M A per tile into NCHW, cropped; a work-item walks a tile row."""
    a = m + 2
    ctype = CL_TYPES[dtype]
    suffix = "f" if dtype == "float32" else ""
    outs = [(i, j) for i in range(m) for j in range(m)]
    loads = _lines([f"const {ctype} s{i}_{j} = src[{i * a + j} * MS + tx];"
                    for i in range(a) for j in range(a)], 8)
    inner = _lines([f"dst[{i} * OW + ox + {j}] = y{i}_{j};" for i, j in outs], 12)
    edge = _lines([f"if ({i} < rows && ox + {j} < OW) dst[{i} * OW + ox + {j}] = y{i}_{j};"
                   for i, j in outs], 12)
    return f"""
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
        {loads}
        {_transform(MATRICES[m][2], "s", "y", ctype, suffix, 8)}
        const int ox = tx * {m};
        if (rows == {m} && ox + {m} <= OW) {{
            {inner}
        }} else {{
            {edge}
        }}
    }}
}}
"""


def winograd_source(dtype: str, m: int, nb: int, mb: int) -> str:
    """The three kernels for F(m x m, 3 x 3) in dtype (float32 or float64); nb and mb are the
    packed GEMM's panel width and row block, both 0 for plain U and V."""
    return (cl_header([dtype]) + _weight_kernel(dtype, m, mb) + _input_kernel(dtype, m, nb)
            + _output_kernel(dtype, m))
