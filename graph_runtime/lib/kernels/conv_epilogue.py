"""The elementwise tail a CPU conv2d applies in place to each output block (bias, add, relu, clip).

A chain conv2d -> add -> relu (TVM's fused conv2d_add_nn_relu) hands its trailing ops to the conv
kernel (lib/chain.py), which applies them to out[n] right after that image's GEMM, while the
block is still in cache, instead of three passes over the whole output.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Sequence

import numpy as np

EPILOGUE_OPS = ("add", "relu", "clip", "leaky_relu", "sigmoid", "silu", "hard_swish", "gelu")
EPILOGUE_DTYPES = ("float32", "float64")
# as NumPy dtypes, for a check on each call (a dtype's .name costs 1.6 us)
_EPILOGUE_NUMPY = tuple(np.dtype(name) for name in EPILOGUE_DTYPES)
# The compiled pass replaces two or more NumPy passes over blocks of at least
# ONE_PASS_MIN_SIZE elements in rows of at least ONE_PASS_MIN_WIDTH; elsewhere NumPy's SIMD
# passes win: short rows and small blocks gain nothing, a lone relu gains nothing, and each
# compiled call has a fixed cost that im2col's many small row blocks would pay over and over
# (docs/measurements.md).
ONE_PASS_MIN_WIDTH = 16
ONE_PASS_MIN_SIZE = 1 << 15


@dataclass(frozen=True)
class EpilogueOp:
    """One op: add (operand = index among the kernel's extra inputs, shape = its 4-D shape),
    relu, clip between lo and hi, leaky_relu (slope lo), sigmoid, silu, hard_swish, gelu (erf)
    or gelu_tanh."""

    kind: str
    operand: int = -1
    shape: tuple[int, ...] = ()
    lo: float = 0.0
    hi: float = 0.0


@dataclass(frozen=True)
class Epilogue:
    """Ops applied in order to the conv's output; out_shape is (N, K, OH, OW)."""

    ops: tuple[EpilogueOp, ...] = ()
    out_shape: tuple[int, ...] = ()

    @cached_property
    def folded(self) -> tuple[int | None, EpilogueOp | None, float, float, Epilogue]:
        """fold_epilogue(self), worked out once."""
        return fold_epilogue(self)

    @cached_property
    def one_pass(self) -> bool:
        """Whether every op folds into fold_epilogue's bias, residual and clamp."""
        return not self.folded[4].ops

    @staticmethod
    def build(ops: Sequence[tuple[str, Any]], operand_shapes: Sequence[tuple[int, ...]],
              out_shape: tuple[int, ...]) -> "Epilogue":
        """From (kind, detail) pairs: add's detail is its operand index, clip's (lo, hi),
        leaky_relu's its alpha, gelu's its approximate ("none" or "tanh")."""
        made = []
        for kind, detail in ops:
            if kind == "add":
                shape = tuple(operand_shapes[detail])
                shape = (1,) * (4 - len(shape)) + shape
                made.append(EpilogueOp("add", detail, shape))
            elif kind == "clip":
                made.append(EpilogueOp("clip", lo=detail[0], hi=detail[1]))
            elif kind == "leaky_relu":
                made.append(EpilogueOp("leaky_relu", lo=float(detail)))
            elif kind == "gelu":
                made.append(EpilogueOp("gelu_tanh" if detail == "tanh" else "gelu"))
            else:
                made.append(EpilogueOp(kind))
        return Epilogue(tuple(made), tuple(out_shape))

    def channel_bias(self) -> int | None:
        """Operand index of a leading per-channel add (a bias a GEMM can fold in), else None."""
        if not self.ops or self.ops[0].kind != "add":
            return None
        shape = self.ops[0].shape
        k = self.out_shape[1]
        if shape[0] == 1 and shape[2] == 1 and shape[3] == 1 and shape[1] == k:
            return self.ops[0].operand
        return None

    def without(self, bias: int | None) -> "Epilogue":
        """The epilogue after the leading bias add was folded into the GEMM."""
        if bias is None:
            return self
        return replace(self, ops=self.ops[1:])

    def apply(self, out: Any, n0: int, n1: int, extras: Sequence[Any],
              rows: tuple[int, int] | None = None,
              channels: tuple[int, int] | None = None) -> None:
        """Apply every op in place to out[n0:n1] (only output rows r0:r1 and channels k0:k1 of
        it when rows / channels are given); extras are the kernel's extra inputs.

        Two or more of a bias, a residual add and relu/clip (what conv chains end with) on a
        large enough block go through one compiled pass (epilogue_jit.py) instead of a NumPy
        pass per op over a block that may no longer sit in cache.
        """
        if not self.ops:
            return
        k0, k1 = channels or (0, out.shape[1])
        r0, r1 = rows or (0, out.shape[2])
        if (len(self.ops) > 1 and self.one_pass and out.shape[3] >= ONE_PASS_MIN_WIDTH
                and (n1 - n0) * (k1 - k0) * (r1 - r0) * out.shape[3] >= ONE_PASS_MIN_SIZE
                and out.dtype in _EPILOGUE_NUMPY):
            _one_pass()(self.folded, out, extras, n0, n1, k0, k1, r0, r1)
            return
        block = out[n0:n1, k0:k1, r0:r1]
        for op in self.ops:
            if op.kind == "add":
                operand = extras[op.operand]
                if operand.shape != op.shape:
                    operand = operand.reshape(op.shape)
                if op.shape[0] != 1:
                    operand = operand[n0:n1]
                if op.shape[1] != 1:
                    operand = operand[:, k0:k1]
                if op.shape[2] != 1:
                    operand = operand[:, :, r0:r1]
                np.add(block, operand, out=block)
            elif op.kind == "relu":
                np.maximum(block, 0, out=block)
            elif op.kind == "clip":
                np.clip(block, op.lo, op.hi, out=block)
            else:
                activation(op, block)


_SQRT1_2 = 0.7071067811865476
_SQRT_2_PI = 0.7978845608028654


def activation(op: EpilogueOp, block: Any) -> None:
    """leaky_relu, sigmoid, silu, hard_swish or gelu of block in place, by the formulas of the ops'
    own CPU kernels (ops/activation.py, elementwise.py, activation_ext.py)."""
    if op.kind == "leaky_relu":
        np.multiply(block, op.lo, out=block, where=block < 0)
    elif op.kind == "sigmoid":
        # 0.5 * (1 + tanh(x / 2)) never overflows, unlike 1 / (1 + exp(-x))
        np.multiply(block, 0.5, out=block)
        np.tanh(block, out=block)
        np.multiply(block, 0.5, out=block)
        np.add(block, 0.5, out=block)
    elif op.kind == "silu":
        np.multiply(block, np.tanh(block * 0.5) * 0.5 + 0.5, out=block)
    elif op.kind == "hard_swish":
        np.multiply(block, np.clip(block / 6 + 0.5, 0, 1), out=block)
    elif op.kind == "gelu":
        from scipy.special import erf  # NOTE: scipy.special takes ~0.3 s to import
        np.multiply(block, 0.5 * (1 + erf(block * _SQRT1_2)), out=block)
    elif op.kind == "gelu_tanh":
        inner = _SQRT_2_PI * (block + 0.044715 * block * block * block)
        np.multiply(block, 0.5 * (1 + np.tanh(inner)), out=block)
    else:
        raise AssertionError(f"no epilogue op {op.kind!r}")


def fold_epilogue(epilogue: Epilogue) -> tuple[int | None, EpilogueOp | None, float, float,
                                                Epilogue]:
    """Split off what one compiled pass applies: (bias, residual add, lo, hi, what remains).

    The pass does a leading per-channel bias, then one add of any broadcast operand, then the
    relu/clip ops after it merged into one clamp (clip(clip(y, a, b), c, d) is y clamped to
    [max(a, c), min(max(b, c), d)]); the ops after those remain for Epilogue.apply.
    """
    bias = epilogue.channel_bias()
    ops = list(epilogue.without(bias).ops)
    residual = ops.pop(0) if ops and ops[0].kind == "add" else None
    lo, hi = -np.inf, np.inf
    while ops and ops[0].kind in ("relu", "clip"):
        op = ops.pop(0)
        op_lo, op_hi = (0.0, np.inf) if op.kind == "relu" else (op.lo, op.hi)
        lo, hi = max(lo, op_lo), min(max(hi, op_lo), op_hi)
    return bias, residual, lo, hi, replace(epilogue, ops=tuple(ops))


def _one_pass() -> Any:
    """epilogue_jit.apply_folded, imported on first use (numba loads only when needed)."""
    from .cpu.epilogue_jit import apply_folded
    return apply_folded

