"""Elementwise standard ops (add ... relu, cast): NumPy/CuPy ufuncs and generated OpenCL kernels."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import DTYPE_KEY, OUT_DTYPE_KEY, dtype_attr, op_error
from ..kernels.gpu_common import CL_TYPES
from ..kernels.gpu_elementwise import elementwise_expr, gpu_elementwise
from ..kernels.host import array_module, host_kernel
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import (FLOAT_DTYPES, INT_DTYPES, NUMERIC_DTYPES, broadcast_shape, check_dtype,
                      check_num_inputs, check_same_dtype)

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

# make(xp) -> run(*inputs, out): xp is numpy or cupy, looked up once at prepare time.
HostFn = Callable[[Any], Callable[..., None]]


def _sigmoid(xp: Any) -> Callable[..., None]:
    def run(x: Any, out: Any) -> None:
        # NOTE: 0.5 * (1 + tanh(x / 2)) never overflows, unlike 1 / (1 + exp(-x)).
        xp.multiply(x, 0.5, out=out)
        xp.tanh(out, out=out)
        xp.multiply(out, 0.5, out=out)
        xp.add(out, 0.5, out=out)
    return run


_RELU_BLOCK = 1 << 14  # elements of the zero block relu compares against (64 KB of float32)


def _relu(xp: Any) -> Callable[..., None]:
    maximum = xp.maximum
    if xp is not np:
        return lambda x, out: maximum(x, 0, out=out)
    # NOTE: NumPy's SIMD maximum runs only when both operands are contiguous; against the
    # scalar 0 (a stride-0 operand) it is several times slower (docs/measurements.md). So
    # contiguous data is compared block by block with a block of zeros of its dtype.
    zeros: dict[Any, np.ndarray] = {}

    def run(x: Any, out: Any) -> None:
        n = x.size
        if n < 4096 or not (x.flags.c_contiguous and out.flags.c_contiguous) \
                or x.dtype != out.dtype:  # small: the blocks' own overhead would dominate
            maximum(x, 0, out=out)
            return
        zero = zeros.get(x.dtype)
        if zero is None:
            zero = zeros[x.dtype] = np.zeros(_RELU_BLOCK, x.dtype)
        flat_x, flat_out = x.reshape(-1), out.reshape(-1)
        for start in range(0, n, _RELU_BLOCK):
            stop = min(n, start + _RELU_BLOCK)
            maximum(flat_x[start:stop], zero[:stop - start], out=flat_out[start:stop])
    return run


def _copy(xp: Any) -> Callable[..., None]:
    copyto = xp.copyto
    return lambda x, out: copyto(out, x)


def _cast(xp: Any) -> Callable[..., None]:
    copyto = xp.copyto
    return lambda x, out: copyto(out, x, casting="unsafe")


def _ufunc1(name: str) -> HostFn:
    def make(xp: Any) -> Callable[..., None]:
        fn = getattr(xp, name)
        if xp is np:
            return fn  # type: ignore[no-any-return]  # NumPy ufuncs take out positionally
        return lambda x, out: fn(x, out=out)
    return make


def _ufunc2(name: str) -> HostFn:
    def make(xp: Any) -> Callable[..., None]:
        fn = getattr(xp, name)
        if xp is np and name not in ("maximum", "minimum"):
            # NOTE: np.add(a, b, out) with out positional: no Python wrapper per call, which
            # keeps the executor within a few percent of a hand-written NumPy loop. NumPy
            # deprecates a positional out for maximum/minimum only.
            return fn  # type: ignore[no-any-return]
        return lambda a, b, out: fn(a, b, out=out)
    return make


# name -> (host fn, C expression, dtypes). Each C expression mirrors its NumPy counterpart;
# maximum/minimum propagate NaN like np.maximum/np.minimum.
BINARY: dict[str, tuple[HostFn, str, tuple[str, ...]]] = {
    "add": (_ufunc2("add"), "({0} + {1})", NUMERIC_DTYPES),
    "subtract": (_ufunc2("subtract"), "({0} - {1})", NUMERIC_DTYPES),
    "multiply": (_ufunc2("multiply"), "({0} * {1})", NUMERIC_DTYPES),
    "divide": (_ufunc2("divide"), "({0} / {1})", FLOAT_DTYPES),
    "maximum": (_ufunc2("maximum"), "(({0} != {0} || {0} > {1}) ? {0} : {1})", NUMERIC_DTYPES),
    "minimum": (_ufunc2("minimum"), "(({0} != {0} || {0} < {1}) ? {0} : {1})", NUMERIC_DTYPES),
    "power": (_ufunc2("power"), "pow({0}, {1})", FLOAT_DTYPES),
}
UNARY: dict[str, tuple[HostFn, str, tuple[str, ...]]] = {
    "negative": (_ufunc1("negative"), "(-{0})", NUMERIC_DTYPES),
    "exp": (_ufunc1("exp"), "exp({0})", FLOAT_DTYPES),
    "log": (_ufunc1("log"), "log({0})", FLOAT_DTYPES),
    "sqrt": (_ufunc1("sqrt"), "sqrt({0})", FLOAT_DTYPES),
    "tanh": (_ufunc1("tanh"), "tanh({0})", FLOAT_DTYPES),
    "sigmoid": (_sigmoid, "(({T})0.5 * tanh(({T})0.5 * {0}) + ({T})0.5)", FLOAT_DTYPES),
    "relu": (_relu, "({0} < 0 ? ({T})0 : {0})", NUMERIC_DTYPES),
    "abs": (_ufunc1("absolute"), "({0} < 0 ? -{0} : {0})", NUMERIC_DTYPES),
    "copy": (_copy, "{0}", NUMERIC_DTYPES),
}
CAST_DTYPES = tuple(CL_TYPES)


def _binary_infer(name: str, dtypes: Sequence[str]) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        check_num_inputs(name, inputs, 2)
        dtype = check_same_dtype(name, inputs)
        check_dtype(name, inputs[0], dtypes)
        return [TensorSpec(broadcast_shape(name, inputs[0].shape, inputs[1].shape), dtype)]
    return infer


def _unary_infer(name: str, dtypes: Sequence[str]) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        check_num_inputs(name, inputs, 1)
        check_dtype(name, inputs[0], dtypes)
        return [TensorSpec(tuple(inputs[0].shape), inputs[0].dtype)]
    return infer


def _cast_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    check_num_inputs("cast", inputs, 1)
    check_dtype("cast", inputs[0], CAST_DTYPES)
    dtype = dtype_attr("cast", attrs, "dtype", None)
    if dtype is None:
        dtype = attrs.get(OUT_DTYPE_KEY)
    if dtype is None:
        raise op_error("cast", "missing attribute 'dtype' (needed when cast is not the last op "
                               "of a function, whose output dtype the graph declares)")
    if dtype not in CAST_DTYPES:
        raise op_error("cast", f"cannot cast to {dtype}; supported: {', '.join(CAST_DTYPES)}")
    return [TensorSpec(tuple(inputs[0].shape), dtype)]


def _host_factory(fn: HostFn) -> Callable[..., Callable[..., None]]:
    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        return host_kernel(backend, device_id, fn(array_module(backend)))
    return factory


def _expr(template: str) -> Callable[[Mapping[str, Any]], str]:
    """The template, minus NaN tests (x != x) for integer inputs, where compilers warn."""
    def expr(attrs: Mapping[str, Any]) -> str:
        if attrs.get(DTYPE_KEY) in INT_DTYPES:
            return template.replace("{0} != {0} || ", "")
        return template
    return expr


def _cl_factory(name: str, family: Mapping[str, tuple[HostFn, str, tuple[str, ...]]]
                ) -> Callable[..., Callable[..., None]]:
    def factory(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        dtype = inputs[0].dtype
        slots = list(range(len(inputs)))
        # Every op of the family that takes this dtype is built into one OpenCL program.
        kernels = {f"gr_{op}": [(_expr(template)({DTYPE_KEY: dtype}), slots, outputs[0].dtype)]
                   for op, (_, template, dtypes) in family.items() if dtype in dtypes}
        steps = kernels.pop(f"gr_{name}")
        return gpu_elementwise(backend, device_id, inputs, outputs[0], steps, f"gr_{name}",
                               kernels)
    return factory


def _register(name: str, infer: Callable[..., list[TensorSpec]], num_inputs: int,
              attrs: Sequence[str], host: HostFn, template: str,
              family: Mapping[str, tuple[HostFn, str, tuple[str, ...]]]) -> None:
    # Each host fn reads x before it writes out (sigmoid's later steps read out only), so a
    # chain may pass its first input as its output.
    define_op(name, infer, num_inputs, attrs, in_place=True)
    kernel(name, "cpu")(_host_factory(host))
    kernel(name, "cuda")(_host_factory(host))
    kernel(name, "opencl")(_cl_factory(name, family))
    elementwise_expr(name, _expr(template))


for _name, (_host, _template, _dtypes) in BINARY.items():
    _register(_name, _binary_infer(_name, _dtypes), 2, (), _host, _template, BINARY)
for _name, (_host, _template, _dtypes) in UNARY.items():
    _register(_name, _unary_infer(_name, _dtypes), 1, (), _host, _template, UNARY)
# The conversion happens when the result is stored in the output's type.
_register("cast", _cast_infer, 1, ("dtype",), _cast, "{0}",
          {"cast": (_cast, "{0}", CAST_DTYPES)})
