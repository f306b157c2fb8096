"""Elementwise standard ops with attributes (clip, leaky_relu, gelu, erf), prelu and where."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...backends import REGISTRY
from ...backends.base import Backend
from ..attrs import DTYPE_KEY, attr_error, float_attr, op_error, str_attr
from ..kernels.cpu import chain_jit
from ..kernels.gpu_elementwise import elementwise_expr, gpu_elementwise
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import (FLOAT_DTYPES, NUMERIC_DTYPES, broadcast_shape, check_dtype, check_num_inputs,
                      check_same_dtype)

WHERE_CONDITION_DTYPES = ("bool",) + NUMERIC_DTYPES

# -- elementwise ops with attributes (fusable into GPU chains) ----------------------------------
# The host kernels run on the CPU only; CUDA and OpenCL run the C expressions.

_SQRT1_2 = "0.7071067811865476"
_SQRT_2_PI = "0.7978845608028654"


def _clip_bounds(attrs: Mapping[str, Any]) -> tuple[float, float]:
    a_min = float_attr("clip", attrs, "a_min")
    a_max = float_attr("clip", attrs, "a_max")
    if a_min > a_max:
        raise attr_error("clip", "a_min", a_min, f"at most a_max = {a_max}")
    return a_min, a_max


def _clip_expr(attrs: Mapping[str, Any]) -> str:
    a_min, a_max = _clip_bounds(attrs)
    dtype = attrs.get(DTYPE_KEY)
    if dtype is not None and np.dtype(dtype).kind in "iu":
        # NOTE: as _clip_host does; a C cast of an out-of-range double (1e10 to int) is undefined.
        info = np.iinfo(dtype)
        a_min = int(max(min(a_min, info.max), info.min))
        a_max = int(max(min(a_max, info.max), info.min))
    expr = "{0}"
    # An infinite bound clips nothing; C has no portable literal for it.
    if math.isfinite(a_max):
        expr = f"({expr} > ({{T}})({a_max!r}) ? ({{T}})({a_max!r}) : {expr})"
    if math.isfinite(a_min):
        expr = f"({{0}} < ({{T}})({a_min!r}) ? ({{T}})({a_min!r}) : {expr})"
    return expr


def _leaky_relu_expr(attrs: Mapping[str, Any]) -> str:
    alpha = float_attr("leaky_relu", attrs, "alpha", 0.01)
    return f"({{0}} < 0 ? ({{T}})({alpha!r}) * {{0}} : {{0}})"


def _gelu_approximate(attrs: Mapping[str, Any]) -> str:
    return str_attr("gelu", attrs, "approximate", "none", ("none", "tanh"))


def _gelu_expr(attrs: Mapping[str, Any]) -> str:
    if _gelu_approximate(attrs) == "tanh":
        inner = f"({{T}}){_SQRT_2_PI} * ({{0}} + ({{T}})0.044715 * {{0}} * {{0}} * {{0}})"
        return f"(({{T}})0.5 * {{0}} * (({{T}})1 + tanh({inner})))"
    return f"(({{T}})0.5 * {{0}} * (({{T}})1 + erf({{0}} * ({{T}}){_SQRT1_2})))"


def _clip_host(attrs: Mapping[str, Any], spec: TensorSpec) -> Callable[..., None]:
    a_min, a_max = _clip_bounds(attrs)
    if np.dtype(spec.dtype).kind in "iu":
        # Integer data: the bounds become integers of the dtype's range, as a cast would.
        info = np.iinfo(spec.dtype)
        a_min = int(max(min(a_min, info.max), info.min))
        a_max = int(max(min(a_max, info.max), info.min))
    return lambda x, out: np.clip(x, a_min, a_max, out=out)


def _leaky_relu_host(attrs: Mapping[str, Any], spec: TensorSpec) -> Callable[..., None]:
    alpha = float_attr("leaky_relu", attrs, "alpha", 0.01)
    keep = np.empty(spec.shape, bool)  # where x >= 0: a workspace made once, not per call

    def run(x: Any, out: Any) -> None:
        np.multiply(x, alpha, out=out, casting="unsafe")
        np.greater_equal(x, 0, out=keep)
        np.copyto(out, x, where=keep)
    return run


def _erf_kernel(op: str, spec: TensorSpec) -> Callable[[Any, Any], None]:
    """erf(x, out) on the CPU with scipy's vectorized erf (NumPy has none)."""
    try:
        # NOTE: imported here, at prepare time: importing scipy.special is slow.
        from scipy.special import erf
    except ImportError as e:
        raise op_error(op, "the CPU kernel needs scipy; pip install 'scipy>=1.10'") from e
    if spec.dtype != "float16":
        return lambda x, out: erf(x, out=out)
    # NOTE: scipy has no float16 loop; a float32 workspace made once spares NumPy's cast buffers.
    work = np.empty(spec.shape, np.float32)

    def run(x: Any, out: Any) -> None:
        np.copyto(work, x)
        erf(work, out=work)
        np.copyto(out, work, casting="unsafe")
    return run


