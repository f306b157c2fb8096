"""Shared fixtures: real backends only (CPU always, OpenCL through PoCL, CUDA where present)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from support import REQUIRE_OPENCL, backend_missing, require_backend

from graph_runtime.settings import CACHE_DIR, TUNING_CACHE

ROOT = Path(__file__).resolve().parents[1]

BACKENDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("opencl", id="opencl", marks=pytest.mark.opencl),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
]


@pytest.fixture(scope="session", autouse=True)
def tuning_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tuning cache in a folder of the test session (subprocesses inherit it): tests never
    write the user's cache, and choices measured once serve the whole session."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TUNING_CACHE.name, str(tmp_path_factory.mktemp("tuning")))
        # Generated code is named by its content, so a folder of the checkout's may keep it
        # between sessions (compiling every chain anew costs minutes) without the user's cache.
        patch.setenv(CACHE_DIR.name, str(ROOT / ".cache"))
        yield


@pytest.fixture(scope="session", autouse=True)
def float32_cuda_products() -> Iterator[None]:
    """CUDA's float32 products in full float32 (GRAPH_RUNTIME_CUDA_TF32=off): the tests hold
    kernels to float32's tolerances against NumPy and ONNX Runtime's CPU provider. TF32, the
    default, is tested by name (tests/lib/test_cuda_gemm.py)."""
    from graph_runtime.settings import CUDA_TF32
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CUDA_TF32.name, "off")
        yield


@pytest.fixture(scope="session", autouse=True)
def steady_threads() -> Iterator[None]:
    """oneDNN's thread mode stays as first decided: a module's runs otherwise look at the load
    again (policy.recheck) and, seeing a test's subprocess as a neighbour, make every kernel
    again, which tests counting the kernels a shape prepares cannot tell from a bug.
    Tests of the recheck itself patch it back in."""
    from graph_runtime.runtime import module_base
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module_base, "threads_generation", lambda: 0)
        yield


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
