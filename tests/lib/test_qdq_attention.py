"""qdq_attention against the QDQ graph's steps written out in NumPy: the operands through their
tables, float32 products, the scores quantized, qadd's table with the mask, softmax of the DQ'd
sum, the probabilities quantized and mapped, the context quantized back to (batch, tokens,
width). Softmax's exp is NumPy's here and exp32 in the kernel: a probability on a half-step
boundary may move one step, nothing more."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import GraphRuntimeError
from graph_runtime.lib.kernels.cpu.quantized import qadd_table
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.ops.qdq_attention import _cpu, _infer

B, H, S, D = 2, 3, 8, 5


def _q(x: np.ndarray, scale: float, zero: int, dtype: str) -> np.ndarray:
    lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
    q = np.rint(x / np.float32(scale)).astype(np.int32) + zero
    return np.clip(q, lo, hi).astype(dtype)


def _reference(q, k, v, mask, tables, attrs) -> np.ndarray:
    tq, tk, tv, tadd, ta, tp = tables

    def heads(x, table):
        return table[x.view(np.uint8)].reshape(B, S, H, D).transpose(0, 2, 1, 3)
    scores = np.matmul(heads(q, tq), heads(k, tk).transpose(0, 1, 3, 2))
    s8 = _q(scores, attrs["s_scale"], attrs["s_zero"], attrs["s_dtype"])
    index = (s8.view(np.uint8).astype(np.int64) << 8) | mask.view(np.uint8)
    u = ta[tadd.view(np.uint8)[index]]
    e = np.exp(u - u.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    p8 = _q(p, attrs["p_scale"], attrs["p_zero"], attrs["p_dtype"])
    ctx = np.matmul(tp[p8.view(np.uint8)], heads(v, tv))
    y = _q(ctx, attrs["y_scale"], attrs["y_zero"], attrs["y_dtype"])
    return y.transpose(0, 2, 1, 3).reshape(B, S, H * D)


@pytest.mark.parametrize("dtype,mask_shape", [("int8", (B, 1, S, S)), ("uint8", (1, 1, 1, S))])
def test_qdq_attention_is_the_graphs_steps(dtype, mask_shape) -> None:
    rng = np.random.default_rng(41)
    lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
    q, k, v = (rng.integers(lo, hi + 1, (B, S, H * D)).astype(dtype) for _ in range(3))
    mask = rng.choice(np.array([lo, 0], np.int64), mask_shape).astype(dtype)
    tables = [(rng.standard_normal(256) * 0.3).astype(np.float32) for _ in range(3)]
    tables.append(qadd_table((0.05, 1.0, 0.06), (3, 0, -2), False, dtype, dtype, dtype))
    tables.append((np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32) * 0.06))
    tables.append((np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32) + 128) / 255)
    attrs = {"heads": H, "s_scale": 0.05, "s_zero": 3, "s_dtype": dtype, "p_scale": 1 / 255,
             "p_zero": lo, "p_dtype": dtype, "y_scale": 0.1, "y_zero": 1, "y_dtype": dtype}
    arrays = [q, k, v, mask, *tables]
    specs = [TensorSpec(a.shape, str(a.dtype)) for a in arrays]
    (spec,) = _infer(specs, attrs)
    assert spec == TensorSpec((B, S, H * D), dtype)
    kernel = _cpu(None, 0, specs, [spec], attrs)
    out = np.empty((B, S, H * D), dtype)
    for _ in range(2):  # scratch arrays reused
        kernel(*arrays, out)
    want = _reference(q, k, v, mask, tables, attrs)
    steps = np.abs(out.astype(np.int64) - want.astype(np.int64))
    assert steps.max() <= 1 and np.mean(steps == 0) > 0.95, (steps.max(), np.mean(steps == 0))


def test_qdq_attention_refuses_a_mask_of_another_shape() -> None:
    specs = [TensorSpec((B, S, H * D), "int8")] * 3 + [TensorSpec((B, 2, S, S), "int8")]
    specs += [TensorSpec((256,), "float32")] * 3 + [TensorSpec((65536,), "int8")]
    specs += [TensorSpec((256,), "float32")] * 2
    attrs = {"heads": H, "s_dtype": "int8", "p_dtype": "int8", "y_dtype": "int8"}
    with pytest.raises(GraphRuntimeError, match=r"input 3 \(mask\) is \(2, 2, 8, 8\)"):
        _infer(specs, attrs)
