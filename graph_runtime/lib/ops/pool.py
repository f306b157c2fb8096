"""Pooling standard ops: max/avg pools over 2 (NCHW) or 3 (NCDHW) spatial axes, global pools.

Semantics are ONNX MaxPool/AveragePool's: explicit begin/end padding, dilations, ceil_mode (the
last window must start inside the data or its begin padding, as ONNX and PyTorch rule; a window
may be longer than the padded data), count_include_pad counting explicit padding but never the
ceil_mode overhang.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends import REGISTRY
from ...backends.base import Backend
from ..attrs import attr_error, bool_attr, int_tuple, op_error
from ..conv_params import check_layout, out_size, padding_attr
from ..kernels.gpu_common import compute_type, device_array
from ..kernels.host import array_module, host_kernel, wide_dtype
from ..kernels.opencl.source import (ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param,
                                     cl_pointer, cl_store)
from ..library import TensorSpec
from ..registry import define_op, get_op, kernel
from ..shapes import FLOAT_DTYPES, check_dtype, check_num_inputs, check_rank, size_of

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

POOL_ATTRS = ("pool_size", "strides", "dilation", "padding", "layout", "out_layout", "ceil_mode")
AVG_ATTRS = POOL_ATTRS + ("count_include_pad",)
GLOBAL_ATTRS = ("layout", "out_layout")
# op -> number of spatial axes
POOL_OPS = {"max_pool2d": 2, "avg_pool2d": 2, "max_pool3d": 3, "avg_pool3d": 3}
LAYOUTS = {2: "NCHW", 3: "NCDHW"}
MAX_DTYPES = FLOAT_DTYPES + ("int8", "uint8")  # ONNX MaxPool also takes 8-bit integers
JIT_DTYPES = ("float32", "float64")  # CPU 2-D pools of these run compiled (_pool_jit)
AXIS_NAMES = {2: ("height", "width"), 3: ("depth", "height", "width")}


@dataclass(frozen=True)
class PoolParams:
    """Sizes of one pooling; per spatial axis tuples, `pad` is (begins..., ends...)."""

    n: int
    c: int
    size: tuple[int, ...]
    kernel: tuple[int, ...]
    out: tuple[int, ...]
    strides: tuple[int, ...]
    pad: tuple[int, ...]
    dilation: tuple[int, ...]
    count_include_pad: bool
    dtype: str

    @property
    def dims(self) -> int:
        return len(self.size)

    @property
    def begin(self) -> tuple[int, ...]:
        return self.pad[:self.dims]

    @property
    def end(self) -> tuple[int, ...]:
        return self.pad[self.dims:]


def _positive(op: str, attrs: Mapping[str, Any], name: str, dims: int,
              default: tuple[int, ...]) -> tuple[int, ...]:
    value = int_tuple(op, attrs, name, dims, default)
    if min(value) < 1:
        raise attr_error(op, name, list(value), f"{dims} positive integers")
    return tuple(value)


def _padding(op: str, attrs: Mapping[str, Any], dims: int) -> tuple[int, ...]:
    """Relay's padding: 1 value, one per axis (both sides), or begins then ends."""
    if dims == 2:
        return padding_attr(op, attrs)
    pad = int_tuple(op, attrs, "padding", None, (0,) * dims)
    if len(pad) == 1:
        pad = pad * (2 * dims)
    elif len(pad) == dims:
        pad = pad + pad
    if len(pad) != 2 * dims or min(pad) < 0:
        raise attr_error(op, "padding", list(pad), f"1, {dims} or {2 * dims} non-negative "
                                                   "integers (begins, then ends)")
    return tuple(pad)


