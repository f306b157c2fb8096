"""The leading steps of a dense's elementwise tail (bias, residual add) as oneDNN matmul bias
and post-ops.

A CPU chain dense -> add -> add ran its tail as a second compiled pass over the product
(chain_jit.py); oneDNN's matmul applies bias and post-ops to each block of the product while it
is still in registers (ONNX Runtime's Gemm fuses its bias the same way). Only steps oneDNN
computes exactly as NumPy does are taken: one running value through adds and multiplies (one
rounding each) by a row of n values, one value or a whole (m, n) operand. The rest of the tail
stays compiled, run on each work item's rows right after its product (matmul.py): oneDNN's
eltwise post-ops differ from NumPy at the edges (gelu_erf gives NaN for +inf where the graph's
formula gives inf, relu gives 0 for NaN).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...library import TensorSpec
from . import abi

BINARY = {"add": abi.BINARY_ADD, "multiply": abi.BINARY_MUL}


@dataclass(frozen=True)
class PostOp:
    """One binary post-op with its operand (an index among MatmulTail.operands) read as one
    value, one row of n values (broadcast), or whole."""

    kind: str
    operand: int
    form: str  # "one", "row" or "full"


@dataclass(frozen=True)
class MatmulTail:
    """The tail's first `steps` steps as oneDNN sees them: the operand taken as bias (or -1),
    then the post-ops, reading `operands` operands."""

    steps: int
    bias: int
    post_ops: tuple[PostOp, ...]
    operands: tuple[int, ...]  # the tail's free inputs they are
    ops: tuple[str, ...]  # the graph's op names, for `graphrun profile`


def _form(spec: TensorSpec, m: int, n: int) -> str:
    """How an operand broadcasts against the (m, n) product, or "" when oneDNN cannot read it."""
    size = 1
    for d in spec.shape:
        size *= int(d)
    if spec.dtype != "float32":
        return ""
    if size == 1:
        return "one"
    if size == n and int(spec.shape[-1]) == n:
        return "row"
    if size == m * n and len(spec.shape) >= 1 and int(spec.shape[-1]) == n:
        return "full"
    return ""


def matmul_tail(ops: Sequence[str], refs: Sequence[Sequence[tuple[str, int]]],
                specs: Sequence[TensorSpec], product: int, m: int, n: int) -> MatmulTail:
    """The longest run of leading tail steps oneDNN computes exactly, as bias and post-ops.

    Args:
        ops: each step's op.
        refs: each step's inputs, ("input", i) for the tail's free input i or ("step", j) for
            step j's result (chain._tail_operands).
        specs: the tail's free inputs; input `product` is the product itself.
        m, n: the product's rows and columns.
    Returns:
        The steps taken; their operands are numbered in the order they are first read. The
        steps after them may read only the last one's result: the product and the values
        between are never written anywhere.
    """
    steps = 0
    for k, (op, step_refs) in enumerate(zip(ops, refs)):
        running = ("input", product) if k == 0 else ("step", k - 1)
        others = [r for r in step_refs if r != running]
        if list(step_refs).count(running) != 1 or op not in BINARY or len(others) != 1 \
                or others[0][0] != "input" or others[0][1] == product \
                or not _form(specs[others[0][1]], m, n):
            break
        steps += 1
    while steps and any(r == ("input", product) or (r[0] == "step" and r[1] < steps - 1)
                        for later in refs[steps:] for r in later):
        steps -= 1
    operands: list[int] = []
    bias = -1
    post: list[PostOp] = []
    for k in range(steps):
        running = ("input", product) if k == 0 else ("step", k - 1)
        free = next(i for what, i in refs[k] if (what, i) != running)
        form = _form(specs[free], m, n)
        if free not in operands:
            operands.append(free)
        if ops[k] == "add" and k == 0 and form == "row":
            bias = operands.index(free)  # oneDNN adds its bias before any post-op
        else:
            post.append(PostOp(ops[k], operands.index(free), form))
    return MatmulTail(steps, bias, tuple(post), tuple(operands), tuple(ops[:steps]))


def append_post_ops(lib: Any, handle: Any, tail: MatmulTail, mds: Sequence[Any]) -> None:
    """Append tail's post-ops to a dnnl_post_ops_t; mds: each one's operand descriptor."""
    for op, md in zip(tail.post_ops, mds):
        lib.call("dnnl_post_ops_append_binary", handle, BINARY[op.kind], md.handle)
