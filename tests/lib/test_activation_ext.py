"""ONNX activations (softplus ... thresholded_relu) and silu against float64 references of their
specs."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec

SELU_ALPHA = 1.67326319217681884765625
SELU_GAMMA = 1.05070102214813232421875


def _hard_sigmoid(x: np.ndarray, alpha: float = 0.2, beta: float = 0.5) -> np.ndarray:
    return np.maximum(0, np.minimum(1, alpha * x + beta))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.log(np.exp(x) + 1)


# (op, attrs, float64 reference written from the ONNX operator definitions)
CASES = [
    ("softplus", {}, _softplus),
    ("softsign", {}, lambda x: x / (1 + np.abs(x))),
    ("hard_sigmoid", {}, _hard_sigmoid),
    ("hard_sigmoid", {"alpha": 0.5, "beta": 0.6}, lambda x: _hard_sigmoid(x, 0.5, 0.6)),
    ("hard_swish", {}, lambda x: x * _hard_sigmoid(x, 1 / 6, 0.5)),
    ("silu", {}, lambda x: x / (1 + np.exp(-x))),
    ("elu", {}, lambda x: np.where(x < 0, np.exp(x) - 1, x)),
    ("elu", {"alpha": 2.0}, lambda x: np.where(x < 0, 2 * (np.exp(x) - 1), x)),
    ("selu", {}, lambda x: np.where(x <= 0, SELU_GAMMA * SELU_ALPHA * (np.exp(x) - 1),
                                    SELU_GAMMA * x)),
    ("selu", {"alpha": 2.0, "gamma": 3.0}, lambda x: np.where(x <= 0, 6 * (np.exp(x) - 1), 3 * x)),
    ("celu", {}, lambda x: np.maximum(0, x) + np.minimum(0, np.exp(x) - 1)),
    ("celu", {"alpha": 2.0}, lambda x: np.maximum(0, x) + np.minimum(0, 2 * (np.exp(x / 2) - 1))),
    ("mish", {}, lambda x: x * np.tanh(_softplus(x))),
    ("thresholded_relu", {}, lambda x: np.where(x > 1.0, x, 0)),
    ("thresholded_relu", {"alpha": -0.5}, lambda x: np.where(x > -0.5, x, 0)),
]


@pytest.mark.parametrize("name,attrs,ref", CASES,
                         ids=[f"{n}-{'-'.join(map(str, a.values())) or 'default'}"
                              for n, a, _ in CASES])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_activation(backend_name: str, name: str, attrs: dict, ref, dtype: str, run_op,
                    random_array, assert_close) -> None:
    x = random_array((4, 6), dtype, -4.0, 4.0, seed=11)
    (got,) = run_op(backend_name, name, [x], attrs)
    assert_close(got, ref(x.astype(np.float64)), dtype)


@pytest.mark.parametrize("name", ["softplus", "mish", "hard_swish", "silu"])
def test_activation_float16(backend_name: str, name: str, run_op, random_array,
                            assert_close) -> None:
    ref = {n: r for n, a, r in CASES if not a}[name]
    x = random_array((3, 4), "float16", -4.0, 4.0, seed=12)
    (got,) = run_op(backend_name, name, [x])
    assert_close(got, ref(x.astype(np.float64)), "float16")


def test_softplus_large_inputs(backend_name: str, run_op) -> None:
    x = np.array([-100.0, -30.0, 0.0, 30.0, 100.0], np.float32)
    (got,) = run_op(backend_name, "softplus", [x])
    want = np.logaddexp(0, x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)


def test_activation_in_gpu_chain(backend_name: str, run_op, random_array,
                                 assert_close) -> None:
    # Two expression ops in one function: CUDA and OpenCL fuse them into one kernel.
    x = random_array((5, 3), "float32", -3.0, 3.0, seed=13)
    chain = [{"op": "elu", "alpha": 0.5}, {"op": "softsign"}]
    (got,) = run_op(backend_name, chain, [x])
    e = np.where(x < 0, 0.5 * np.expm1(x.astype(np.float64)), x)
    assert_close(got, e / (1 + np.abs(e)), "float32")


def test_errors(make_function) -> None:
    f32 = TensorSpec((2,), "float32")
    with pytest.raises(LibraryError, match=r"celu: attribute 'alpha' = 0.0: expected a non-zero"):
        make_function("celu").infer([f32], {"alpha": 0})
    with pytest.raises(LibraryError, match=r"elu: input 0 has dtype int32"):
        make_function("elu").infer([TensorSpec((2,), "int32")])
    with pytest.raises(LibraryError, match=r"selu: attribute 'gamma' = 'x': expected a number"):
        make_function("selu").infer([f32], {"gamma": "x"})
