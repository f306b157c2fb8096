"""Conv epilogues (lib/kernels/conv_epilogue.py): the compiled one-pass path against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.lib.kernels import conv_epilogue
from graph_runtime.lib.kernels.conv_epilogue import Epilogue

SHAPE = (2, 5, 4, 19)
# (ops, operand shapes, reference(y, bias, residual))
CASES = {
    "bias_relu": ([("add", 0), ("relu", None)], [(5, 1, 1)],
                  lambda y, ops: np.maximum(y + ops[0], 0)),
    "bias_clip": ([("add", 0), ("clip", (0.0, 6.0))], [(1, 5, 1, 1)],
                  lambda y, ops: np.clip(y + ops[0], 0, 6)),
    "residual_relu": ([("add", 0), ("relu", None)], [SHAPE],
                      lambda y, ops: np.maximum(y + ops[0], 0)),
    "bias_residual_clips": ([("add", 0), ("add", 1), ("relu", None), ("clip", (-1.0, 0.5))],
                            [(5, 1, 1), (1, 5, 4, 1)],
                            lambda y, ops: np.clip(np.maximum(y + ops[0] + ops[1], 0), 0, 0.5)),
    "row_broadcast": ([("add", 0), ("relu", None)], [(1, 1, 1, 19)],
                      lambda y, ops: np.maximum(y + ops[0], 0)),
    "scalar_residual": ([("add", 0), ("add", 1)], [(5, 1, 1), (2, 1, 1, 1)],
                        lambda y, ops: y + ops[0] + ops[1]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("block", [None, "rows", "channels"])
@pytest.mark.parametrize("compiled", [True, False])
def test_one_pass_matches_numpy(name, dtype, block, compiled, random_array, monkeypatch) -> None:
    """Both paths (the size limits set so that each block takes the one asked for)."""
    monkeypatch.setattr(conv_epilogue, "ONE_PASS_MIN_SIZE", 1 if compiled else 1 << 40)
    ops, shapes, reference = CASES[name]
    epilogue = Epilogue.build(ops, shapes, SHAPE)
    assert epilogue.one_pass
    y = random_array(SHAPE, dtype, seed=1)
    y[0, 1, 2, 3] = np.nan  # stays NaN, as np.maximum and np.clip keep it
    operands = [random_array(s, dtype, seed=2 + i) for i, s in enumerate(shapes)]
    got = y.copy()
    want = reference(y, [o.reshape((1,) * (4 - o.ndim) + o.shape) for o in operands])
    if block == "rows":
        epilogue.apply(got, 1, 2, operands, rows=(1, 3))
        keep = np.ones(SHAPE, bool)
        keep[1, :, 1:3] = False
    elif block == "channels":
        epilogue.apply(got, 0, 2, operands, channels=(2, 4))
        keep = np.ones(SHAPE, bool)
        keep[:, 2:4] = False
    else:
        epilogue.apply(got, 0, 2, operands)
        keep = np.zeros(SHAPE, bool)
    expected = np.where(keep, y, want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-6 if dtype == "float32" else 1e-12)


def test_ops_that_do_not_fold_take_numpy() -> None:
    epilogue = Epilogue.build([("relu", None), ("add", 0)], [(5, 1, 1)], SHAPE)
    assert not epilogue.one_pass
    y = np.linspace(-1, 1, int(np.prod(SHAPE)), dtype="float32").reshape(SHAPE)
    bias = np.arange(5, dtype="float32").reshape(5, 1, 1)
    got = y.copy()
    epilogue.apply(got, 0, 2, [bias])
    np.testing.assert_allclose(got, np.maximum(y, 0) + bias)
