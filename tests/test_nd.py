"""NDArray and graph_runtime.nd: array/empty/from_dlpack, copies, numpy and DLPack interop."""
from __future__ import annotations

import numpy as np
import pytest

import graph_runtime as gr
from graph_runtime import nd
from graph_runtime.backends import get_backend
from graph_runtime.errors import DeviceError, GraphRuntimeError


def dev_of(kind: str) -> gr.Device:
    return gr.device(kind)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "int64", "uint8", "bool"])
def test_array_round_trip_and_properties(backend_name: str, dtype: str) -> None:
    host = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    arr = nd.array(host, device=backend_name)
    assert arr.device == dev_of(backend_name)
    assert (arr.shape, arr.dtype, arr.ndim, arr.size) == ((2, 3, 4), dtype, 3, 24)
    assert arr.nbytes == host.nbytes
    assert isinstance(arr.native, get_backend(backend_name).native_type)
    np.testing.assert_array_equal(arr.numpy(), host)


def test_array_is_a_copy(backend_name: str) -> None:
    host = np.ones((3,), np.float32)
    arr = nd.array(host, device=backend_name)
    host[:] = 5
    np.testing.assert_array_equal(arr.numpy(), np.ones(3, np.float32))
    result = arr.numpy()
    result[:] = 7
    np.testing.assert_array_equal(arr.numpy(), np.ones(3, np.float32))


def test_array_from_lists_scalars_and_dtype(backend_name: str) -> None:
    arr = nd.array([[1, 2], [3, 4]], device=backend_name, dtype="float32")
    assert arr.dtype == "float32"
    np.testing.assert_array_equal(arr.numpy(), [[1, 2], [3, 4]])
    scalar = nd.array(2.5, device=backend_name)
    assert scalar.shape == () and scalar.dtype == "float64" and float(scalar.numpy()) == 2.5
    recast = nd.array(arr, device=backend_name, dtype="int32")
    assert recast.dtype == "int32"
    np.testing.assert_array_equal(recast.numpy(), [[1, 2], [3, 4]])


def test_empty_and_zero_size(backend_name: str) -> None:
    arr = nd.empty((2, 0, 3), "int32", backend_name)
    assert arr.shape == (2, 0, 3) and arr.size == 0 and arr.nbytes == 0
    assert arr.numpy().shape == (2, 0, 3)
    arr.copyfrom(np.zeros((2, 0, 3), np.int32))
    assert nd.empty(5, device=backend_name).shape == (5,)
    assert nd.empty(5, device=backend_name).dtype == "float32"
    zero = nd.array(np.zeros((0,), np.float64), device=backend_name)
    assert zero.copyto(gr.cpu()).shape == (0,)


def test_copyto_device_and_ndarray(backend_name: str) -> None:
    host = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    src = nd.array(host, device="cpu")
    on_device = src.copyto(dev_of(backend_name))
    assert on_device.device == dev_of(backend_name)
    back = on_device.copyto("cpu")
    np.testing.assert_array_equal(back.numpy(), host)
    target = nd.empty((4, 5), "float32", backend_name)
    assert on_device.copyto(target) is target
    np.testing.assert_array_equal(target.numpy(), host)


def test_copyfrom_sources(backend_name: str) -> None:
    arr = nd.empty((2, 2), "float32", backend_name)
    assert arr.copyfrom(np.array([[1, 2], [3, 4]], np.float32)) is arr
    np.testing.assert_array_equal(arr.numpy(), [[1, 2], [3, 4]])
    arr.copyfrom([[5, 6], [7, 8]])
    np.testing.assert_array_equal(arr.numpy(), [[5, 6], [7, 8]])
    arr.copyfrom(np.full((2, 2), 0.5, np.float64))  # same-kind cast, as TVM's copyfrom does
    np.testing.assert_array_equal(arr.numpy(), np.full((2, 2), 0.5, np.float32))
    arr.copyfrom(nd.array(np.eye(2, dtype=np.float32), device="cpu"))
    np.testing.assert_array_equal(arr.numpy(), np.eye(2))
    other = nd.array(np.full((2, 2), 9, np.float32), device=backend_name)
    arr.copyfrom(other)
    np.testing.assert_array_equal(arr.numpy(), np.full((2, 2), 9))
    arr.copyfrom(np.arange(8, dtype=np.float32).reshape(2, 4)[:, ::2])
    np.testing.assert_array_equal(arr.numpy(), [[0, 2], [4, 6]])


def test_copyfrom_mismatches_say_what_and_where(backend_name: str) -> None:
    arr = nd.empty((2, 3), "float32", backend_name)
    dev = dev_of(backend_name)
    with pytest.raises(GraphRuntimeError, match=rf"NDArray.copyfrom into {dev.kind}:0: the "
                                                r"source is \(3, 2\) float64 but the array is "
                                                r"\(2, 3\) float32"):
        arr.copyfrom(np.zeros((3, 2)))
    with pytest.raises(GraphRuntimeError, match=r"cannot cast float32 data to the array's int32"):
        nd.empty((2, 3), "int32", backend_name).copyfrom(np.zeros((2, 3), np.float32))
    with pytest.raises(GraphRuntimeError, match=r"the source is \(2, 3\) int32 but the "
                                                r"destination is \(2, 3\) float32"):
        arr.copyfrom(nd.array(np.zeros((2, 3), np.int32), device="cpu"))


