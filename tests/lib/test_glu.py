"""The glu op's kernels (CPU compiled, OpenCL, and the NumPy-API one CUDA runs through CuPy)
against act(gate) * up written in float64 NumPy, each activation and either half gated; any
leading shape on one CPU kernel; what it refuses."""
from __future__ import annotations

import math

import numpy as np
import pytest

from graph_runtime.backends import get_backend
from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.registry import get_op

ACTIVATIONS = [("silu", {}), ("gelu", {"approximate": "none"}), ("gelu", {"approximate": "tanh"}),
               ("relu", {}), ("sigmoid", {})]


def _want(x: np.ndarray, activation: str, attrs: dict, gate: str) -> np.ndarray:
    x = x.astype(np.float64)
    units = x.shape[-1] // 2
    g, u = (x[..., :units], x[..., units:]) if gate == "first" else \
        (x[..., units:], x[..., :units])
    erf = np.vectorize(math.erf)
    act = {"silu": lambda v: v / (1 + np.exp(-v)),
           "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
           "relu": lambda v: np.maximum(v, 0),
           "gelu": (lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                      * (v + 0.044715 * v ** 3))))
           if attrs.get("approximate") == "tanh" else
           (lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))))}[activation]
    return act(g) * u


def _run(kernel_of: str, x: np.ndarray, attrs: dict) -> np.ndarray:
    backend = get_backend(kernel_of)
    dtype = x.dtype.name
    spec = TensorSpec(x.shape, dtype)
    op = get_op("glu")
    out_spec = op.infer([spec], attrs)
    assert out_spec == [TensorSpec((*x.shape[:-1], x.shape[-1] // 2), dtype)]
    run = op.kernels[kernel_of](backend, 0, [spec], out_spec, attrs)
    arr = backend.empty(0, x.shape, x.dtype)
    backend.from_host(np.ascontiguousarray(x), arr)
    out = backend.empty(0, out_spec[0].shape, x.dtype)
    run(arr, out)
    backend.sync(0)
    return backend.to_host(out)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("gate", ["first", "second"])
@pytest.mark.parametrize("activation,attrs", ACTIVATIONS)
def test_kernel_matches_numpy(activation: str, attrs: dict, gate: str, dtype: str,
                              backend_name: str) -> None:
    x = (np.random.default_rng(3).standard_normal((2, 7, 2 * 13)) * 4).astype(dtype)
    x[0, 0, :3] = [0.0, -50.0, 50.0]  # the activation's extremes in both halves
    all_attrs = {"activation": activation, "gate": gate, **attrs}
    got = _run(backend_name, x, all_attrs)
    # float32: a few ulps of the inputs' scale (the rational erf and tanh, CL's own functions)
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, _want(x, activation, attrs, gate), rtol=tol, atol=tol)


@pytest.mark.parametrize("activation,attrs", ACTIVATIONS)
def test_numpy_api_kernel_matches_numpy(activation: str, attrs: dict) -> None:
    """What CUDA runs through CuPy (the activation op's own kernel, then the product), with
    NumPy."""
    from graph_runtime.lib.ops.glu import _host
    x = np.random.default_rng(4).standard_normal((3, 2 * 9)).astype(np.float32)
    all_attrs = {"activation": activation, "gate": "second", **attrs}
    spec = TensorSpec(x.shape, "float32")
    out = np.empty((3, 9), np.float32)
    _host(get_backend("cpu"), 0, [spec], [TensorSpec(out.shape, "float32")], all_attrs)(x, out)
    np.testing.assert_allclose(out, _want(x, activation, attrs, "second"), rtol=1e-5,
                               atol=1e-5)


def test_one_cpu_kernel_takes_any_shape() -> None:
    """The compiled kernel reads the units and rows at each call (a symbolic module's next
    shape takes it unprepared): rows few and many (the workers' ranges), another width."""
    from graph_runtime.lib.kernels.cpu.glu import GluKernel
    spec = TensorSpec((4, 32), "float32")
    attrs = {"activation": "silu", "gate": "first"}
    run = get_op("glu").kernels["cpu"](get_backend("cpu"), 0, [spec],
                                       get_op("glu").infer([spec], attrs), attrs)
    assert isinstance(run, GluKernel) and run.any_shape()
    rng = np.random.default_rng(5)
    for shape in ((4, 32), (1, 1, 32), (3, 1000, 1024), (2, 6)):
        x = rng.standard_normal(shape).astype(np.float32)
        out = np.empty((*shape[:-1], shape[-1] // 2), np.float32)
        run(x, out)
        np.testing.assert_allclose(out, _want(x, "silu", {}, "first"), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("attrs,shape,message", [
    ({"activation": "tanh"}, (2, 8), "activation"),
    ({}, (2, 8), "missing required attribute 'activation'"),
    ({"activation": "silu", "gate": "middle"}, (2, 8), "gate"),
    ({"activation": "gelu", "approximate": "fast"}, (2, 8), "approximate"),
    ({"activation": "silu"}, (2, 7), r"x \(2, 7\) float32: its last axis must be an even "
                                     r"number of columns, got 7"),
    ({"activation": "silu"}, (), "has no last axis"),
])
def test_refusals_name_the_attr_or_input(attrs: dict, shape: tuple, message: str) -> None:
    with pytest.raises(LibraryError, match=f"^glu: .*{message}"):
        get_op("glu").infer([TensorSpec(shape, "float32")], attrs)
