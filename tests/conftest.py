"""Shared fixtures: real backends only (CPU always, OpenCL through PoCL, CUDA where present)."""
from __future__ import annotations

import os

import pytest

from graph_runtime.backends import get_backend
from graph_runtime.errors import DeviceError

REQUIRE_OPENCL = os.environ.get("GRAPH_RUNTIME_REQUIRE_OPENCL") == "1"


def backend_missing(name: str) -> str | None:
    """Why a backend cannot run here, or None when it can."""
    try:
        backend = get_backend(name)
        if backend.device_count() == 0:
            return f"{name}: no device visible"
    except DeviceError as e:
        return str(e)
    return None


def require_backend(name: str) -> None:
    """Skip with the reason when the backend is missing; OpenCL fails instead in CI."""
    reason = backend_missing(name)
    if reason is None:
        return
    if name == "opencl" and REQUIRE_OPENCL:
        pytest.fail(f"OpenCL is required here (GRAPH_RUNTIME_REQUIRE_OPENCL=1) but missing: {reason}")
    pytest.skip(reason)


BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("opencl", id="opencl", marks=pytest.mark.opencl),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
]


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """Each real backend in turn; skipped with a reason where missing."""
    require_backend(request.param)
    return request.param


@pytest.fixture
def opencl_available() -> None:
    require_backend("opencl")


@pytest.fixture
def cuda_available() -> None:
    require_backend("cuda")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked opencl/cuda without using a fixture still skip (or fail) cleanly."""
    for item in items:
        for name in ("opencl", "cuda"):
            if item.get_closest_marker(name) and "backend_name" not in getattr(item, "fixturenames", ()):
                reason = backend_missing(name)
                if reason is not None and not (name == "opencl" and REQUIRE_OPENCL):
                    item.add_marker(pytest.mark.skip(reason=reason))
