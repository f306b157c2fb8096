"""CUDA backend specifics: scopes and streams, the memory pool, strided sources, GPU-GPU copies."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from graph_runtime.backends import get_backend
from graph_runtime.errors import DeviceError


@pytest.fixture
def backend(cuda_available: None) -> object:
    return get_backend("cuda")


def test_cuda_is_available_or_says_why() -> None:
    try:
        backend = get_backend("cuda")
    except DeviceError as e:
        message = str(e)
        assert message.startswith("cuda: ")
        assert ("pip install 'graph_runtime[cuda]' (cupy-cuda12x)" in message
                or "no CUDA device visible (" in message), message
    else:
        assert backend.device_count() >= 1


def test_missing_cupy_is_a_device_error() -> None:
    # A fresh interpreter where importing cupy fails, as on a machine without it.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'cupy':\n"
        "            raise ImportError('No module named ' + repr(name))\n"
        "sys.meta_path.insert(0, Block())\n"
        "from graph_runtime.backends import get_backend\n"
        "from graph_runtime.errors import DeviceError\n"
        "try:\n"
        "    get_backend('cuda')\n"
        "except DeviceError as e:\n"
        "    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("cuda: CuPy not installed; pip install "
                                     "'graph_runtime[cuda]' (cupy-cuda12x)")


@pytest.mark.cuda
def test_scope_makes_the_gpu_and_its_stream_current(backend) -> None:
    import cupy

    stream = backend.stream(0)
    assert backend.stream(0) is stream
    with backend.scope(0) as current:
        assert current is stream
        assert cupy.cuda.Device().id == 0
        assert cupy.cuda.get_current_stream().ptr == stream.ptr


@pytest.mark.cuda
def test_alloc_draws_from_the_memory_pool(backend) -> None:
    import cupy

    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    buf = backend.alloc(0, 1 << 20)
    assert pool.used_bytes() >= before + (1 << 20)
    view = backend.view(buf, 256, (16, 16), np.dtype("float32"))
    assert view.data.ptr == buf.data.ptr + 256
    assert backend.device_id_of(view) == 0


@pytest.mark.cuda
def test_memory_capacity_is_the_gpu_total(backend) -> None:
    import cupy

    with cupy.cuda.Device(0):
        free, total = cupy.cuda.Device(0).mem_info
    capacity = backend.memory_capacity(0)
    assert free <= capacity and abs(capacity - total) <= total // 100
    assert backend.device_info(0).memory_bytes == capacity and backend.device_info(0).name


@pytest.mark.cuda
def test_kernels_in_scope_are_ordered_with_copies(backend) -> None:
    import cupy

    host = np.arange(1 << 16, dtype=np.float32)
    x = backend.empty(0, host.shape, np.dtype("float32"))
    y = backend.empty(0, host.shape, np.dtype("float32"))
    backend.from_host(host, x)
    with backend.scope(0):
        cupy.multiply(x, 2, out=y)
    # to_host runs on the same stream, after the kernel: no explicit sync needed.
    np.testing.assert_array_equal(backend.to_host(y), host * 2)


@pytest.mark.cuda
def test_pinned_source_may_be_reused_at_once(backend) -> None:
    import cupyx

    pinned = cupyx.empty_pinned((1 << 20,), dtype=np.float32)
    pinned[...] = 1.0
    arr = backend.empty(0, pinned.shape, np.dtype("float32"))
    backend.from_host(pinned, arr)
    pinned[...] = 2.0
    assert float(backend.to_host(arr).min()) == 1.0


@pytest.mark.cuda
def test_strided_sources_copy_correctly(backend) -> None:
    import cupy

    with backend.scope(0):
        base = cupy.arange(20, dtype=cupy.int32).reshape(4, 5)
    transposed = base.T
    dst = backend.empty(0, (5, 4), np.dtype("int32"))
    backend.copy(transposed, dst)
    expected = np.arange(20, dtype=np.int32).reshape(4, 5).T
    np.testing.assert_array_equal(backend.to_host(dst), expected)
    np.testing.assert_array_equal(backend.to_host(transposed), expected)
    out = np.empty((5, 4), np.int32)
    assert backend.to_host(transposed, out=out) is out
    np.testing.assert_array_equal(out, expected)


@pytest.mark.cuda
def test_unknown_gpu_id(backend) -> None:
    count = backend.device_count()
    with pytest.raises(DeviceError, match=rf"cuda:{count} does not exist: this machine has "
                                          rf"{count} cuda device"):
        backend.alloc(count, 16)


@pytest.mark.cuda
def test_copy_between_two_gpus(backend) -> None:
    import cupy

    if backend.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    host = np.random.default_rng(0).standard_normal((256, 33)).astype(np.float32)
    a = backend.empty(0, host.shape, np.dtype("float32"))
    b = backend.view(backend.alloc(1, host.nbytes + 64), 64, host.shape, np.dtype("float32"))
    assert backend.device_id_of(b) == 1
    backend.from_host(host, a)
    with backend.scope(0):
        cupy.add(a, 1, out=a)  # queued on GPU 0's stream; the copy must wait for it
    backend.copy(a, b)
    np.testing.assert_array_equal(backend.to_host(b), host + 1)
    back = backend.empty(0, host.shape, np.dtype("float32"))
    backend.copy(b, back)
    backend.sync(0)
    np.testing.assert_array_equal(backend.to_host(back), host + 1)
