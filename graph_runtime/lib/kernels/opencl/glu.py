"""The glu op on OpenCL: one work item per output element, act(gate) * up in the compute type,
the activation as its own OpenCL kernel writes it (gpu_elementwise's expression)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ...library import TensorSpec
from ..gpu_common import compute_type
from ..gpu_elementwise import ELEMENTWISE_EXPRS
from .source import ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param, cl_pointer, cl_store

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend


def glu_source(dtype: str, activation: str, attrs: Mapping[str, Any]) -> str:
    """gr_glu for dtype: out[e] = act(x[row, gate + j]) * x[row, up + j]."""
    acc = compute_type(dtype, "opencl")
    value = ELEMENTWISE_EXPRS[activation](attrs).format("g", T=acc)
    return cl_header([dtype]) + f"""
__kernel void gr_glu({cl_param("out", dtype, const=False)}, {cl_param("x", dtype)}, long n,
        long units, long gate, long up) {{
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("x", dtype)}
    long e = get_global_id(0);
    if (e >= n) return;
    long row = e / units, j = e % units;
    {acc} g = {cl_load("x", dtype, "row * 2 * units + gate + j")};
    {acc} a = {value};
    {cl_store("out", dtype, "e", f"a * {cl_load('x', dtype, 'row * 2 * units + up + j')}")}
}}
"""


class GluCl:
    """run(x, out) on an OpenCL device, for the shapes it was made for."""

    def __init__(self, backend: OpenCLBackend, device_id: int, dtype: str, activation: str,
                 attrs: Mapping[str, Any], units: int, gate: int, up: int,
                 out: TensorSpec) -> None:
        check_cl_dtypes("glu", backend, device_id, [dtype])
        self.kernel = ClKernel(backend, device_id, glu_source(dtype, activation, attrs),
                               "gr_glu", "glu")
        self.n = int(np.prod(out.shape))
        self.scalars = (np.int64(self.n), np.int64(units), np.int64(gate), np.int64(up))

    def __call__(self, x: Any, out: Any) -> None:
        self.kernel.launch(self.n, None, out, x, *self.scalars)
