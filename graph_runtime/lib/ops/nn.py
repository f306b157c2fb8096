"""Neural-network standard ops: softmax, log_softmax, layer_norm, rms_norm and batch_norm
(inference)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import NUM_OUTPUTS_KEY, attr_error, bool_attr, float_attr, op_error, single_axis
from ..kernels.cuda_rows import RowNorm
from ..kernels.gpu_elementwise import gpu_elementwise
from ..kernels.cpu.rows_jit import layer_norm_rows, rms_norm_rows, softmax_rows
from ..kernels.host import array_module, host_kernel, wide_dtype
from ..kernels.opencl.rows import RowKernel
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import FLOAT_DTYPES, check_dtype, check_num_inputs, check_same_dtype

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

# -- softmax / log_softmax ----------------------------------------------------------------------

def _jit_rows(spec: TensorSpec, axis: int) -> bool:
    """Whether the CPU runs this row op compiled (kernels/cpu/rows_jit.py): float32/float64 rows
    over the last axis, not empty."""
    return (spec.dtype in ("float32", "float64") and axis in (-1, len(spec.shape) - 1)
            and len(spec.shape) >= 1 and all(int(d) > 0 for d in spec.shape))


def _softmax_infer(op: str) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        check_num_inputs(op, inputs, 1)
        check_dtype(op, inputs[0], FLOAT_DTYPES)
        if len(inputs[0].shape) == 0:
            raise op_error(op, f"input {inputs[0]} is a scalar; it needs an axis")
        single_axis(op, attrs, "axis", len(inputs[0].shape), -1)
        return [TensorSpec(tuple(inputs[0].shape), inputs[0].dtype)]
    return infer


def _softmax_cpu(op: str) -> Callable[..., Callable[..., None]]:
    """softmax over rows in one compiled pass where it applies (_jit_rows); else as on CUDA."""
    host = _softmax_host(op)

    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        spec = inputs[0]
        axis = single_axis(op, attrs, "axis", len(spec.shape), -1)
        if op == "softmax" and _jit_rows(spec, axis):
            return softmax_rows(tuple(spec.shape))
        return host(backend, device_id, inputs, outputs, attrs)
    return factory


def _softmax_host(op: str) -> Callable[..., Callable[..., None]]:
    log = op == "log_softmax"

    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        spec = inputs[0]
        xp = array_module(backend)
        axis = single_axis(op, attrs, "axis", len(spec.shape), -1)
        work = wide_dtype(spec.dtype)
        reduced = tuple(1 if i == axis else d for i, d in enumerate(spec.shape))
        row = xp.empty(reduced, work)
        buf = xp.empty(spec.shape, work) if work != spec.dtype else None
        tmp = xp.empty(spec.shape, work) if log else None

        # NOTE: NumPy's ufunc.reduce skips np.max/np.sum's Python wrappers (most of a small
        # softmax's time); CuPy keeps its own functions.
        amax: Any = np.maximum.reduce if xp is np else xp.max
        asum: Any = np.add.reduce if xp is np else xp.sum
        empty = spec.shape[axis] == 0

        def run(x: Any, out: Any) -> None:
            if empty:
                return
            y = out
            if buf is not None:
                xp.copyto(buf, x, casting="unsafe")
                x = y = buf
            amax(x, axis=axis, keepdims=True, out=row)
            xp.subtract(x, row, out=y)
            if log:
                # log_softmax = (x - max) - log(sum(exp(x - max))); y keeps x - max.
                xp.exp(y, out=tmp)
                asum(tmp, axis=axis, keepdims=True, out=row)
                xp.log(row, out=row)
                xp.subtract(y, row, out=y)
            else:
                xp.exp(y, out=y)
                asum(y, axis=axis, keepdims=True, out=row)
                xp.divide(y, row, out=y)
            if buf is not None:
                xp.copyto(out, buf, casting="unsafe")
        return host_kernel(backend, device_id, run)
    return factory


def _softmax_cl(op: str) -> Callable[..., Callable[..., None]]:
    def factory(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        spec = inputs[0]
        axis = single_axis(op, attrs, "axis", len(spec.shape), -1)
        row_kernel = RowKernel(backend, device_id, spec, axis, "gr_softmax", op)
        mode = np.int32(op == "log_softmax")

        def run(x: Any, out: Any) -> None:
            row_kernel.launch((out, x), mode)
        return run
    return factory


for _op in ("softmax", "log_softmax"):
    define_op(_op, _softmax_infer(_op), 1, ("axis",))
    kernel(_op, "cpu")(_softmax_cpu(_op))
    kernel(_op, "cuda")(_softmax_host(_op))
    kernel(_op, "opencl")(_softmax_cl(_op))


# -- layer_norm ---------------------------------------------------------------------------------

def _params_like(op: str, inputs: Sequence[TensorSpec], axis: int, names: Sequence[str]) -> None:
    """Each of inputs[1:] must be a vector as long as the data's axis."""
    length = inputs[0].shape[axis]
    for spec, name in zip(inputs[1:], names):
        if tuple(spec.shape) != (length,):
            raise op_error(op, f"{name} has shape {tuple(spec.shape)} but data {inputs[0]} "
                               f"needs ({length},) for axis {axis}")


