"""The rotary op: rotary position embedding of a projection's heads, read and written in token
layout, as LLaMA-style decoders apply it to q and k (x * cos + rotate_half(x) * sin).

Inputs x (batch, tokens, width), cos and sin (batch or 1, tokens or 1, rotary_dim). Attrs
num_heads, head_dim, rotary_dim (head_dim; even, at most head_dim: GPT-NeoX's and Phi's partial
rotary, the rest of each head passed through), offset (0): the heads are columns [offset, offset
+ num_heads * head_dim) of x. Output (batch, tokens, num_heads * head_dim): per head, with
half = rotary_dim / 2, out[j] = x[j] * cos[j] - x[j + half] * sin[j] for j < half,
x[j] * cos[j] + x[j - half] * sin[j] for half <= j < rotary_dim, x[j] beyond.
frontend/fusion/fuse_rotary.py forms it from the exporters' slice/neg/concat/mul/add pattern.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...backends.base import Backend
from ..attrs import int_attr, op_error
from ..kernels.host import host_kernel
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import check_dtype, check_same_dtype

ATTRS = ("num_heads", "head_dim", "rotary_dim", "offset")


def _params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> dict[str, Any]:
    op = "rotary"
    if len(inputs) != 3:
        raise op_error(op, f"takes x, cos and sin, got {len(inputs)} inputs")
    check_same_dtype(op, inputs)
    check_dtype(op, inputs[0], ("float32", "float64"))
    heads, dim = int_attr(op, attrs, "num_heads"), int_attr(op, attrs, "head_dim")
    rot, offset = int_attr(op, attrs, "rotary_dim", dim), int_attr(op, attrs, "offset", 0)
    if heads < 1 or dim < 1:
        raise op_error(op, f"num_heads {heads} and head_dim {dim} must be positive")
    if rot < 2 or rot % 2 or rot > dim:
        raise op_error(op, f"rotary_dim {rot} must be even, from 2 to head_dim {dim}")
    x, cos, sin = inputs
    if len(x.shape) != 3:
        raise op_error(op, f"x {x} must be (batch, tokens, width)")
    batch, tokens, width = (int(d) for d in x.shape)
    if offset < 0 or offset + heads * dim > width:
        raise op_error(op, f"x {x} has no columns [{offset}, {offset + heads * dim})")
    for spec, name in ((cos, "cos"), (sin, "sin")):
        shape = tuple(int(d) for d in spec.shape)
        if len(shape) != 3 or shape[0] not in (1, batch) or shape[1] not in (1, tokens) \
                or shape[2] != rot:
            raise op_error(op, f"{name} {spec} does not broadcast to ({batch}, {tokens}, {rot})")
    return {"heads": heads, "dim": dim, "rot": rot, "offset": offset,
            "out": (batch, tokens, heads * dim), "dtype": x.dtype}


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = _params(inputs, attrs)
    return [TensorSpec(p["out"], p["dtype"])]


def _cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
         outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.cpu.rotary import RotaryKernel
    p = _params(inputs, attrs)
    return RotaryKernel(p["heads"], p["dim"], p["rot"], p["offset"])


def rotate_heads(xh: Any, c: Any, s: Any, oh: Any, rot: int) -> None:
    """oh = the rule above over (..., heads, dim) views in NumPy's API (CuPy too), cos and sin
    broadcast over the heads: each product rounded before the sum, as the exporters' ops do."""
    half = rot // 2
    oh[..., :half] = xh[..., :half] * c[..., :half] - xh[..., half:rot] * s[..., :half]
    oh[..., half:rot] = xh[..., half:rot] * c[..., half:] + xh[..., :half] * s[..., half:]
    oh[..., rot:] = xh[..., rot:]


def _host(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
          outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    """Against NumPy's API, for CuPy (cuda): a few passes over (batch, tokens, heads, dim)
    views (rotate_heads)."""
    p = _params(inputs, attrs)
    heads, dim, rot, off = p["heads"], p["dim"], p["rot"], p["offset"]
    batch, tokens = p["out"][:2]

    def run(x: Any, cos: Any, sin: Any, out: Any) -> None:
        rotate_heads(x[:, :, off:off + heads * dim].reshape(batch, tokens, heads, dim),
                     cos[:, :, None], sin[:, :, None], out.reshape(batch, tokens, heads, dim),
                     rot)
    return host_kernel(backend, device_id, run)


def _opencl(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
            outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.opencl.rotary import RotaryCl
    p = _params(inputs, attrs)
    shapes = [tuple(int(d) for d in spec.shape) for spec in inputs]
    return RotaryCl(backend, device_id, p["dtype"], p["heads"], p["dim"],  # type: ignore[arg-type]
                    p["rot"], p["offset"], *shapes)


define_op("rotary", _infer, 3, ATTRS)
kernel("rotary", "cpu")(_cpu)
kernel("rotary", "opencl")(_opencl)
kernel("rotary", "cuda")(_host)
