"""The elementwise tail a CPU conv2d applies in place to each output block (bias, add, relu, clip).

A chain conv2d -> add -> relu (TVM's fused conv2d_add_nn_relu) hands its trailing ops to the conv
kernel (lib/chain.py), which applies them to out[n] right after that image's GEMM, while the
block is still in cache, instead of three passes over the whole output.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

EPILOGUE_OPS = ("add", "relu", "clip")
EPILOGUE_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class EpilogueOp:
    """One op: add (operand = index among the kernel's extra inputs, shape = its 4-D shape),
    relu, or clip between lo and hi."""

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

    @staticmethod
    def build(ops: Sequence[tuple[str, Any]], operand_shapes: Sequence[tuple[int, ...]],
              out_shape: tuple[int, ...]) -> "Epilogue":
        """From (kind, detail) pairs: add's detail is its operand index, clip's (lo, hi)."""
        made = []
        for kind, detail in ops:
            if kind == "add":
                shape = tuple(operand_shapes[detail])
                shape = (1,) * (4 - len(shape)) + shape
                made.append(EpilogueOp("add", detail, shape))
            elif kind == "clip":
                made.append(EpilogueOp("clip", lo=detail[0], hi=detail[1]))
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
        it when rows / channels are given); extras are the kernel's extra inputs."""
        if not self.ops:
            return
        k0, k1 = channels or (0, out.shape[1])
        r0, r1 = rows or (0, out.shape[2])
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
            else:
                np.clip(block, op.lo, op.hi, out=block)