def test_numpy_interop(backend_name: str) -> None:
    host = np.arange(6, dtype=np.int32).reshape(2, 3)
    arr = nd.array(host, device=backend_name)
    np.testing.assert_array_equal(np.asarray(arr), host)
    np.testing.assert_array_equal(np.asarray(arr, dtype=np.float64), host.astype(np.float64))
    assert np.add(arr, 1).tolist() == (host + 1).tolist()


def test_repr_names_shape_dtype_device(backend_name: str) -> None:
    arr = nd.array(np.array([1.5, 2.5], np.float32), device=backend_name)
    text = repr(arr)
    assert text.startswith(f"<NDArray (2,) float32 @ {dev_of(backend_name)}>")
    assert "1.5" in text and "2.5" in text
    assert str(arr) == str(np.array([1.5, 2.5], np.float32))


def test_cpu_array_protocol_without_copy() -> None:
    arr = nd.array(np.arange(4, dtype=np.int64))
    view = np.asarray(arr, copy=False)
    assert view is arr.native
    view[0] = 42
    assert arr.numpy()[0] == 42


@pytest.mark.opencl
def test_device_array_refuses_copy_false(opencl_available: None) -> None:
    arr = nd.array(np.arange(4, dtype=np.int64), device="opencl")
    with pytest.raises(ValueError, match=r"opencl:0 NDArray needs a copy"):
        np.asarray(arr, copy=False)


# -- DLPack -----------------------------------------------------------------------------------

def test_cpu_dlpack_export_and_import_share_memory() -> None:
    arr = nd.array(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert arr.__dlpack_device__() == (1, 0)
    exported = np.from_dlpack(arr)
    assert np.shares_memory(exported, arr.native)
    source = np.arange(5, dtype=np.int16)
    wrapped = nd.from_dlpack(source)
    assert wrapped.device == gr.cpu(0) and np.shares_memory(wrapped.native, source)
    assert nd.from_dlpack(wrapped) is wrapped


@pytest.mark.opencl
def test_opencl_has_no_dlpack(opencl_available: None) -> None:
    arr = nd.array(np.zeros(3, np.float32), device="opencl")
    with pytest.raises(DeviceError, match=r"opencl arrays have no DLPack export \(Array\); use "
                                          r"\.numpy\(\) for a host copy"):
        arr.__dlpack__()
    with pytest.raises(DeviceError, match=r"no DLPack export"):
        arr.__dlpack_device__()


@pytest.mark.cuda
def test_cuda_dlpack_with_cupy(cuda_available: None) -> None:
    import cupy

    source = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
    wrapped = nd.from_dlpack(source)
    assert wrapped.device == gr.cuda(0)
    assert wrapped.native.data.ptr == source.data.ptr
    copied = nd.array(source, device="cpu")
    np.testing.assert_array_equal(copied.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))
    on_gpu = nd.array(np.ones((2, 2), np.float64), device="cuda")
    assert on_gpu.__dlpack_device__() == (2, 0)
    exported = cupy.from_dlpack(on_gpu)
    assert exported.data.ptr == on_gpu.native.data.ptr
    target = nd.empty((3, 4), "float32", "cuda")
    target.copyfrom(source.T.T)
    np.testing.assert_array_equal(target.numpy(), source.get())


class _ForeignTensor:
    """A DLPack producer on a device type graph_runtime has no backend for (vulkan, code 7)."""

    def __init__(self, device_type: int) -> None:
        self.device_type = device_type

    def __dlpack__(self, **kwargs: object) -> object:
        raise AssertionError("from_dlpack must refuse before asking for the capsule")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device_type, 0)


@pytest.mark.parametrize("device_type, kind", [(7, "vulkan"), (3, "cuda_host")])
def test_from_dlpack_of_an_unsupported_device(device_type: int, kind: str) -> None:
    with pytest.raises(DeviceError, match=rf"no backend imports DLPack tensors on {kind} "
                                          rf"\(device type {device_type}\)"):
        nd.from_dlpack(_ForeignTensor(device_type))


def test_from_dlpack_of_a_plain_object() -> None:
    with pytest.raises(DeviceError, match=r"from_dlpack: list has no __dlpack__ method"):
        nd.from_dlpack([1, 2])


# -- device and argument errors ---------------------------------------------------------------

def test_device_errors() -> None:
    with pytest.raises(DeviceError, match=r"unknown device type 'tpu'"):
        nd.empty((2,), device="tpu")
    with pytest.raises(DeviceError, match=r"cpu:2 does not exist"):
        nd.array([1, 2], device="cpu:2")


@pytest.mark.opencl
def test_missing_opencl_device(opencl_available: None) -> None:
    with pytest.raises(DeviceError, match=r"opencl:7 does not exist: this machine has \d+ "
                                          r"opencl device"):
        nd.array([1.0], device="opencl:7")


def test_bad_shape_and_dtype() -> None:
    with pytest.raises(GraphRuntimeError, match=r"empty: shape \(2, -1\) has a negative"):
        nd.empty((2, -1))
    with pytest.raises(GraphRuntimeError, match=r"empty: unknown dtype 'floatx'"):
        nd.empty((2,), "floatx")

