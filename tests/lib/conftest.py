"""Op-test helpers: run a standard op or a chain on a real backend and compare with NumPy.

Tests get the helpers as fixtures (`run_op`, `check_op`, `assert_close`, `random_array`,
`make_function`), since tests/ is not a package and `conftest` names two modules.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pytest

from graph_runtime.backends import get_backend
from graph_runtime.device import Device
from graph_runtime.lib.chain import Chain, Step
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.loader import function_from_json

# Per-dtype tolerances against a float64 NumPy reference; integers must match exactly.
TOLERANCES: dict[str, dict[str, float]] = {
    "float16": {"rtol": 1e-2, "atol": 1e-2},
    "float32": {"rtol": 1e-5, "atol": 1e-6},
    "float64": {"rtol": 1e-10, "atol": 1e-12},
}

FuncLike = str | Chain | Mapping[str, Any] | Sequence[Mapping[str, Any]]


def make_function(func: FuncLike) -> Chain:
    """A Chain from an op name, a lib.json FUNC dict, or a list of op entries (a chain)."""
    if isinstance(func, Chain):
        return func
    if isinstance(func, str):
        return Chain(func, [Step(func)])
    if isinstance(func, Mapping):
        return function_from_json("test_func", func, "test")
    return function_from_json("test_func", {"ops": list(func)}, "test")


def random_array(shape: Sequence[int], dtype: str, low: float = -2.0, high: float = 2.0,
                 seed: int = 0) -> np.ndarray:
    """Uniform random values in [low, high) as dtype (integers: rounded)."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(low, high, size=tuple(shape))
    if np.dtype(dtype).kind in "iu":
        values = np.round(values)
    return values.astype(dtype)


def run_op(backend_name: str, func: FuncLike, inputs: Sequence[np.ndarray],
           attrs: Mapping[str, Any] | None = None,
           outputs: Sequence[TensorSpec] | None = None, device_id: int = 0) -> list[np.ndarray]:
    """Prepare func on device_id of the backend, copy inputs in, run once, return host outputs.

    Outputs default to what the function infers; attrs are the graph node's attrs.
    """
    chain = make_function(func)
    backend = get_backend(backend_name)
    in_specs = [TensorSpec(tuple(a.shape), str(a.dtype)) for a in inputs]
    out_specs = list(outputs) if outputs is not None else chain.infer(in_specs, attrs)
    dev = Device(backend.device_type, device_id)
    run = chain.prepare(dev, in_specs, out_specs, dict(attrs or {}))
    args = []
    for host in inputs:
        arr = backend.empty(device_id, tuple(host.shape), host.dtype)
        backend.from_host(host if host.flags.c_contiguous else host.copy(), arr)
        args.append(arr)
    outs = [backend.empty(device_id, tuple(s.shape), s.dtype) for s in out_specs]
    run(*args, *outs)
    backend.sync(device_id)
    return [backend.to_host(o) for o in outs]


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str | None = None) -> None:
    """got (a backend result) equals want (a float64 reference) within dtype's tolerance."""
    dtype = dtype or str(got.dtype)
    assert got.shape == want.shape, f"shape {got.shape} != reference {want.shape}"
    assert str(got.dtype) == dtype, f"dtype {got.dtype} != expected {dtype}"
    tol = TOLERANCES.get(dtype)
    if tol is None:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want, **tol)


def check_op(backend_name: str, func: FuncLike, inputs: Sequence[np.ndarray],
             reference: np.ndarray | Sequence[np.ndarray],
             attrs: Mapping[str, Any] | None = None) -> list[np.ndarray]:
    """run_op, then assert_close each output against reference (one array or a list)."""
    got = run_op(backend_name, func, inputs, attrs)
    wants = [reference] if isinstance(reference, np.ndarray) else list(reference)
    assert len(got) == len(wants), f"{len(got)} outputs, reference has {len(wants)}"
    for g, w in zip(got, wants):
        assert_close(g, np.asarray(w))
    return got


@pytest.fixture(name="run_op")
def run_op_fixture() -> Any:
    """run_op(backend_name, func, inputs, attrs=None, outputs=None, device_id=0) -> outputs."""
    return run_op


@pytest.fixture(name="check_op")
def check_op_fixture() -> Any:
    """check_op(backend_name, func, inputs, reference, attrs=None): run and compare."""
    return check_op


@pytest.fixture(name="assert_close")
def assert_close_fixture() -> Any:
    """assert_close(got, want_float64, dtype=None) with TOLERANCES per dtype."""
    return assert_close


@pytest.fixture(name="random_array")
def random_array_fixture() -> Any:
    """random_array(shape, dtype, low=-2, high=2, seed=0)."""
    return random_array


@pytest.fixture(name="make_function")
def make_function_fixture() -> Any:
    """make_function(op name | FUNC dict | list of op entries) -> Chain."""
    return make_function
