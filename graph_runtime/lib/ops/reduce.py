"""Reductions (sum, mean, max, min, argmax, argmin): NumPy/CuPy and a work-group OpenCL kernel."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import axis_attr, bool_attr, op_error
from ..kernels.gpu import (ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param, cl_pointer,
                           cl_store, compute_type, device_array)
from ..kernels.host import array_module, host_kernel
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import (FLOAT_DTYPES, NUMERIC_DTYPES, check_dtype, check_num_inputs,
                      contiguous_strides, size_of)

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

REDUCE_ATTRS = ("axis", "keepdims", "exclude")
ARG_ATTRS = ("axis", "keepdims", "exclude", "select_last_index")
# op -> dtypes it accepts; max/min/arg* have no identity, so they refuse zero-size reductions.
OPS = {"sum": NUMERIC_DTYPES, "mean": FLOAT_DTYPES, "max": NUMERIC_DTYPES,
       "min": NUMERIC_DTYPES, "argmax": NUMERIC_DTYPES, "argmin": NUMERIC_DTYPES}


def reduced_axes(op: str, spec: TensorSpec, attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """The axes op reduces: Relay's axis (None: all) with exclude flipping the selection."""
    ndim = len(spec.shape)
    axes = axis_attr(op, attrs, "axis", ndim)
    if axes is None:
        axes = tuple(range(ndim))
    if bool_attr(op, attrs, "exclude", False):
        axes = tuple(a for a in range(ndim) if a not in axes)
    return axes


def _infer(op: str) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        check_num_inputs(op, inputs, 1)
        spec = inputs[0]
        check_dtype(op, spec, OPS[op])
        axes = reduced_axes(op, spec, attrs)
        keepdims = bool_attr(op, attrs, "keepdims", False)
        if op.startswith("arg") and bool_attr(op, attrs, "select_last_index", False):
            raise op_error(op, "attribute 'select_last_index' = True is not supported; "
                               "the first extreme index is returned")
        shape = tuple(1 if i in axes else d for i, d in enumerate(spec.shape) if keepdims
                      or i not in axes)
        count = size_of([spec.shape[a] for a in axes])
        if count == 0 and size_of(shape) > 0 and op != "sum":
            raise op_error(op, f"cannot reduce input {spec} over axes {list(axes)}: they hold "
                               "no elements and the op has no identity value")
        dtype = "int32" if op.startswith("arg") else spec.dtype
        return [TensorSpec(shape, dtype)]
    return infer


# -- cpu / cuda ---------------------------------------------------------------------------------

def _host_factory(op: str) -> Callable[..., Callable[..., None]]:
    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        xp = array_module(backend)
        axes = reduced_axes(op, inputs[0], attrs)
        keepdims = bool_attr(op, attrs, "keepdims", False)
        if op.startswith("arg"):
            return host_kernel(backend, device_id, _host_arg(xp, op, inputs[0], axes,
                                                             tuple(outputs[0].shape)))
        fn = {"sum": xp.sum, "mean": xp.mean, "max": xp.max, "min": xp.min}[op]
        if inputs[0].dtype == "float16" and op in ("sum", "mean"):
            # NOTE: accumulate float16 in float32, as the GPU kernels do.
            def run16(x: Any, out: Any) -> None:
                xp.copyto(out, fn(x, axis=axes, keepdims=keepdims, dtype=xp.float32),
                          casting="unsafe")
            return host_kernel(backend, device_id, run16)

        def run(x: Any, out: Any) -> None:
            fn(x, axis=axes, keepdims=keepdims, out=out)
        return host_kernel(backend, device_id, run)
    return factory


def _host_arg(xp: Any, op: str, spec: TensorSpec, axes: tuple[int, ...],
              out_shape: tuple[int, ...]) -> Callable[..., None]:
    kept = tuple(d for i, d in enumerate(spec.shape) if i not in axes)
    count = size_of([spec.shape[a] for a in axes])
    fn = xp.argmax if op == "argmax" else xp.argmin

    def run(x: Any, out: Any) -> None:
        # Several axes: index into the reduced axes flattened in row-major order.
        moved = xp.moveaxis(x, axes, tuple(range(-len(axes), 0))).reshape(kept + (count,))
        xp.copyto(out, fn(moved, axis=-1).reshape(out_shape), casting="unsafe")
    return run


# -- opencl -------------------------------------------------------------------------------------

_INIT = {"sum": "0", "mean": "0", "max": "LOWEST", "min": "HIGHEST", "argmax": "LOWEST",
         "argmin": "HIGHEST"}
_LIMITS = {"float": ("-INFINITY", "INFINITY"), "double": ("-INFINITY", "INFINITY"),
           "int": ("INT_MIN", "INT_MAX"), "long": ("LONG_MIN", "LONG_MAX")}
