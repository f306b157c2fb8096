"""topk (ONNX TopK): the k largest or smallest values along an axis and their int64 indices."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import attr_error, bool_attr, int_attr, normalize_axis
from ..kernels.gpu_common import compute_type
from ..kernels.host import host_factory
from ..kernels.opencl.source import (ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param,
                                     cl_pointer, cl_store)
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import FLOAT_DTYPES, NUMERIC_DTYPES, check_dtype, check_rank, one_input, size_of

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

TOPK_ATTRS = ("k", "axis", "largest", "sorted")


def topk_params(spec: TensorSpec, attrs: Mapping[str, Any]) -> tuple[int, int, bool]:
    """(k, normalized axis, largest), checked against the input: 0 <= k <= its axis length."""
    axis = normalize_axis("topk", int_attr("topk", attrs, "axis", -1), len(spec.shape))
    k = int_attr("topk", attrs, "k")
    length = spec.shape[axis]
    if not 0 <= k <= length:
        raise attr_error("topk", "k", k, f"0 <= k <= {length}, the length of axis {axis} of "
                                         f"input 0 {spec}")
    # sorted=0 lets ONNX return any order; the sorted order is one of them.
    bool_attr("topk", attrs, "sorted", True)
    return k, axis, bool_attr("topk", attrs, "largest", True)


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = one_input("topk", inputs)
    check_dtype("topk", spec, NUMERIC_DTYPES)
    check_rank("topk", spec, range(1, 33))
    k, axis, _ = topk_params(spec, attrs)
    shape = tuple(k if i == axis else d for i, d in enumerate(spec.shape))
    return [TensorSpec(shape, spec.dtype), TensorSpec(shape, "int64")]


# -- cpu / cuda -----------------------------------------------------------------------------------

def _host_topk(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
               outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    k, axis, largest = topk_params(inputs[0], attrs)
    last = inputs[0].shape[axis] - 1
    first_k = (slice(None),) * axis + (slice(0, k),)
    # NOTE: CuPy's argsort is always stable and refuses kind="stable"; NumPy's default is not.
    kind = "stable" if xp is np else None

    def run(x: Any, values: Any, indices: Any) -> None:
        if largest:
            # A stable ascending sort of the reversed axis, read backwards: descending values,
            # equal ones by lower index first (as ONNX asks), NaN first as the largest.
            order = xp.argsort(xp.flip(x, axis), axis=axis, kind=kind)
            order = last - xp.flip(order, axis)
        else:
            order = xp.argsort(x, axis=axis, kind=kind)
        top = order[first_k]
        xp.copyto(indices, top, casting="unsafe")
        xp.copyto(values, xp.take_along_axis(x, top, axis))
    return run


# -- opencl ---------------------------------------------------------------------------------------

# BEFORE(b, j, a, i): value b at index j sorts before a at index i (NaN counts as the largest).
_BEFORE_FLOAT = {
    True: "((b != b) ? (a == a || j < i) : (a == a && (b > a || (b == a && j < i))))",
    False: "((b != b) ? (a != a && j < i) : (a != a || b < a || (b == a && j < i)))",
}
_BEFORE_INT = {True: "(b > a || (b == a && j < i))", False: "(b < a || (b == a && j < i))"}


def _cl_source(dtype: str) -> str:
    """Each work item ranks one element of its row; ranks below k are written out."""
    acc = compute_type(dtype, "opencl")
    before = _BEFORE_FLOAT if dtype in FLOAT_DTYPES else _BEFORE_INT
    kernels = []
    for largest, entry in ((True, "gr_topk_largest"), (False, "gr_topk_smallest")):
        kernels.append(f"""
__kernel void {entry}({cl_param("values", dtype, const=False)},
                      {cl_param("indices", "int64", const=False)}, {cl_param("x", dtype)},
                      long L, long inner, long k, long n) {{
    long g = get_global_id(0);
    if (g >= n) return;
    {cl_pointer("values", dtype, const=False)}
    {cl_pointer("indices", "int64", const=False)}
    {cl_pointer("x", dtype)}
    long o = g / (L * inner);
    long i = (g / inner) % L;
    long q = g % inner;
    long base = o * L * inner + q;
    {acc} a = {cl_load("x", dtype, "base + i * inner")};
    long rank = 0;
    for (long j = 0; j < L; ++j) {{
        {acc} b = {cl_load("x", dtype, "base + j * inner")};
        if {before[largest]} {{
            if (++rank >= k) return;  // not in the top k: stop scanning
        }}
    }}
    if (rank < k) {{
        long t = (o * k + rank) * inner + q;
        {cl_store("values", dtype, "t", "a")}
        indices[t] = i;
    }}
}}
""")
    return cl_header([dtype]) + "".join(kernels)


def _cl_topk(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    check_cl_dtypes("topk", backend, device_id, [spec.dtype])
    k, axis, largest = topk_params(spec, attrs)
    entry = "gr_topk_largest" if largest else "gr_topk_smallest"
    knl = ClKernel(backend, device_id, _cl_source(spec.dtype), entry, "topk")
    n = size_of(spec.shape) if k else 0
    sizes = (np.int64(spec.shape[axis]), np.int64(size_of(spec.shape[axis + 1:])),
             np.int64(k), np.int64(n))

    def run(x: Any, values: Any, indices: Any) -> None:
        # NOTE: one work item per element counts the elements ranked before it and stops at k:
        # about k * L * log(L / k) comparisons per row on unordered data, L^2 / 2 at worst
        # (k close to L, or data already sorted the other way), with no sort network.
        knl.launch(n, None, values, indices, x, *sizes)
    return run


define_op("topk", _infer, 1, TOPK_ATTRS)
kernel("topk", "cpu")(host_factory(_host_topk))
kernel("topk", "cuda")(host_factory(_host_topk))
kernel("topk", "opencl")(_cl_topk)
