"""CPU backend specifics: aligned buffers, zero-copy views, DLPack import, host facts."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.backends import get_backend
from graph_runtime.errors import DeviceError, GraphRuntimeError


@pytest.fixture
def backend() -> object:
    return get_backend("cpu")


@pytest.mark.parametrize("nbytes", [1, 63, 4096])
def test_buffers_are_64_byte_aligned(backend, nbytes: int) -> None:
    buf = backend.alloc(0, nbytes)
    assert buf.dtype == np.uint8 and buf.nbytes == nbytes
    assert buf.ctypes.data % 64 == 0


def test_views_share_the_buffer(backend) -> None:
    buf = backend.alloc(0, 64)
    view = backend.view(buf, 8, (2, 3), np.dtype("float32"))
    assert np.shares_memory(view, buf)
    view[...] = 1.5
    np.testing.assert_array_equal(buf[8:32].view(np.float32), np.full(6, 1.5, np.float32))
    assert view.ctypes.data == buf.ctypes.data + 8


def test_to_host_returns_a_copy(backend) -> None:
    arr = backend.empty(0, (4,), np.dtype("int32"))
    arr[...] = 3
    host = backend.to_host(arr)
    host[0] = 9
    assert arr[0] == 3


def test_from_host_never_broadcasts(backend) -> None:
    arr = backend.empty(0, (2, 3), np.dtype("float32"))
    with pytest.raises(GraphRuntimeError, match=r"cpu: from_host: the source is \(3,\) float32"):
        backend.from_host(np.ones(3, np.float32), arr)


def test_from_dlpack_shares_memory(backend) -> None:
    source = np.arange(6, dtype=np.int16)
    imported = backend.from_dlpack(source)
    assert np.shares_memory(imported, source)


def test_host_facts(backend) -> None:
    info = backend.device_info(0)
    assert info.kind == "cpu" and info.name and info.memory_bytes > 1 << 20
    assert backend.device_count() == 1
    assert backend.device_id_of(np.zeros(2)) == 0


def test_view_past_the_end(backend) -> None:
    with pytest.raises(DeviceError, match=r"cpu: a \(3,\) int64 view at byte offset 0 needs "
                                          r"bytes \[0, 24\), but the buffer has 16"):
        backend.view(backend.alloc(0, 16), 0, (3,), np.dtype("int64"))
