"""Reductions (sum, mean, max, min, arg*, prod, l1, l2, log_sum_exp ...): NumPy/CuPy and OpenCL."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import axis_attr, bool_attr, op_error
from ..kernels.gpu_common import compute_type, device_array
from ..kernels.host import array_module, host_kernel
from ..kernels.opencl.source import (ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param,
                                     cl_pointer, cl_store)
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import (FLOAT_DTYPES, NUMERIC_DTYPES, check_dtype, check_num_inputs,
                      contiguous_strides, size_of)

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

REDUCE_ATTRS = ("axis", "keepdims", "exclude")
ARG_ATTRS = ("axis", "keepdims", "exclude", "select_last_index")
# op -> dtypes it accepts; max/min/arg* have no identity, so they refuse zero-size reductions.
# prod ... log_sum_exp are ONNX's ReduceProd, ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum,
# ReduceLogSumExp.
OPS = {"sum": NUMERIC_DTYPES, "mean": FLOAT_DTYPES, "max": NUMERIC_DTYPES,
       "min": NUMERIC_DTYPES, "argmax": NUMERIC_DTYPES, "argmin": NUMERIC_DTYPES,
       "prod": NUMERIC_DTYPES, "sum_square": NUMERIC_DTYPES, "l1": NUMERIC_DTYPES,
       "l2": FLOAT_DTYPES, "log_sum": FLOAT_DTYPES, "log_sum_exp": FLOAT_DTYPES}
# Reductions with a value for zero elements (0, 1, or log(0) = -inf).
WITH_IDENTITY = ("sum", "prod", "sum_square", "l1", "l2", "log_sum", "log_sum_exp")


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
        if count == 0 and size_of(shape) > 0 and op not in WITH_IDENTITY:
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
        if op in _HOST_COMPOSED:
            return host_kernel(backend, device_id, _host_composed(xp, op, inputs[0], axes,
                                                                  keepdims))
        fn = {"sum": xp.sum, "mean": xp.mean, "max": xp.max, "min": xp.min}[op]
        if inputs[0].dtype == "float16" and op in ("sum", "mean"):
            # NOTE: accumulate float16 in float32, as the GPU kernels do.
            def run16(x: Any, out: Any) -> None:
                xp.copyto(out, fn(x, axis=axes, keepdims=keepdims, dtype=xp.float32),
                          casting="unsafe")
            return host_kernel(backend, device_id, run16)

        if op == "min" and backend.name == "cuda":
            # NOTE: CuPy 14's min(out=...) hands `out` to CUB's dtype check and fails (a
            # TypeError); its result copied into out costs one small copy.
            def run_min(x: Any, out: Any) -> None:
                xp.copyto(out, fn(x, axis=axes, keepdims=keepdims))
            return host_kernel(backend, device_id, run_min)

        def run(x: Any, out: Any) -> None:
            fn(x, axis=axes, keepdims=keepdims, out=out)
        return host_kernel(backend, device_id, run)
    return factory


def _log_sum_exp(xp: Any, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    if x.size == 0:
        return xp.log(xp.sum(x, axis=axes, keepdims=keepdims))  # log(0) = -inf
    # NOTE: exp(x - max) never overflows; an infinite or NaN max is not subtracted (inf - inf).
    top = xp.max(x, axis=axes, keepdims=True)
    top = xp.where(xp.isfinite(top), top, 0)
    total = xp.sum(xp.exp(x - top), axis=axes, keepdims=True)
    result = xp.log(total) + top
    return result if keepdims else xp.squeeze(result, axis=axes)


def _sum_square(xp: Any, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    """Sum of squares over axes. NumPy's einsum takes it in one pass with no squared copy:
    ConvNeXt-v2's global response norm, 3136 x 160 reduced over the rows, 316 against 101 us
    (sum(x * x) made the square, then summed it along strided rows)."""
    if xp is not np or x.ndim > 32:
        return xp.sum(x * x, axis=axes, keepdims=keepdims)
    every = list(range(x.ndim))
    kept = [a for a in every if a not in axes]
    result = np.einsum(x, every, x, every, kept)
    return result.reshape([1 if a in axes else d for a, d in enumerate(x.shape)]) \
        if keepdims else result


# op -> fn(xp, x, axes, keepdims) -> reduced array (x already in the accumulation dtype).
_HOST_COMPOSED: dict[str, Callable[[Any, Any, tuple[int, ...], bool], Any]] = {
    "prod": lambda xp, x, axes, keep: xp.prod(x, axis=axes, keepdims=keep),
    "sum_square": _sum_square,
    "l1": lambda xp, x, axes, keep: xp.sum(xp.abs(x), axis=axes, keepdims=keep),
    "l2": lambda xp, x, axes, keep: xp.sqrt(_sum_square(xp, x, axes, keep)),
    "log_sum": lambda xp, x, axes, keep: xp.log(xp.sum(x, axis=axes, keepdims=keep)),
    "log_sum_exp": _log_sum_exp,
}


def _host_composed(xp: Any, op: str, spec: TensorSpec, axes: tuple[int, ...],
                   keepdims: bool) -> Callable[..., None]:
    fn = _HOST_COMPOSED[op]
    # float16 accumulates in float32, as the GPU kernels do.
    wide = xp.float32 if spec.dtype == "float16" else None

    def run(x: Any, out: Any) -> None:
        # NOTE: log(0) = -inf is the answer for an empty or zero sum, not a warning.
        with np.errstate(divide="ignore"):
            result = fn(xp, x if wide is None else x.astype(wide), axes, keepdims)
        xp.copyto(out, result, casting="unsafe")
    return run


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
         "argmin": "HIGHEST", "prod": "1", "sum_square": "0", "l1": "0", "l2": "0",
         "log_sum": "0", "log_sum_exp": "0"}
_LIMITS = {"float": ("-INFINITY", "INFINITY"), "double": ("-INFINITY", "INFINITY"),
           "int": ("INT_MIN", "INT_MAX"), "long": ("LONG_MIN", "LONG_MAX")}
# merge (a, ia) with candidate (b, ib) into (a, ia); NaN wins, ties keep the lower index,
# matching np.max / np.argmax.
_MERGE = {
    "sum": "a += b;",
    "mean": "a += b;",
    "prod": "a *= b;",
    "sum_square": "a += b;",
    "l1": "a += b;",
    "l2": "a += b;",
    "log_sum": "a += b;",
    "log_sum_exp": "a += b;",
    "max": "if (b > a || b != b) a = b;",
    "min": "if (b < a || b != b) a = b;",
    "argmax": ("if ((a == a && (b > a || b != b)) || ((b == a || (b != b && a != a)) && ib < ia))"
               " { a = b; ia = ib; }"),
    "argmin": ("if ((a == a && (b < a || b != b)) || ((b == a || (b != b && a != a)) && ib < ia))"
               " { a = b; ia = ib; }"),
}
# What each value read becomes before it is merged (b, in the compute type; m: the max).
_MAP = {"sum_square": "b = b * b;", "l1": "b = b < 0 ? -b : b;", "l2": "b = b * b;",
        "log_sum_exp": "b = exp(b - m);"}
# The value stored, from the merged sa[0] (and si[0], the index).
_RESULT = {"mean": "sa[0] / R", "argmax": "si[0]", "argmin": "si[0]", "l2": "sqrt(sa[0])",
           "log_sum": "log(sa[0])", "log_sum_exp": "log(sa[0]) + m"}
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
    result = _RESULT.get(op, "sa[0]")
    head = f"{acc} m = 0;"
    if op == "log_sum_exp":
        # A first pass finds the max m, then exp(x - m) is summed: log(sum) + m never overflows.
        head = f"""{acc} m = -INFINITY;
    {_read_loop(dtype, acc, "if (b > m || b != b) m = b;")}
    __local {acc} sm[{_GROUP}];
    sm[lid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = L / 2; s > 0; s >>= 1) {{
        if (lid < s && (sm[lid + s] > sm[lid] || sm[lid + s] != sm[lid + s])) sm[lid] = sm[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    m = sm[0];
    if (isinf(m) || m != m) m = 0;"""
    body = _MAP.get(op, "") + f" MERGE_{op}(a, ia, b, ib)"
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
    {head}
    {acc} a = {init};
    long ia = R;
    {_read_loop(dtype, acc, body)}
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


def _read_loop(dtype: str, acc: str, body: str) -> str:
    """C loop of a work item over its share of the reduced values: b (index ib), then body."""
    return f"""for (long r = lid; r < R; r += L) {{
        long rr = r;
        long off = base;
        for (int d = nr - 1; d >= 0; --d) {{
            long c = rr % meta[2 * nk + d]; rr /= meta[2 * nk + d];
            off += c * meta[2 * nk + nr + d];
        }}
        {acc} b = {cl_load("in", dtype, "off")};
        long ib = r;
        {body}
    }}"""


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
