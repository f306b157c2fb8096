"""Every backend obeys the same Backend protocol, and arrays copy between every pair of kinds."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.backends import Backend, copy_array, get_backend
from graph_runtime.errors import DeviceError, GraphRuntimeError

DTYPES = ["float32", "float64", "float16", "int8", "int32", "int64", "uint8", "bool"]


def sample(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Distinct values per element, so a shifted or truncated copy cannot pass."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), size=shape).astype(dtype)


def nbytes_of(shape: tuple[int, ...], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_through_a_view(backend_name: str, dtype: str) -> None:
    backend = get_backend(backend_name)
    host = sample((3, 5), dtype)
    buf = backend.alloc(0, nbytes_of((3, 5), dtype))
    arr = backend.view(buf, 0, (3, 5), np.dtype(dtype))
    assert isinstance(arr, backend.native_type)
    backend.from_host(host, arr)
    back = backend.to_host(arr)
    assert back.dtype == np.dtype(dtype) and back.shape == (3, 5)
    np.testing.assert_array_equal(back, host)


@pytest.mark.parametrize("dtype", DTYPES)
def test_views_at_offsets_keep_their_bytes(backend_name: str, dtype: str) -> None:
    backend = get_backend(backend_name)
    size = nbytes_of((4, 3), dtype)
    offsets = [0, size + 8, 2 * size + 64]
    buf = backend.alloc(0, offsets[-1] + size)
    views = [backend.view(buf, off, (4, 3), np.dtype(dtype)) for off in offsets]
    hosts = [sample((4, 3), dtype, seed=i) for i in range(len(offsets))]
    for view, host in zip(views, hosts):
        backend.from_host(host, view)
    for view, host in zip(views, hosts):
        np.testing.assert_array_equal(backend.to_host(view), host)


def test_two_dtypes_over_one_buffer_see_the_same_bytes(backend_name: str) -> None:
    backend = get_backend(backend_name)
    buf = backend.alloc(0, 64)
    floats = backend.view(buf, 16, (2, 4), np.dtype("float32"))
    words = backend.view(buf, 16, (8,), np.dtype("uint32"))
    raw = backend.view(buf, 16, (32,), np.dtype("uint8"))
    host = sample((2, 4), "float32")
    backend.from_host(host, floats)
    np.testing.assert_array_equal(backend.to_host(words), host.reshape(-1).view(np.uint32))
    np.testing.assert_array_equal(backend.to_host(raw), host.reshape(-1).view(np.uint8))
    backend.from_host(np.zeros(4, np.uint8), backend.view(buf, 16, (4,), np.dtype("uint8")))
    expected = host.copy()
    expected.reshape(-1)[0] = 0.0
    np.testing.assert_array_equal(backend.to_host(floats), expected)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 4)])
def test_zero_size_arrays(backend_name: str, shape: tuple[int, ...]) -> None:
    backend = get_backend(backend_name)
    empty_buf = backend.alloc(0, 0)
    arr = backend.view(empty_buf, 0, shape, np.dtype("float32"))
    backend.from_host(np.zeros(shape, np.float32), arr)
    assert backend.to_host(arr).shape == shape
    other = backend.empty(0, shape, np.dtype("float32"))
    backend.copy(arr, other)
    out = np.empty(shape, np.float32)
    assert backend.to_host(other, out=out) is out


def test_scalar_shape(backend_name: str) -> None:
    backend = get_backend(backend_name)
    arr = backend.empty(0, (), np.dtype("int64"))
    backend.from_host(np.array(-7, np.int64), arr)
    back = backend.to_host(arr)
    assert back.shape == () and int(back) == -7


def test_to_host_into_out(backend_name: str) -> None:
    backend = get_backend(backend_name)
    host = sample((4, 6), "float32")
    arr = backend.empty(0, (4, 6), np.dtype("float32"))
    backend.from_host(host, arr)
    out = np.empty((4, 6), np.float32)
    assert backend.to_host(arr, out=out) is out
    np.testing.assert_array_equal(out, host)
    strided = np.zeros((4, 12), np.float32)[:, ::2]
    assert backend.to_host(arr, out=strided) is strided
    np.testing.assert_array_equal(strided, host)


def test_from_host_of_strided_and_fortran_arrays(backend_name: str) -> None:
    backend = get_backend(backend_name)
    base = sample((6, 8), "int32")
    arr = backend.empty(0, (3, 8), np.dtype("int32"))
    backend.from_host(base[::2], arr)
    np.testing.assert_array_equal(backend.to_host(arr), base[::2])
    fortran = np.asfortranarray(base[:3])
    backend.from_host(fortran, arr)
    np.testing.assert_array_equal(backend.to_host(arr), base[:3])


@pytest.mark.parametrize("dtype", ["float32", "int8", "float64"])
def test_copy_within_a_device(backend_name: str, dtype: str) -> None:
    backend = get_backend(backend_name)
    host = sample((5, 7), dtype)
    buf = backend.alloc(0, 2 * nbytes_of((5, 7), dtype) + 24)
    src = backend.view(buf, 0, (5, 7), np.dtype(dtype))
    dst = backend.view(buf, nbytes_of((5, 7), dtype) + 24, (5, 7), np.dtype(dtype))
    backend.from_host(host, src)
    backend.copy(src, dst)
    backend.sync(0)
    np.testing.assert_array_equal(backend.to_host(dst), host)


def test_copy_refuses_mismatched_shapes(backend_name: str) -> None:
    backend = get_backend(backend_name)
    a = backend.empty(0, (2, 3), np.dtype("float32"))
    b = backend.empty(0, (3, 2), np.dtype("float32"))
    c = backend.empty(0, (2, 3), np.dtype("int32"))
    with pytest.raises(GraphRuntimeError, match=r"\(2, 3\) float32 but the destination is "
                                                r"\(3, 2\) float32"):
        copy_array(backend, a, backend, b)
    with pytest.raises(GraphRuntimeError, match=r"destination is \(2, 3\) int32"):
        copy_array(backend, a, backend, c)
    with pytest.raises(GraphRuntimeError, match=rf"{backend_name}: from_host: the source is "
                                                r"\(3,\) float32"):
        backend.from_host(np.zeros(3, np.float32), a)
    with pytest.raises(GraphRuntimeError, match=rf"{backend_name}: to_host"):
        backend.to_host(a, out=np.zeros((2, 3), np.float64))


def test_view_outside_the_buffer_is_refused(backend_name: str) -> None:
    backend = get_backend(backend_name)
    buf = backend.alloc(0, 32)
    with pytest.raises(DeviceError, match=rf"{backend_name}: a \(4, 2\) float32 view at byte "
                                          r"offset 8 needs bytes \[8, 40\), but the buffer has 32"):
        backend.view(buf, 8, (4, 2), np.dtype("float32"))


def test_device_facts(backend_name: str) -> None:
    backend = get_backend(backend_name)
    assert isinstance(backend, Backend)
    assert backend.name == backend_name and backend.device_count() >= 1
    info = backend.device_info(0)
    assert info.kind == backend_name and info.device_id == 0 and info.name
    assert info.memory_bytes == backend.memory_capacity(0) > 0
    arr = backend.empty(0, (3,), np.dtype("float32"))
    assert backend.device_id_of(arr) == 0
    backend.sync(0)


# -- copies between kinds --------------------------------------------------------------------

KINDS = [("cpu", ()), ("opencl", (pytest.mark.opencl,)), ("cuda", (pytest.mark.cuda,))]
PAIRS = [pytest.param(src, dst, id=f"{src}-{dst}", marks=[*src_marks, *dst_marks])
         for src, src_marks in KINDS for dst, dst_marks in KINDS]


@pytest.mark.parametrize("src_kind, dst_kind", PAIRS)
@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "float16"])
def test_copy_between_kinds(src_kind: str, dst_kind: str, dtype: str) -> None:
    src_backend = get_backend(src_kind)
    dst_backend = get_backend(dst_kind)
    host = sample((3, 4, 5), dtype)
    src_buf = src_backend.alloc(0, nbytes_of(host.shape, dtype) + 16)
    src = src_backend.view(src_buf, 16, host.shape, np.dtype(dtype))
    src_backend.from_host(host, src)
    dst_buf = dst_backend.alloc(0, nbytes_of(host.shape, dtype) + 8)
    dst = dst_backend.view(dst_buf, 8, host.shape, np.dtype(dtype))
    copy_array(src_backend, src, dst_backend, dst)
    np.testing.assert_array_equal(dst_backend.to_host(dst), host)
    # The copy is a copy: changing the source afterwards leaves dst alone.
    src_backend.from_host(np.zeros_like(host), src)
    np.testing.assert_array_equal(dst_backend.to_host(dst), host)


@pytest.mark.parametrize("src_kind, dst_kind", PAIRS)
def test_copy_of_zero_size_between_kinds(src_kind: str, dst_kind: str) -> None:
    src_backend = get_backend(src_kind)
    dst_backend = get_backend(dst_kind)
    src = src_backend.empty(0, (0, 4), np.dtype("float32"))
    dst = dst_backend.empty(0, (0, 4), np.dtype("float32"))
    copy_array(src_backend, src, dst_backend, dst)
    assert dst_backend.to_host(dst).shape == (0, 4)


@pytest.mark.parametrize("src_kind, dst_kind", PAIRS)
def test_copy_of_a_0d_array_between_kinds(src_kind: str, dst_kind: str) -> None:
    # np.ascontiguousarray turns 0-d into (1,); copies must keep scalars scalar.
    src_backend = get_backend(src_kind)
    dst_backend = get_backend(dst_kind)
    src = src_backend.empty(0, (), np.dtype("float32"))
    src_backend.from_host(np.array(2.5, "float32"), src)
    dst = dst_backend.empty(0, (), np.dtype("float32"))
    copy_array(src_backend, src, dst_backend, dst)
    got = dst_backend.to_host(dst)
    assert got.shape == () and got == 2.5
