"""The kv_append op: a decoder's packed q, k, v projection made into its attention's operands
with a KV cache, in one pass: q and k rotated (the rotary op's rule), k's and v's heads moved
to head-major and appended to the past.

Inputs qkv (batch, tokens, width), past_k and past_v (batch, kv_heads, past, head_dim), cos and
sin (batch or 1, tokens or 1, rotary_dim). Attrs q_heads, kv_heads, head_dim, rotary_dim (even,
2 to head_dim; the rest of each head passed through), q_offset, k_offset, v_offset (the column
where each projection's heads start in qkv). Outputs q (batch, tokens, q_heads * head_dim) in
token layout, present_k and present_v (batch, kv_heads, past + tokens, head_dim): the past's
rows, then the new tokens'. frontend/fusion/fuse_kv_append.py forms it from the split, rotary,
reshape, transpose and concatenate ops a LLaMA-style decoder exported with past_key_values
lowers to: in a decode step those are seven small steps a layer, and each new past length made
the runtime re-point every one of them.
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
from .rotary import rotate_heads

OP = "kv_append"
ATTRS = ("q_heads", "kv_heads", "head_dim", "rotary_dim", "q_offset", "k_offset", "v_offset")


def _is_int(d: Any) -> bool:
    return isinstance(d, int)


def _fits(d: Any, full: Any) -> bool:
    """Whether dim d broadcasts to full (1 or full; symbolic dims compared only where the
    import can decide: 1 against a symbolic batch is not asked)."""
    return (_is_int(d) and d == 1) or d == full


def params(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The attrs checked against the inputs, and the outputs' shapes (symbolic dims kept)."""
    if len(inputs) != 5:
        raise op_error(OP, f"takes qkv, past_k, past_v, cos and sin, got {len(inputs)} inputs")
    check_same_dtype(OP, inputs)
    check_dtype(OP, inputs[0], ("float32", "float64"))
    qh, kvh = int_attr(OP, attrs, "q_heads"), int_attr(OP, attrs, "kv_heads")
    dim = int_attr(OP, attrs, "head_dim")
    rot = int_attr(OP, attrs, "rotary_dim", dim)
    offsets = {k: int_attr(OP, attrs, k) for k in ("q_offset", "k_offset", "v_offset")}
    if qh < 1 or kvh < 1 or dim < 1:
        raise op_error(OP, f"q_heads {qh}, kv_heads {kvh} and head_dim {dim} must be positive")
    if rot < 2 or rot % 2 or rot > dim:
        raise op_error(OP, f"rotary_dim {rot} must be even, from 2 to head_dim {dim}")
    qkv, past_k, past_v, cos, sin = inputs
    if len(qkv.shape) != 3:
        raise op_error(OP, f"qkv {qkv} must be (batch, tokens, width)")
    batch, tokens, width = qkv.shape
    for name, heads in (("q_offset", qh), ("k_offset", kvh), ("v_offset", kvh)):
        start = offsets[name]
        if start < 0 or (_is_int(width) and start + heads * dim > width):
            raise op_error(OP, f"qkv {qkv} has no columns [{start}, {start + heads * dim}) "
                               f"for {name}")
    for spec, name in ((past_k, "past_k"), (past_v, "past_v")):
        shape = tuple(spec.shape)  # (past_k's rank is checked before past_v reads its past)
        if len(shape) != 4 or shape[1] != kvh or shape[3] != dim or shape[0] != batch \
                or shape[2] != past_k.shape[2]:
            raise op_error(OP, f"{name} {spec} must be (batch {batch}, kv_heads {kvh}, past, "
                               f"head_dim {dim}) as past_k's")
    past = past_k.shape[2]
    for spec, name in ((cos, "cos"), (sin, "sin")):
        shape = tuple(spec.shape)
        if len(shape) != 3 or not _fits(shape[0], batch) or not _fits(shape[1], tokens) \
                or shape[2] != rot:
            raise op_error(OP, f"{name} {spec} does not broadcast to (batch, tokens, {rot})")
    return {"q_heads": qh, "kv_heads": kvh, "dim": dim, "rot": rot, **offsets,
            "q": (batch, tokens, qh * dim), "present": (batch, kvh, past + tokens, dim),
            "dtype": qkv.dtype}


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = params(inputs, attrs)
    return [TensorSpec(p["q"], p["dtype"]), TensorSpec(p["present"], p["dtype"]),
            TensorSpec(p["present"], p["dtype"])]


def _cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
         outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.cpu.kv_append import KvAppendKernel
    p = params(inputs, attrs)
    return KvAppendKernel(p["q_heads"], p["kv_heads"], p["dim"], p["rot"], p["q_offset"],
                          p["k_offset"], p["v_offset"])


def _host(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
          outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    """Against NumPy's API, for CuPy (cuda): the rotary op's passes over (batch, tokens,
    heads, dim) views, each product rounded before the sum, then the joins."""
    p = params(inputs, attrs)
    qh, kvh, dim, rot = p["q_heads"], p["kv_heads"], p["dim"], p["rot"]

    def run(qkv: Any, past_k: Any, past_v: Any, cos: Any, sin: Any, q: Any, present_k: Any,
            present_v: Any) -> None:
        batch, tokens = qkv.shape[0], qkv.shape[1]
        past = past_k.shape[2]
        c, s = cos[:, :, None], sin[:, :, None]

        def heads(offset: int, count: int) -> Any:
            return qkv[:, :, offset:offset + count * dim].reshape(batch, tokens, count, dim)

        rotate_heads(heads(p["q_offset"], qh), c, s, q.reshape(batch, tokens, qh, dim), rot)
        present_k[:, :, :past] = past_k
        # the new tokens' rows of present_k, seen token-major: rotated straight into place
        rotate_heads(heads(p["k_offset"], kvh), c, s,
                     present_k[:, :, past:].transpose(0, 2, 1, 3), rot)
        present_v[:, :, :past] = past_v
        present_v[:, :, past:] = heads(p["v_offset"], kvh).transpose(0, 2, 1, 3)
    return host_kernel(backend, device_id, run)


def _opencl(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
            outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ..kernels.opencl.kv_append import KvAppendCl
    p = params(inputs, attrs)
    shapes = [tuple(int(d) for d in spec.shape) for spec in inputs]
    return KvAppendCl(backend, device_id, p, shapes)  # type: ignore[arg-type]


define_op(OP, _infer, 5, ATTRS)
kernel(OP, "cpu")(_cpu)
kernel(OP, "opencl")(_opencl)
kernel(OP, "cuda")(_host)