def _norm_checks(op: str, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
                 names: Sequence[str], default_axis: int) -> tuple[int, float, bool, bool]:
    check_num_inputs(op, inputs, 1 + len(names))
    check_same_dtype(op, inputs)
    check_dtype(op, inputs[0], FLOAT_DTYPES)
    if len(inputs[0].shape) == 0:
        raise op_error(op, f"data {inputs[0]} is a scalar; it needs an axis")
    axis = single_axis(op, attrs, "axis", len(inputs[0].shape), default_axis)
    _params_like(op, inputs, axis, names)
    epsilon = float_attr(op, attrs, "epsilon", 1e-5)
    if epsilon < 0:
        raise attr_error(op, "epsilon", epsilon, "a non-negative number")
    return (axis, epsilon, bool_attr(op, attrs, "center", True),
            bool_attr(op, attrs, "scale", True))


LAYER_NORM_INPUTS = ("gamma", "beta")


def _layer_norm_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _norm_checks("layer_norm", inputs, attrs, LAYER_NORM_INPUTS, -1)
    return [TensorSpec(tuple(inputs[0].shape), inputs[0].dtype)]


def _layer_norm_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                    outputs: Sequence[TensorSpec],
                    attrs: Mapping[str, Any]) -> Callable[..., None]:
    """layer_norm over rows in one compiled pass where it applies (_jit_rows); else as on CUDA."""
    spec = inputs[0]
    axis, epsilon, center, scale = _norm_checks("layer_norm", inputs, attrs, LAYER_NORM_INPUTS,
                                                -1)
    if _jit_rows(spec, axis):
        return layer_norm_rows(tuple(spec.shape), epsilon, center, scale)
    return _layer_norm_host(backend, device_id, inputs, outputs, attrs)


def _row_buffers(backend: Backend, spec: TensorSpec, axis: int) -> tuple[Any, ...]:
    """A host normalisation's array module, gamma's broadcast shape, and its buffers in the
    wide dtype: one value per row, then two of the input's shape (made once, reused by every
    run)."""
    xp = array_module(backend)
    work = wide_dtype(spec.dtype)
    shaped = tuple(d if i == axis else 1 for i, d in enumerate(spec.shape))
    row = xp.empty(tuple(1 if i == axis else d for i, d in enumerate(spec.shape)), work)
    return xp, shaped, row, xp.empty(spec.shape, work), xp.empty(spec.shape, work)