def pool_params(op: str, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> PoolParams:
    dims = POOL_OPS[op]
    check_num_inputs(op, inputs, 1)
    check_dtype(op, inputs[0], MAX_DTYPES if op.startswith("max") else FLOAT_DTYPES)
    check_rank(op, inputs[0], (dims + 2,), "data")
    check_layout(op, attrs, "layout", LAYOUTS[dims])
    check_layout(op, attrs, "out_layout", LAYOUTS[dims])
    if "pool_size" not in attrs:
        raise op_error(op, "missing required attribute 'pool_size'")
    kernel_size = _positive(op, attrs, "pool_size", dims, (1,) * dims)
    strides = _positive(op, attrs, "strides", dims, (1,) * dims)
    dilation = _positive(op, attrs, "dilation", dims, (1,) * dims)
    pad = _padding(op, attrs, dims)
    ceil = bool_attr(op, attrs, "ceil_mode", False)
    include = bool_attr(op, attrs, "count_include_pad", False)
    shape = tuple(inputs[0].shape)
    out = [_pooled_length(op, what, shape[2 + i], pad[i], pad[dims + i], kernel_size[i],
                          strides[i], dilation[i], ceil)
           for i, what in enumerate(AXIS_NAMES[dims])]
    return PoolParams(shape[0], shape[1], shape[2:], kernel_size, tuple(out), strides, pad,
                      dilation, include, inputs[0].dtype)


def _pooled_length(op: str, what: str, size: int, begin: int, end: int, k: int, stride: int,
                   dilation: int, ceil: bool) -> int:
    """ONNX's window count along one axis: (size + pads - span) / stride rounded down, or up
    with ceil_mode, plus 1.

    With ceil_mode a window may run past the padded data (Hugging Face's EfficientNet averages
    a 7x7 map with a 1280-tap window, ceil_mode=1): it pools what it covers. A last window that
    would start past the data and its begin padding is dropped rather than pooled over nothing
    (ONNX's operator text and PyTorch rule so).
    """
    if not ceil:
        return out_size(op, what, size, begin + end, k, stride, dilation)
    span = dilation * (k - 1) + 1
    length = -(-(size + begin + end - span) // stride) + 1
    if length >= 1 and (length - 1) * stride >= size + begin:
        length -= 1
    if length < 1:
        raise op_error(op, f"the {what} window ({k} taps, dilation {dilation}) spans {span}: "
                           f"with stride {stride} and ceil_mode no window starts inside the "
                           f"data ({size}) or its begin padding ({begin})")
    return length


def reading(p: PoolParams) -> PoolParams:
    """The same pool less the taps that read no data in any window (only padding or the
    ceil_mode overhang): maxima and sums are unchanged, and a window far longer than the data
    reads only the data (EfficientNet's 1280-tap window over a 7x7 map becomes 7x7). An average
    still divides by avg_divisor(p), counted over the whole window."""
    kernel, begin = [], []
    for i in range(p.dims):
        k, s, d, b, n, o = (p.kernel[i], p.strides[i], p.dilation[i], p.begin[i], p.size[i],
                            p.out[i])
        # Tap j of window w reads w * s - b + j * d: keep the j that some window reads inside
        # [0, n), but never drop so many leading taps that the begin padding turns negative.
        first = max(0, min(-(-(b - (o - 1) * s) // d), b // d))
        last = min(k - 1, (b + n - 1) // d)
        if last < first:  # no window reads any data here: keep the axis as it is
            first, last = 0, k - 1
        kernel.append(last - first + 1)
        begin.append(b - first * d)
    return PoolParams(p.n, p.c, p.size, tuple(kernel), p.out, p.strides, tuple(begin) + p.end,
                      p.dilation, p.count_include_pad, p.dtype)


def _pool_infer(op: str) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        p = pool_params(op, inputs, attrs)
        return [TensorSpec((p.n, p.c) + p.out, p.dtype)]
    return infer


def _taps(out: int, k: int, stride: int, dilation: int, lo: int, hi: int,
          before: int) -> np.ndarray:
    """Per output index, how many window taps land in [lo, hi) (input coordinates)."""
    starts = np.arange(out) * stride - before
    taps = starts[:, None] + np.arange(k)[None, :] * dilation
    return ((taps >= lo) & (taps < hi)).sum(axis=1)


def avg_divisor(p: PoolParams) -> np.ndarray:
    """The divisor per output position: taps inside the data, or data plus explicit padding.

    The ceil_mode overhang never counts; a window with no counted tap gets divisor 1.
    """
    div = np.ones(())
    for i in range(p.dims):
        before, after = p.begin[i], p.end[i]
        lo, hi = (-before, p.size[i] + after) if p.count_include_pad else (0, p.size[i])
        counts = _taps(p.out[i], p.kernel[i], p.strides[i], p.dilation[i], lo, hi, before)
        div = np.multiply.outer(div, counts)
    return np.maximum(div, 1).astype(np.float64)


# -- cpu / cuda ---------------------------------------------------------------------------------

def _pool_cpu(op: str) -> Callable[..., Callable[..., None]]:
    """2-D pools: oneDNN's or the compiled loops (_onednn_or_jit); the rest as on CUDA."""
    is_max = op.startswith("max")
    host = _pool_host(op)

    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        p = pool_params(op, inputs, attrs)
        if p.dims == 2 and p.dtype in JIT_DTYPES:
            return _onednn_or_jit(p, is_max)
        return host(backend, device_id, inputs, outputs, attrs)
    return factory


def _pool_host(op: str) -> Callable[..., Callable[..., None]]:
    is_max = op.startswith("max")

    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        whole = pool_params(op, inputs, attrs)
        p = reading(whole)
        xp = array_module(backend)
        # Workspace made once: the data inside a border of lowest (max) or 0 (avg) that also
        # covers the ceil_mode overhang; only the interior is rewritten per call. Without padding
        # or overhang the data is read in place.
        padded_size = tuple(max(p.begin[i] + p.size[i],
                                (p.out[i] - 1) * p.strides[i] + (p.kernel[i] - 1) * p.dilation[i]
                                + 1) for i in range(p.dims))
        work = p.dtype if is_max else wide_dtype(p.dtype)
        in_place = padded_size == p.size and not any(p.pad) and work == p.dtype
        padded = None
        if not in_place:
            padded = xp.full((p.n, p.c) + padded_size, _lowest(work) if is_max else 0, work)
        interior = (slice(None), slice(None)) + tuple(
            slice(b, b + s) for b, s in zip(p.begin, p.size))
        acc = xp.empty(outputs[0].shape, work) if work != p.dtype else None
        inv = None
        if not is_max:
            inv = xp.asarray((1.0 / avg_divisor(whole)).astype(work))
        # Separable (max and sum both are): pool the last spatial axis into a buffer, then the
        # one before it, ...: sum(kernel) strided passes over shrinking arrays instead of
        # prod(kernel) passes over the whole window grid.
        stages: list[tuple[list[tuple[slice, ...]], Any]] = []
        shape = [p.n, p.c, *padded_size]
        for i in reversed(range(p.dims)):
            shape[2 + i] = p.out[i]
            span = (p.out[i] - 1) * p.strides[i] + 1
            lead = (slice(None),) * (2 + i)
            taps = [lead + (slice(j * p.dilation[i], j * p.dilation[i] + span, p.strides[i]),)
                    for j in range(p.kernel[i])]
            stages.append((taps, xp.empty(tuple(shape), work) if i else None))
        fold = xp.maximum if is_max else xp.add

        def run(data: Any, out: Any) -> None:
            src = data
            if padded is not None:
                padded[interior] = data
                src = padded
            target = out if acc is None else acc
            for taps, buf in stages:
                dst = target if buf is None else buf
                _fold_taps(xp, fold, [src[tap] for tap in taps], dst)
                src = dst
            if not is_max:
                xp.multiply(target, inv, out=target)
            if acc is not None:
                xp.copyto(out, acc, casting="unsafe")
        return host_kernel(backend, device_id, run)
    return factory


def _onednn_or_jit(p: PoolParams, is_max: bool) -> Callable[..., None]:
    """A oneDNN pooling primitive where it applies and is faster (kernels/onednn), else _pool_jit."""
    from ..kernels.onednn.choice import onednn_or
    from ..kernels.onednn.pool import OnednnPool, pool_applies

    shape, out = (p.n, p.c) + p.size, (p.n, p.c) + p.out
    r = reading(p)
    # oneDNN's include-padding average divides by its (here shortened) window: exact only for
    # the window as given.
    applies = (r == p or is_max or not p.count_include_pad) and pool_applies(
        r.dtype, r.size, r.kernel, r.out, r.strides, r.dilation, r.begin, r.end, is_max,
        r.count_include_pad)
    key = (f"{'max' if is_max else 'avg'} {p.dtype} data {_dims(shape)} out {_dims(out)} "
           f"kernel {_dims(p.kernel)} strides {_dims(p.strides)} pad {_dims(p.pad)} "
           f"dilation {_dims(p.dilation)}{' count_include_pad' if p.count_include_pad else ''}")
    return onednn_or("pool2d", key, applies,
                     lambda: OnednnPool(shape, out, r.kernel, r.strides, r.dilation, r.begin,
                                        is_max, r.count_include_pad),
                     lambda: _pool_jit(p, is_max), [shape, out])


def _dims(values: Sequence[int]) -> str:
    return "x".join(str(v) for v in values)


def _pool_jit(p: PoolParams, is_max: bool) -> Callable[..., None]:
    """A 2-D float pool on the CPU: each output row made in L1 by a compiled loop (the window's
    rows folded, then its columns: kernels/cpu/loops_jit.py) instead of a NumPy pass per tap."""
    from ..kernels.cpu.pool_jit import pool2d_jit  # NOTE: loads numba, so only when one is built

    inv = None if is_max else (1.0 / avg_divisor(p)).astype(p.dtype)
    r = reading(p)
    return pool2d_jit(r.dtype, (r.n, r.c) + r.size, (r.n, r.c) + r.out, r.kernel, r.strides,
                      r.dilation, r.begin, inv)


def _fold_taps(xp: Any, fold: Any, taps: list[Any], out: Any) -> None:
    """out = fold over taps; the first two fold straight into out (no copy pass)."""
    if len(taps) == 1:
        xp.copyto(out, taps[0])
        return
    fold(taps[0], taps[1], out=out)
    for tap in taps[2:]:
        fold(out, tap, out=out)


# -- opencl -------------------------------------------------------------------------------------

def _lowest(dtype: str) -> float | int:
    """What max pooling pads with: the dtype's lowest finite value, as TVM pads."""
    if np.dtype(dtype).kind in "iu":
        return int(np.iinfo(dtype).min)
    return float(np.finfo(dtype).min)


def _inv_dtype(dtype: str) -> str:
    """Reciprocal divisors are stored in the compute type (float for half)."""
    return "float64" if dtype == "float64" else "float32"


def _cl_pool_source(dtype: str, is_max: bool) -> str:
    acc = compute_type(dtype, "opencl")
    init = repr(_lowest(dtype)) if is_max else "0"
    nan = " || v != v" if dtype in FLOAT_DTYPES else ""  # integers have no NaN to propagate
    merge = f"if (v > s{nan}) s = v;" if is_max else "s += v;"
    result = "s" if is_max else "s * inv[((long)od * OH + oh) * OW + ow]"
    inv_dtype = _inv_dtype(dtype)
    extra = "" if is_max else f", {cl_param('inv', inv_dtype)}"
    inv_ptr = "" if is_max else cl_pointer("inv", inv_dtype)
    return cl_header([dtype]) + f"""
// numpy counterpart: _pool_host (max or mean over each strided, padded window); a 2-D pool
// runs with depth 1.
__kernel void gr_pool({cl_param("out", dtype, const=False)}, {cl_param("data", dtype)}{extra},
                      long total, int D, int H, int W, int KD, int KH, int KW, int OD, int OH,
                      int OW, int SD, int SH, int SW, int PF, int PT, int PL, int DD, int DH,
                      int DW) {{
    long i = get_global_id(0);
    if (i >= total) return;
    {cl_pointer("out", dtype, const=False)}
    {cl_pointer("data", dtype)}
    {inv_ptr}
    long t = i;
    int ow = t % OW; t /= OW;
    int oh = t % OH; t /= OH;
    int od = t % OD; t /= OD;
    {acc} s = {init};
    for (int kd = 0; kd < KD; ++kd) {{
        int z = od * SD - PF + kd * DD;
        if (z < 0 || z >= D) continue;
        for (int kh = 0; kh < KH; ++kh) {{
            int y = oh * SH - PT + kh * DH;
            if (y < 0 || y >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {{
                int x = ow * SW - PL + kw * DW;
                if (x < 0 || x >= W) continue;
                {acc} v = {cl_load("data", dtype, "((t * D + z) * H + y) * W + x")};
                {merge}
            }}
        }}
    }}
    {cl_store("out", dtype, "i", result)}
}}
"""


def _pool_cl(op: str) -> Callable[..., Callable[..., None]]:
    is_max = op.startswith("max")

    def factory(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        whole = pool_params(op, inputs, attrs)
        p = reading(whole)
        check_cl_dtypes(op, backend, device_id, [p.dtype])
        knl = ClKernel(backend, device_id, _cl_pool_source(p.dtype, is_max), "gr_pool", op)
        total = size_of((p.n, p.c) + p.out)
        lift = 3 - p.dims  # a 2-D pool is a 3-D pool of depth 1

        def three(values: tuple[int, ...], fill: int) -> tuple[int, ...]:
            return (fill,) * lift + values
        sizes = [np.int64(total)] + [np.int32(v) for v in (
            three(p.size, 1) + three(p.kernel, 1) + three(p.out, 1) + three(p.strides, 1)
            + three(p.begin, 0) + three(p.dilation, 1))]
        if is_max:
            return lambda data, out: knl.launch(total, None, out, data, *sizes)
        inv = device_array(backend, device_id,
                           (1.0 / avg_divisor(whole)).astype(_inv_dtype(p.dtype)))
        return lambda data, out: knl.launch(total, None, out, data, inv, *sizes)
    return factory


# -- global pools: a mean / max over every spatial axis ---------------------------------------

GLOBAL_REDUCE = {"global_avg_pool2d": "mean", "global_max_pool2d": "max"}


def _global_infer(op: str) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        check_num_inputs(op, inputs, 1)
        check_dtype(op, inputs[0], FLOAT_DTYPES)
        shape = tuple(inputs[0].shape)
        if len(shape) < 3:
            raise op_error(op, f"data {inputs[0]} needs rank 3 or more (N, C, spatial...) "
                               f"as ONNX's global pools; got rank {len(shape)}")
        layout = LAYOUTS.get(len(shape) - 2)
        if layout is not None:
            check_layout(op, attrs, "layout", layout)
            check_layout(op, attrs, "out_layout", layout)
        elif "layout" in attrs or "out_layout" in attrs:
            raise op_error(op, f"data {inputs[0]} has {len(shape) - 2} spatial axes: leave "
                               "'layout' and 'out_layout' unset (channels second is implied)")
        if size_of(shape[2:]) == 0 and size_of(shape[:2]) > 0:
            extent = "x".join(str(d) for d in shape[2:])
            raise op_error(op, f"data {inputs[0]} has an empty {extent} image to pool")
        return [TensorSpec(shape[:2] + (1,) * (len(shape) - 2), inputs[0].dtype)]
    return infer


def _global_factory(op: str) -> Callable[..., Callable[..., None]]:
    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        reduce_op = get_op(GLOBAL_REDUCE[op])
        axes = list(range(2, len(inputs[0].shape)))

        def reduce() -> Callable[..., None]:
            return reduce_op.kernels[backend.name](backend, device_id, inputs, outputs,
                                                   {"axis": axes, "keepdims": True})
        shape = tuple(inputs[0].shape)
        if backend.name != "cpu" or len(shape) != 4:
            return reduce()
        from ..kernels.onednn.choice import onednn_or
        from ..kernels.onednn.pool import OnednnPool, pool_applies

        size, ones = shape[2:], (1, 1)
        is_max = op.startswith("global_max")
        applies = pool_applies(inputs[0].dtype, size, size, ones, ones, ones, (0, 0), (0, 0),
                               is_max, False)
        key = f"{'max' if is_max else 'avg'} {inputs[0].dtype} data {_dims(shape)}"
        return onednn_or("global_pool", key, applies,
                         lambda: OnednnPool(shape, shape[:2] + ones, size, ones, ones, (0, 0),
                                            is_max, False), reduce, [shape, shape[:2] + ones])
    return factory


for _op in POOL_OPS:
    define_op(_op, _pool_infer(_op), 1, AVG_ATTRS if _op.startswith("avg") else POOL_ATTRS)
    kernel(_op, "cpu")(_pool_cpu(_op))
    kernel(_op, "cuda")(_pool_host(_op))
    kernel(_op, "opencl")(_pool_cl(_op))
for _op in GLOBAL_REDUCE:
    define_op(_op, _global_infer(_op), 1, GLOBAL_ATTRS)
    for _kind in REGISTRY:
        kernel(_op, _kind)(_global_factory(_op))

__all__ = ["PoolParams", "avg_divisor", "pool_params", "reading"]
