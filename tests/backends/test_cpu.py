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


def test_host_arena_carves_disjoint_aligned_buffers_from_one_allocation() -> None:
    """host_arena: each buffer its size, 64-byte aligned, none overlapping another, all views of
    one allocation; one of 4 MB or more starts on a 2 MB boundary (huge pages)."""
    from graph_runtime.backends.cpu import HUGE_PAGE, host_arena
    for sizes in ([1, 63, 64, 65, 4096], [3 << 20, 5, 1 << 20], [7]):
        buffers = host_arena(sizes)
        assert [b.nbytes for b in buffers] == sizes
        assert all(b.dtype == np.uint8 and b.ctypes.data % 64 == 0 for b in buffers)
        assert len({id(b.base) for b in buffers}) == 1
        spans = sorted((b.ctypes.data, b.ctypes.data + b.nbytes) for b in buffers)
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
        for i, b in enumerate(buffers):  # writing one changes no other
            b[:] = i + 1
        assert all(np.all(b == i + 1) for i, b in enumerate(buffers))
        if sum(sizes) >= 2 * HUGE_PAGE:
            assert buffers[0].ctypes.data % HUGE_PAGE == 0
    assert host_arena([]) == []