def _layer_norm_host(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                     outputs: Sequence[TensorSpec],
                     attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    axis, epsilon, center, scale = _norm_checks("layer_norm", inputs, attrs, LAYER_NORM_INPUTS,
                                                -1)
    xp, shaped, row, centered, squares = _row_buffers(backend, spec, axis)

    def run(x: Any, gamma: Any, beta: Any, out: Any) -> None:
        xp.copyto(centered, x, casting="unsafe")
        if spec.shape[axis] == 0:
            return
        xp.mean(centered, axis=axis, keepdims=True, out=row)
        xp.subtract(centered, row, out=centered)
        xp.multiply(centered, centered, out=squares)
        xp.mean(squares, axis=axis, keepdims=True, out=row)
        xp.add(row, epsilon, out=row)
        xp.sqrt(row, out=row)
        xp.divide(centered, row, out=centered)
        if scale:
            xp.multiply(centered, gamma.reshape(shaped), out=centered)
        if center:
            xp.add(centered, beta.reshape(shaped), out=centered)
        xp.copyto(out, centered, casting="unsafe")
    return host_kernel(backend, device_id, run)


def _layer_norm_cl(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                   outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    axis, epsilon, center, scale = _norm_checks("layer_norm", inputs, attrs, LAYER_NORM_INPUTS,
                                                -1)
    row_kernel = RowKernel(backend, device_id, spec, axis, "gr_layer_norm", "layer_norm")
    eps = np.float64(epsilon) if spec.dtype == "float64" else np.float32(epsilon)
    flags = (np.int32(center), np.int32(scale))

    def run(x: Any, gamma: Any, beta: Any, out: Any) -> None:
        row_kernel.launch((out, x, gamma, beta), eps, *flags)
    return run


def _row_norm_cuda(kind: str, host: Callable[..., Callable[..., None]]
                   ) -> Callable[..., Callable[..., None]]:
    """A CUDA factory: the whole norm as one launch (kernels/cuda_rows.py) where the rows fit,
    else host's CuPy version; that one (with its two input-sized buffers) is made only when an
    array arrives laid out otherwise."""
    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        spec = inputs[0]
        axis, epsilon, centers, scales = _norm_checks(kind, inputs, attrs, (
            LAYER_NORM_INPUTS if kind == "layer_norm" else ("gamma",)), -1)
        if not RowNorm.fits(tuple(spec.shape), axis, spec.dtype):
            return host(backend, device_id, inputs, outputs, attrs)
        rows = RowNorm(kind, tuple(spec.shape), spec.dtype, epsilon, centers, scales)
        fallback: list[Callable[..., None]] = []

        def run(*arrays: Any) -> None:
            if not rows(*arrays):
                if not fallback:
                    fallback.append(host(backend, device_id, inputs, outputs, attrs))
                fallback[0](*arrays)
        return host_kernel(backend, device_id, run)
    return factory


define_op("layer_norm", _layer_norm_infer, 3, ("axis", "epsilon", "center", "scale"))
kernel("layer_norm", "cpu")(_layer_norm_cpu)
kernel("layer_norm", "cuda")(_row_norm_cuda("layer_norm", _layer_norm_host))
kernel("layer_norm", "opencl")(_layer_norm_cl)


# -- rms_norm: x / sqrt(mean(x^2) + epsilon) * gamma (LLaMA's, T5's; ONNX's RMSNormalization) ----

def _rms_norm_checks(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> tuple[int, float]:
    axis, epsilon, _, _ = _norm_checks("rms_norm", inputs, attrs, ("gamma",), -1)
    return axis, epsilon


def _rms_norm_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _rms_norm_checks(inputs, attrs)
    return [TensorSpec(tuple(inputs[0].shape), inputs[0].dtype)]


def _rms_norm_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                  outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    """rms_norm over rows in one compiled pass where it applies (_jit_rows); else as on CUDA."""
    axis, epsilon = _rms_norm_checks(inputs, attrs)
    if _jit_rows(inputs[0], axis):
        return rms_norm_rows(tuple(inputs[0].shape), epsilon)
    return _rms_norm_host(backend, device_id, inputs, outputs, attrs)


def _rms_norm_host(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                   outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    axis, epsilon = _rms_norm_checks(inputs, attrs)
    xp, shaped, row, wide, squares = _row_buffers(backend, spec, axis)

    def run(x: Any, gamma: Any, out: Any) -> None:
        if spec.shape[axis] == 0:
            return
        xp.copyto(wide, x, casting="unsafe")
        xp.multiply(wide, wide, out=squares)
        xp.mean(squares, axis=axis, keepdims=True, out=row)
        xp.add(row, epsilon, out=row)
        xp.sqrt(row, out=row)
        xp.divide(wide, row, out=wide)
        xp.multiply(wide, gamma.reshape(shaped), out=wide)
        xp.copyto(out, wide, casting="unsafe")
    return host_kernel(backend, device_id, run)


def _rms_norm_cl(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    spec = inputs[0]
    axis, epsilon = _rms_norm_checks(inputs, attrs)
    row_kernel = RowKernel(backend, device_id, spec, axis, "gr_rms_norm", "rms_norm")
    eps = np.float64(epsilon) if spec.dtype == "float64" else np.float32(epsilon)

    def run(x: Any, gamma: Any, out: Any) -> None:
        row_kernel.launch((out, x, gamma), eps)
    return run


define_op("rms_norm", _rms_norm_infer, 2, ("axis", "epsilon"))
kernel("rms_norm", "cpu")(_rms_norm_cpu)
kernel("rms_norm", "cuda")(_row_norm_cuda("rms_norm", _rms_norm_host))
kernel("rms_norm", "opencl")(_rms_norm_cl)


# -- batch_norm (inference) ---------------------------------------------------------------------

BATCH_NORM_INPUTS = ("gamma", "beta", "moving_mean", "moving_var")


def batch_norm_outputs(attrs: Mapping[str, Any]) -> int:
    """1 (normalized data) or 3 (plus moving_mean, moving_var), as the graph node declares."""
    raw = attrs.get(NUM_OUTPUTS_KEY, attrs.get("num_outputs", 1))
    try:
        count = int(raw)
    except (TypeError, ValueError):
        count = -1
    if count not in (1, 3):
        raise attr_error("batch_norm", "num_outputs", raw, "1 (the normalized data) or 3 (data, "
                                                           "moving_mean, moving_var)")
    return count


def _batch_norm_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _norm_checks("batch_norm", inputs, attrs, BATCH_NORM_INPUTS, 1)
    outs = [TensorSpec(tuple(inputs[0].shape), inputs[0].dtype)]
    if batch_norm_outputs(attrs) == 3:
        outs += [TensorSpec(tuple(inputs[3].shape), inputs[3].dtype),
                 TensorSpec(tuple(inputs[4].shape), inputs[4].dtype)]
    return outs


def _batch_norm_template(epsilon: float, center: bool, scale: bool) -> str:
    """C expression over {0} data, {1} gamma, {2} beta, {3} mean, {4} var."""
    expr = f"({{0}} - {{3}}) / sqrt({{4}} + ({{T}})({epsilon!r}))"
    if scale:
        expr = f"({expr}) * {{1}}"
    if center:
        expr = f"({expr}) + {{2}}"
    return expr


# normalize(x, gamma, beta, mean, var, out) for a backend, given (backend, device_id, inputs,
# output, the parameters' broadcast shape, epsilon, center, scale)
Normalizer = Callable[[Backend, int, Sequence[TensorSpec], TensorSpec, tuple[int, ...], float,
                       bool, bool], Callable[..., None]]


def _batch_norm_factory(normalizer: Normalizer) -> Callable[..., Callable[..., None]]:
    """batch_norm on a backend: its normalizer, then the running statistics passed through."""
    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        axis, epsilon, center, scale = _norm_checks("batch_norm", inputs, attrs,
                                                    BATCH_NORM_INPUTS, 1)
        shaped = tuple(d if i == axis else 1 for i, d in enumerate(inputs[0].shape))[axis:]
        normalize = normalizer(backend, device_id, inputs, outputs[0], shaped, epsilon, center,
                               scale)
        return _passing_stats(backend, normalize, len(outputs) == 3)
    return factory


def _passing_stats(backend: Backend, normalize: Callable[..., None],
                   passthrough: bool) -> Callable[..., None]:
    """run(x, gamma, beta, mean, var, out, *stats): normalize, then (passthrough) copy mean and
    var to the two statistics outputs."""
    def run(x: Any, gamma: Any, beta: Any, mean: Any, var: Any, out: Any, *stats: Any) -> None:
        normalize(x, gamma, beta, mean, var, out)
        if passthrough:
            backend.copy(mean, stats[0])
            backend.copy(var, stats[1])
    return run


def _batch_norm_gpu(reshape: bool) -> Normalizer:
    """One fused kernel (numpy counterpart: _batch_norm_cpu); reshape: the parameters handed
    in their broadcast shape (CuPy's arrays; OpenCL's buffers are flat)."""
    def normalizer(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                   output: TensorSpec, shaped: tuple[int, ...], epsilon: float, center: bool,
                   scale: bool) -> Callable[..., None]:
        spec = inputs[0]
        params = [TensorSpec(shaped, s.dtype) for s in inputs[1:]]
        step = (_batch_norm_template(epsilon, center, scale), [0, 1, 2, 3, 4], spec.dtype)
        fused = gpu_elementwise(backend, device_id, [spec] + params, output, [step],
                                "gr_batch_norm")
        if not reshape:
            return fused

        def normalize(x: Any, *rest: Any) -> None:
            fused(x, *[a.reshape(shaped) for a in rest[:4]], rest[4])
        return normalize
    return normalizer


def _batch_norm_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                    output: TensorSpec, shaped: tuple[int, ...], epsilon: float,
                    center: bool, scale: bool) -> Callable[..., None]:
    work = wide_dtype(inputs[0].dtype)
    factor = np.empty(shaped, work)
    shift = np.empty(shaped, work)
    buf = np.empty(inputs[0].shape, work) if work != inputs[0].dtype else None

    def run(x: Any, gamma: Any, beta: Any, mean: Any, var: Any, out: Any) -> None:
        # out = x * factor + shift: factor = gamma / sqrt(var + eps), shift = beta - mean * factor
        np.add(var.reshape(shaped), epsilon, out=factor)
        np.sqrt(factor, out=factor)
        np.divide(1, factor, out=factor)
        if scale:
            np.multiply(factor, gamma.reshape(shaped), out=factor)
        np.multiply(mean.reshape(shaped), factor, out=shift)
        np.negative(shift, out=shift)
        if center:
            np.add(shift, beta.reshape(shaped), out=shift)
        y = out if buf is None else buf
        np.multiply(x, factor, out=y)
        np.add(y, shift, out=y)
        if buf is not None:
            np.copyto(out, buf, casting="unsafe")
    return run


define_op("batch_norm", _batch_norm_infer, 5, ("axis", "epsilon", "center", "scale"))
kernel("batch_norm", "cpu")(_batch_norm_factory(_batch_norm_cpu))
kernel("batch_norm", "cuda")(_batch_norm_factory(_batch_norm_gpu(reshape=True)))
kernel("batch_norm", "opencl")(_batch_norm_factory(_batch_norm_gpu(reshape=False)))

__all__ = ["NUM_OUTPUTS_KEY", "batch_norm_outputs"]
