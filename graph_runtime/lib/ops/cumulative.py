"""cumsum and cumprod (ONNX CumSum, CumProd): running sums or products along an axis, optionally
exclusive and/or reversed."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import bool_attr, single_axis
from ..kernels.gpu_common import compute_type
from ..kernels.host import host_factory, wide_dtype
from ..kernels.opencl.source import (ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param,
                                     cl_pointer, cl_store)
from ..library import TensorSpec
from ..prepared import AnyShape
from ..registry import define_op, kernel
from ..shapes import NUMERIC_DTYPES, check_dtype, check_rank, one_input, size_of

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

CUMSUM_ATTRS = ("axis", "exclusive", "reverse")


def scan_params(op: str, spec: TensorSpec, attrs: Mapping[str, Any]) -> tuple[int, bool, bool]:
    """(normalized axis, exclusive, reverse); axis is required (Relay's None would flatten)."""
    return (single_axis(op, attrs, "axis", len(spec.shape)),
            bool_attr(op, attrs, "exclusive", False),
            bool_attr(op, attrs, "reverse", False))


def _scan_infer(op: str) -> Callable[[Sequence[TensorSpec], Mapping[str, Any]], list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        spec = one_input(op, inputs)
        check_dtype(op, spec, NUMERIC_DTYPES)
        check_rank(op, spec, range(1, 33))
        scan_params(op, spec, attrs)
        return [TensorSpec(tuple(spec.shape), spec.dtype)]
    return infer


def _host_scan(op: str, scan: str, identity: int) -> Callable[..., Callable[..., None]]:
    """The kernel factory of a running scan (xp.cumsum / xp.cumprod) against NumPy's API."""
    def make(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        axis, exclusive, reverse = scan_params(op, inputs[0], attrs)
        acc = wide_dtype(inputs[0].dtype)  # float16 scans in float32, as the GPU kernels do
        fn = getattr(xp, scan)
        head = (slice(None),) * axis + (slice(0, 1),)
        shifted = (slice(None),) * axis + (slice(1, None),)
        dropped = (slice(None),) * axis + (slice(0, -1),)

        def run(x: Any, out: Any) -> None:
            y = xp.flip(x, axis) if reverse else x
            total = fn(y, axis=axis, dtype=acc)
            if exclusive:
                # Each position gets the scan before it: the inclusive results moved one on.
                moved = xp.empty_like(total)
                moved[head] = identity
                moved[shifted] = total[dropped]
                total = moved
            xp.copyto(out, xp.flip(total, axis) if reverse else total, casting="unsafe")
        return AnyShape(run)  # the axis depends on the rank alone
    return make


def _cl_source(dtype: str) -> str:
    acc = compute_type(dtype, "opencl")
    return cl_header([dtype]) + f"""
// numpy counterpart: _host_scan("cumsum", ...); one work item scans one row of the axis.
__kernel void gr_cumsum({cl_param("out", dtype, const=False)}, {cl_param("x", dtype)},
                        long L, long inner, int exclusive, int reverse, long rows) {{
    long g = get_global_id(0);
    if (g >= rows) return;
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("x", dtype)}
    long base = (g / inner) * L * inner + g % inner;
    {acc} s = 0;
    for (long t = 0; t < L; ++t) {{
        long at = base + (reverse ? L - 1 - t : t) * inner;
        {acc} v = {cl_load("x", dtype, "at")};
        if (!exclusive) s += v;
        {cl_store("out", dtype, "at", "s")}
        if (exclusive) s += v;
    }}
}}
"""


def _cl_cumsum(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
               outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    check_cl_dtypes("cumsum", backend, device_id, [spec.dtype])
    axis, exclusive, reverse = scan_params("cumsum", spec, attrs)
    knl = ClKernel(backend, device_id, _cl_source(spec.dtype), "gr_cumsum", "cumsum")
    length = spec.shape[axis]
    inner = size_of(spec.shape[axis + 1:])
    rows = size_of(spec.shape) // length if length else 0
    args = (np.int64(length), np.int64(inner), np.int32(exclusive), np.int32(reverse),
            np.int64(rows))

    def run(x: Any, out: Any) -> None:
        knl.launch(rows, None, out, x, *args)
    return run


define_op("cumsum", _scan_infer("cumsum"), 1, CUMSUM_ATTRS)
kernel("cumsum", "cpu")(host_factory(_host_scan("cumsum", "cumsum", 0)))
kernel("cumsum", "cuda")(host_factory(_host_scan("cumsum", "cumsum", 0)))
kernel("cumsum", "opencl")(_cl_cumsum)
define_op("cumprod", _scan_infer("cumprod"), 1, CUMSUM_ATTRS)
kernel("cumprod", "cpu")(host_factory(_host_scan("cumprod", "cumprod", 1)))
