"""The glu op: a gated MLP's activation, act(gate half) * other half, of one product's output.

LLaMA, Qwen2, Mistral and T5 v1.1 compute act(x W_gate) * (x W_up) with two products of one
input; Phi-3 packs both weights into one product and splits its output. The import's gated-mlp
pass packs the two products into one (a product twice as wide, one call) and puts this op after
it, in place of the split, the activation and the multiply (frontend/fusion/fuse_gated.py).

Input x (..., 2 * units). Attrs: activation (silu, gelu, relu or sigmoid, computed as that op
computes it), approximate (gelu's: none or tanh), gate (first or second: which half goes
through the activation). Output (..., units): out[..., j] = act(x[..., g + j]) * x[..., u + j]
with g, u = 0, units (gate first) or units, 0.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...backends.base import Backend
from ..attrs import op_error, str_attr
from ..kernels.host import array_module, host_kernel
from ..library import TensorSpec
from ..registry import define_op, get_op, kernel
from ..shapes import FLOAT_DTYPES, check_dtype

ATTRS = ("activation", "approximate", "gate")
ACTIVATIONS = ("silu", "gelu", "relu", "sigmoid")


def params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The op's checked inputs and attrs: activation, its attrs, units, the halves' offsets."""
    op = "glu"
    if len(inputs) != 1:
        raise op_error(op, f"takes one input, got {len(inputs)}")
    x = inputs[0]
    check_dtype(op, x, FLOAT_DTYPES)
    activation = str_attr(op, attrs, "activation", choices=ACTIVATIONS)
    approximate = str_attr(op, attrs, "approximate", "none", ("none", "tanh"))
    gate = str_attr(op, attrs, "gate", "first", ("first", "second"))
    if not x.shape:
        raise op_error(op, f"x {x} has no last axis to halve")
    width = x.shape[-1]
    if not isinstance(width, int) or width < 2 or width % 2:
        raise op_error(op, f"x {x}: its last axis must be an even number of columns, got "
                           f"{width}")
    units = width // 2
    return {"activation": activation,
            "act_attrs": {"approximate": approximate} if activation == "gelu" else {},
            "units": units, "gate": 0 if gate == "first" else units,
            "up": units if gate == "first" else 0,
            "out": (*x.shape[:-1], units), "dtype": x.dtype}


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = params(inputs, attrs)
    return [TensorSpec(p["out"], p["dtype"])]


def _cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
         outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.cpu import chain_jit
    from ..kernels.cpu.glu import GluKernel, activation_expr
    p = params(inputs, attrs)
    if chain_jit.enabled():
        expr = activation_expr(p["activation"], p["act_attrs"], p["dtype"])
        if expr is not None:
            return GluKernel(p["activation"], expr, p["dtype"], p["gate"] == 0)
    return _host(backend, device_id, inputs, outputs, attrs)


def _host(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
          outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    """The activation op's own kernel on this backend over the gate half (copied into a
    workspace), then the product with the other half: NumPy's (the oracle) and CuPy's."""
    xp, p = array_module(backend), params(inputs, attrs)
    half = TensorSpec(p["out"], p["dtype"])
    act = get_op(p["activation"]).kernels[backend.name](backend, device_id, [half], [half],
                                                         p["act_attrs"])
    units, g, u = p["units"], p["gate"], p["up"]
    # NOTE: made at the first call, inside host_kernel's device scope (CuPy allocates on the
    # current device; the factory may run with another one current)
    work: list[Any] = []

    def run(x: Any, out: Any) -> None:
        if not work:
            work.append(xp.empty(half.shape, half.dtype))
        xp.copyto(work[0], x[..., g:g + units])
        act(work[0], out)
        xp.multiply(out, x[..., u:u + units], out=out)
    return host_kernel(backend, device_id, run)


def _opencl(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
            outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.opencl.glu import GluCl
    p = params(inputs, attrs)
    return GluCl(backend, device_id,  # type: ignore[arg-type]
                 p["dtype"], p["activation"], p["act_attrs"], p["units"], p["gate"], p["up"],
                 outputs[0])


define_op("glu", _infer, 1, ATTRS)
kernel("glu", "cpu")(_cpu)
kernel("glu", "opencl")(_opencl)
kernel("glu", "cuda")(_host)