def _erf_host(attrs: Mapping[str, Any], spec: TensorSpec) -> Callable[..., None]:
    return _erf_kernel("erf", spec)


def _gelu_host(attrs: Mapping[str, Any], spec: TensorSpec) -> Callable[..., None]:
    if _gelu_approximate(attrs) == "tanh":
        def inner(x: Any, out: Any) -> None:
            # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
            np.multiply(x, x, out=out)
            np.multiply(out, 0.044715, out=out, casting="unsafe")
            np.add(out, 1, out=out)
            np.multiply(out, x, out=out)
            np.multiply(out, float(_SQRT_2_PI), out=out, casting="unsafe")
            np.tanh(out, out=out)
    else:
        erf = _erf_kernel("gelu", spec)

        def inner(x: Any, out: Any) -> None:
            # 0.5 x (1 + erf(x / sqrt(2)))
            np.multiply(x, float(_SQRT1_2), out=out, casting="unsafe")
            erf(out, out)

    def run(x: Any, out: Any) -> None:
        inner(x, out)
        np.add(out, 1, out=out)
        np.multiply(out, x, out=out)
        np.multiply(out, 0.5, out=out, casting="unsafe")
    return run


# host(attrs, input spec) -> run(x, out): the CPU kernel, workspace made once.
HostFactory = Callable[[Mapping[str, Any], TensorSpec], Callable[..., None]]
# op -> (C expression from attrs, host kernel maker, dtypes, attribute names)
UNARY_NN: dict[str, tuple[Callable[[Mapping[str, Any]], str], HostFactory, tuple[str, ...],
                          tuple[str, ...]]] = {
    "clip": (_clip_expr, _clip_host, NUMERIC_DTYPES, ("a_min", "a_max")),
    "leaky_relu": (_leaky_relu_expr, _leaky_relu_host, FLOAT_DTYPES, ("alpha",)),
    "gelu": (_gelu_expr, _gelu_host, FLOAT_DTYPES, ("approximate",)),
    "erf": (lambda attrs: "erf({0})", _erf_host, FLOAT_DTYPES, ()),
}


# ops whose NumPy kernel takes several passes: on the CPU one compiled pass (chain_jit.py) runs
# them unless GRAPH_RUNTIME_CHAIN_JIT=off (the NumPy kernel is the oracle the tests compare with)
COMPILED = ("gelu",)


def _unary_infer(op: str) -> Callable[..., list[TensorSpec]]:
    expr, _, dtypes, _ = UNARY_NN[op]

    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        check_num_inputs(op, inputs, 1)
        check_dtype(op, inputs[0], dtypes)
        expr(attrs)  # validates the attributes
        return [TensorSpec(tuple(inputs[0].shape), inputs[0].dtype)]
    return infer


def _unary_cpu(op: str) -> Callable[..., Callable[..., None]]:
    _, host, _, _ = UNARY_NN[op]

    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        if op in COMPILED and chain_jit.enabled():
            # gelu inside a chain (Whisper's conv -> gelu -> transpose): several NumPy
            # passes (48 us on 200x64 values), one compiled pass instead
            template = chain_jit.step_expr(op, attrs, inputs, outputs[0].dtype)
            if template is not None:
                return chain_jit.CompiledChain(inputs, outputs[0],
                                               [(template, [0], outputs[0].dtype)], [op])
        return host(attrs, inputs[0])
    return factory


