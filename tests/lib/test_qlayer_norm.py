"""qadd_layer_norm against NumPy: qadd's table, the DQ, layer_norm in float64 rounded to float32,
then QuantizeLinear's steps. The kernel sums in float64 vector lanes: a value on a half-step tie
may land one step away, nothing more."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import GraphRuntimeError
from graph_runtime.lib.kernels.cpu.quantized import qadd_table
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.ops.qlayer_norm import _cpu, _infer


@pytest.mark.parametrize("dtype,b_shape", [("int8", (2, 7, 48)), ("uint8", (2, 7, 48)),
                                           ("int8", (1, 7, 48)), ("uint8", (48,))])
def test_qadd_layer_norm_is_the_graphs_steps(dtype, b_shape) -> None:
    """b of a's shape, or of its trailing dims (BERT's position embeddings) repeated."""
    rng = np.random.default_rng(61)
    lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
    a = rng.integers(lo, hi + 1, (2, 7, 48)).astype(dtype)
    b = rng.integers(lo, hi + 1, b_shape).astype(dtype)
    table = qadd_table((0.03, 0.02, 0.04), (3, -2 if dtype == "int8" else 5, 1), False, dtype,
                       dtype, "int8")
    x_table = (np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32) - 1) * \
        np.float32(0.04)
    sums = x_table[table.view(np.uint8).astype(np.int64)]
    gamma = rng.uniform(0.5, 1.5, 48).astype(np.float32)
    beta = rng.uniform(-0.2, 0.2, 48).astype(np.float32)
    attrs = {"epsilon": 1e-5, "y_scale": 0.02, "y_zero": -3, "y_dtype": "int8"}
    arrays = [a, b, sums, gamma, beta]
    specs = [TensorSpec(v.shape, str(v.dtype)) for v in arrays]
    (spec,) = _infer(specs, attrs)
    out = np.empty(a.shape, np.int8)
    _cpu(None, 0, specs, [spec], attrs)(*arrays, out)
    index = (a.view(np.uint8).astype(np.int64) << 8) | np.broadcast_to(b, a.shape).view(np.uint8)
    x = x_table[table.view(np.uint8)[index]].astype(np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    normed = ((x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
              * gamma + beta).astype(np.float32)
    q = np.rint(normed / np.float32(0.02)).astype(np.int32) - 3
    want = np.clip(q, -128, 127)
    steps = np.abs(out.astype(np.int64) - want)
    assert steps.max() <= 1 and np.mean(steps == 0) > 0.99


def test_qadd_layer_norm_refuses_operands_of_two_shapes() -> None:
    specs = [TensorSpec((2, 8), "int8"), TensorSpec((2, 1), "int8"),
             TensorSpec((65536,), "float32"), TensorSpec((8,), "float32"),
             TensorSpec((8,), "float32")]
    with pytest.raises(GraphRuntimeError, match=r"a \(2, 8\) and b \(2, 1\)"):
        _infer(specs, {"epsilon": 1e-5, "y_scale": 0.1, "y_zero": 0, "y_dtype": "int8"})
