"""Registration of elementwise ops given as a NumPy kernel plus a C expression for the GPUs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..backends.base import Backend
from .attrs import DTYPE_KEY
from .kernels.gpu_elementwise import elementwise_expr, gpu_elementwise
from .library import TensorSpec
from .prepared import AnyShape
from .registry import define_op, kernel
from .shapes import broadcast_shape, check_dtype, check_num_inputs, check_same_dtype

# host(attrs, input specs) -> run(*inputs, out): the CPU kernel, workspace made once.
HostMaker = Callable[[Mapping[str, Any], Sequence[TensorSpec]], Callable[..., None]]
# expr(attrs) -> C expression template over {0}, {1}, ... and {T} (see gpu_elementwise); attrs
# hold DTYPE_KEY (input 0's dtype). It validates the attributes, so infer calls it too.
ExprFn = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class ExprOp:
    """One elementwise op: its CPU kernel, its C expression, dtypes, attrs and output dtype."""

    host: HostMaker
    expr: ExprFn
    dtypes: tuple[str, ...]
    attrs: tuple[str, ...] = ()
    out_dtype: str | None = None  # None: the input's dtype ("bool" for predicates)
    in_place: bool = False  # the CPU kernel reads each element before writing it


def ufunc(name: str) -> HostMaker:
    """The CPU kernel of a NumPy ufunc of any arity, writing into out."""
    fn = getattr(np, name)

    def make(attrs: Mapping[str, Any], inputs: Sequence[TensorSpec]) -> Callable[..., None]:
        return AnyShape(lambda *arrays: fn(*arrays[:-1], out=arrays[-1]))
    return make


def host_compute(compute: Callable[..., Any]) -> HostMaker:
    """The CPU kernel storing compute(attrs, *inputs) into out (a NumPy expression's result).

    float16 inputs are computed in float32, as the GPU kernels do (NumPy would round each step).
    """
    def make(attrs: Mapping[str, Any], inputs: Sequence[TensorSpec]) -> Callable[..., None]:
        wide = np.float32 if inputs[0].dtype == "float16" else None

        def run(*arrays: Any) -> None:
            args = arrays[:-1] if wide is None else [a.astype(wide) for a in arrays[:-1]]
            np.copyto(arrays[-1], compute(attrs, *args), casting="unsafe")
        return run
    return make


def literal(value: float) -> str:
    """A C literal of value in the compute type ({T}) for an expression template."""
    return f"(({{T}})({float(value)!r}))"


def _infer(name: str, op: ExprOp, arity: int) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        check_num_inputs(name, inputs, arity)
        dtype = check_same_dtype(name, inputs)
        check_dtype(name, inputs[0], op.dtypes)
        op.expr({**attrs, DTYPE_KEY: dtype})  # validates the attributes
        shape = broadcast_shape(name, *(s.shape for s in inputs))
        return [TensorSpec(shape, op.out_dtype or dtype)]
    return infer


def _siblings(name: str, family: Mapping[str, ExprOp], dtype: str, out_dtype: str,
              slots: list[int]) -> dict[str, list[tuple[str, list[int], str]]]:
    """The family's other kernels for these dtypes, with default attrs: one OpenCL program."""
    found = {}
    for other, op in family.items():
        if other == name or dtype not in op.dtypes or (op.out_dtype or dtype) != out_dtype:
            continue
        found[f"gr_{other}"] = [(op.expr({DTYPE_KEY: dtype}), slots, out_dtype)]
    return found


def _factory(name: str, op: ExprOp, family: Mapping[str, ExprOp]
             ) -> Callable[..., Callable[..., None]]:
    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        if backend.name == "cpu":
            return op.host(attrs, inputs)
        dtype = inputs[0].dtype
        slots = list(range(len(inputs)))
        step = (op.expr({**attrs, DTYPE_KEY: dtype}), slots, outputs[0].dtype)
        siblings = _siblings(name, family, dtype, outputs[0].dtype, slots)
        # NOTE: siblings only matter on OpenCL, where a family shares one slow program build.
        return gpu_elementwise(backend, device_id, inputs, outputs[0], [step], f"gr_{name}",
                               siblings if backend.name == "opencl" else None)
    return factory


def register_family(family: Mapping[str, ExprOp], arity: int) -> None:
    """define_op every op of family (arity inputs) with cpu, cuda and opencl kernels."""
    for name, op in family.items():
        define_op(name, _infer(name, op, arity), arity, op.attrs, in_place=op.in_place)
        for kind in ("cpu", "cuda", "opencl"):
            kernel(name, kind)(_factory(name, op, family))
        elementwise_expr(name, op.expr)