# merge (a, ia) with candidate (b, ib) into (a, ia); NaN wins, ties keep the lower index,
# matching np.max / np.argmax.
_MERGE = {
    "sum": "a += b;",
    "mean": "a += b;",
    "max": "if (b > a || b != b) a = b;",
    "min": "if (b < a || b != b) a = b;",
    "argmax": ("if ((a == a && (b > a || b != b)) || ((b == a || (b != b && a != a)) && ib < ia))"
               " { a = b; ia = ib; }"),
    "argmin": ("if ((a == a && (b < a || b != b)) || ((b == a || (b != b && a != a)) && ib < ia))"
               " { a = b; ia = ib; }"),
}
_GROUP = 64


def _cl_source(dtype: str) -> str:
    """One program with the kernel of every reduction taking dtype (OpenCL builds are slow)."""
    kernels = [_cl_kernel(op, dtype, "int32" if op.startswith("arg") else dtype)
               for op, dtypes in OPS.items() if dtype in dtypes]
    return cl_header([dtype]) + "".join(kernels)


def _cl_kernel(op: str, dtype: str, out_dtype: str) -> str:
    acc = compute_type(dtype, "opencl")
    low, high = _LIMITS[acc]
    init = _INIT[op].replace("LOWEST", low).replace("HIGHEST", high)
    merge = _MERGE[op]
    result = "sa[0] / R" if op == "mean" else ("si[0]" if op.startswith("arg") else "sa[0]")
    return f"""
#define MERGE_{op}(a, ia, b, ib) {{ {merge} }}
__kernel void gr_reduce_{op}({cl_param("out", out_dtype, const=False)}, {cl_param("in", dtype)},
                             {cl_param("meta", "int64")}, int nk, int nr, long R) {{
    {cl_pointer("out", out_dtype, const=False)}
    {cl_pointer("in", dtype)}
    {cl_pointer("meta", "int64")}
    long o = get_group_id(0);
    int lid = get_local_id(0);
    int L = get_local_size(0);
    long rest = o;
    long base = 0;
    for (int d = nk - 1; d >= 0; --d) {{
        long c = rest % meta[d]; rest /= meta[d]; base += c * meta[nk + d];
    }}
    {acc} a = {init};
    long ia = R;
    for (long r = lid; r < R; r += L) {{
        long rr = r;
        long off = base;
        for (int d = nr - 1; d >= 0; --d) {{
            long c = rr % meta[2 * nk + d]; rr /= meta[2 * nk + d];
            off += c * meta[2 * nk + nr + d];
        }}
        {acc} b = {cl_load("in", dtype, "off")};
        long ib = r;
        MERGE_{op}(a, ia, b, ib)
    }}
    __local {acc} sa[{_GROUP}];
    __local long si[{_GROUP}];
    sa[lid] = a;
    si[lid] = ia;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {{
        if (lid < s) {{
            {acc} x = sa[lid]; long ix = si[lid];
            {acc} b = sa[lid + s]; long ib = si[lid + s];
            MERGE_{op}(x, ix, b, ib)
            sa[lid] = x; si[lid] = ix;
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    if (lid == 0) {{ {cl_store("out", out_dtype, "o", result)} }}
}}
"""


def _cl_factory(op: str) -> Callable[..., Callable[..., None]]:
    def factory(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        spec = inputs[0]
        check_cl_dtypes(op, backend, device_id, [spec.dtype])
        axes = reduced_axes(op, spec, attrs)
        strides = contiguous_strides(spec.shape)
        kept = [i for i in range(len(spec.shape)) if i not in axes]
        meta = ([spec.shape[i] for i in kept] + [strides[i] for i in kept]
                + [spec.shape[i] for i in axes] + [strides[i] for i in axes])
        count = size_of([spec.shape[a] for a in axes])
        n_out = size_of(outputs[0].shape)
        # NOTE: two fixed work-group sizes: a short reduction is one work item's loop, a long one
        # a tree over _GROUP items (PoCL compiles a kernel again for every new local size).
        group = _GROUP if count > 16 else 1
        source = _cl_source(spec.dtype)
        knl = ClKernel(backend, device_id, source, f"gr_reduce_{op}", op)
        meta_dev = device_array(backend, device_id, np.array(meta or [0], np.int64))
        nk = np.int32(len(kept))
        nr = np.int32(len(axes))

        def run(x: Any, out: Any) -> None:
            knl.launch(n_out * group, group, out, x, meta_dev, nk, nr, count)
        return run
    return factory


for _op in OPS:
    define_op(_op, _infer(_op), 1, ARG_ATTRS if _op.startswith("arg") else REDUCE_ATTRS)
    kernel(_op, "cpu")(_host_factory(_op))
    kernel(_op, "cuda")(_host_factory(_op))
    kernel(_op, "opencl")(_cl_factory(_op))