def _unary_gpu(op: str) -> Callable[..., Callable[..., None]]:
    expr = UNARY_NN[op][0]

    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        step = (expr({**attrs, DTYPE_KEY: inputs[0].dtype}), [0], outputs[0].dtype)
        return gpu_elementwise(backend, device_id, inputs, outputs[0], [step], f"gr_{op}")
    return factory


for _op, (_expr, _host, _dtypes, _attrs) in UNARY_NN.items():
    # clip and erf are single ufunc calls (in place safe); leaky_relu and gelu read x again
    # after writing out.
    define_op(_op, _unary_infer(_op), 1, _attrs, in_place=_op in ("clip", "erf"))
    kernel(_op, "cpu")(_unary_cpu(_op))
    for _kind in ("cuda", "opencl"):
        kernel(_op, _kind)(_unary_gpu(_op))
    elementwise_expr(_op, _expr)


# -- where --------------------------------------------------------------------------------------

def _where_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    check_num_inputs("where", inputs, 3)
    check_dtype("where", inputs[0], WHERE_CONDITION_DTYPES, "condition")
    check_same_dtype("where", inputs[1:])
    check_dtype("where", inputs[1], NUMERIC_DTYPES, "x")
    shape = broadcast_shape("where", *(s.shape for s in inputs))
    return [TensorSpec(shape, inputs[1].dtype)]


def _where_factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                   outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    if backend.name != "cpu":
        step = ("({0} != 0 ? {1} : {2})", [0, 1, 2], outputs[0].dtype)
        return gpu_elementwise(backend, device_id, inputs, outputs[0], [step], "gr_where")
    if inputs[0].dtype == "bool":
        def run(condition: Any, x: Any, y: Any, out: Any) -> None:
            np.copyto(out, y)
            np.copyto(out, x, where=condition)
        return run
    chosen = np.empty(inputs[0].shape, bool)  # condition != 0: a workspace made once

    def run_numeric(condition: Any, x: Any, y: Any, out: Any) -> None:
        np.copyto(out, y)
        np.not_equal(condition, 0, out=chosen)
        np.copyto(out, x, where=chosen)
    return run_numeric


define_op("where", _where_infer, 3, ())
for _kind in REGISTRY:
    kernel("where", _kind)(_where_factory)
elementwise_expr("where", "({0} != 0 ? {1} : {2})")


# -- prelu --------------------------------------------------------------------------------------

PRELU_EXPR = "({0} < 0 ? {0} * {1} : {0})"


def _prelu_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    check_num_inputs("prelu", inputs, 2)
    check_same_dtype("prelu", inputs)
    check_dtype("prelu", inputs[0], FLOAT_DTYPES)
    # ONNX PRelu: slope broadcasts to x in one direction; the output keeps x's shape.
    shape = broadcast_shape("prelu", inputs[0].shape, inputs[1].shape)
    if shape != tuple(inputs[0].shape):
        raise op_error("prelu", f"slope {inputs[1]} must broadcast to x {inputs[0]} without "
                                f"growing it (the result would be {shape})")
    return [TensorSpec(shape, inputs[0].dtype)]


def _prelu_factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                   outputs: Sequence[TensorSpec],
                   attrs: Mapping[str, Any]) -> Callable[..., None]:
    if backend.name != "cpu":
        step = (PRELU_EXPR, [0, 1], outputs[0].dtype)
        return gpu_elementwise(backend, device_id, inputs, outputs[0], [step], "gr_prelu")
    negative = np.empty(inputs[0].shape, bool)  # workspace made once
    scaled = np.empty(inputs[0].shape, inputs[0].dtype)

    def run(x: Any, slope: Any, out: Any) -> None:
        np.less(x, 0, out=negative)
        np.multiply(x, slope, out=scaled)
        np.copyto(out, x)
        np.copyto(out, scaled, where=negative)
    return run


define_op("prelu", _prelu_infer, 2, ())
for _kind in REGISTRY:
    kernel("prelu", _kind)(_prelu_factory)
elementwise_expr("prelu", PRELU_EXPR)

__all__ = ["PRELU_EXPR", "UNARY_NN", "WHERE_CONDITION_DTYPES"]
