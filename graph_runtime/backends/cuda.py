"""The CUDA backend: CuPy arrays over pool-allocated device memory, one stream per GPU."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import numpy as np

from ..errors import DeviceError
from . import check_same_layout, missing_device, view_nbytes
from .base import DeviceInfo

try:
    import cupy
except ImportError as _import_error:
    raise DeviceError("cuda: CuPy not installed; pip install 'graph_runtime[cuda]' (cupy-cuda12x)"
                      ) from _import_error


class CudaBackend:
    """NVIDIA GPUs through CuPy; buffers are uint8 cupy arrays, every entry a view into one."""

    name = "cuda"
    device_type = 2
    native_type: type = cupy.ndarray
    has_current_device = True

    def __init__(self) -> None:
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # CUDARuntimeError, or a driver/library load failure
            raise DeviceError(f"cuda: no CUDA device visible ({e}); check the NVIDIA driver "
                              "(nvidia-smi) and CUDA_VISIBLE_DEVICES") from e
        if count == 0:
            raise DeviceError("cuda: no CUDA device visible (the driver reports 0 GPUs); check "
                              "CUDA_VISIBLE_DEVICES")
        self._count = int(count)
        self._lock = threading.Lock()
        self._streams: dict[int, Any] = {}
        self._properties: dict[int, dict[str, Any]] = {}

    # -- devices, scopes, streams ------------------------------------------------------------

    def device_count(self) -> int:
        return self._count

    def _props(self, device_id: int) -> dict[str, Any]:
        props = self._properties.get(device_id)
        if props is None:
            self._check_id(device_id)
            props = cupy.cuda.runtime.getDeviceProperties(device_id)
            self._properties[device_id] = props
        return props

    def device_info(self, device_id: int) -> DeviceInfo:
        name = self._props(device_id)["name"]
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        return DeviceInfo("cuda", device_id, str(name), self.memory_capacity(device_id))

    def memory_capacity(self, device_id: int) -> int:
        return int(self._props(device_id)["totalGlobalMem"])

    def stream(self, device_id: int) -> Any:
        """The cupy.cuda.Stream this backend orders its copies on for one GPU (made once)."""
        stream = self._streams.get(device_id)
        if stream is None:
            self._check_id(device_id)
            with self._lock:
                stream = self._streams.get(device_id)
                if stream is None:
                    with cupy.cuda.Device(device_id):
                        # NOTE: a blocking stream also orders against the legacy default stream,
                        # so CuPy calls made outside scope() still see finished copies.
                        stream = cupy.cuda.Stream(non_blocking=False)
                    self._streams[device_id] = stream
        return stream

    @contextlib.contextmanager
    def scope(self, device_id: int) -> Iterator[Any]:
        """Make the GPU current and its stream the current stream (kernel libraries use this)."""
        stream = self.stream(device_id)
        with cupy.cuda.Device(device_id):
            with stream:
                yield stream

    def _check_id(self, device_id: int) -> None:
        if not 0 <= device_id < self._count:
            raise missing_device(f"cuda:{device_id}", "cuda", self._count)

    # -- memory -------------------------------------------------------------------------------

    def alloc(self, device_id: int, nbytes: int) -> Any:
        with self.scope(device_id):
            try:
                # cupy.empty draws from CuPy's memory pool (cupy.cuda.alloc), like every CuPy array.
                return cupy.empty((nbytes,), dtype=np.uint8)
            except cupy.cuda.memory.OutOfMemoryError as e:
                raise DeviceError(f"cuda:{device_id}: out of memory allocating {nbytes} bytes "
                                  f"({e})") from e

    def view(self, buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        view_nbytes("cuda", buffer.nbytes, offset, shape, dtype)
        return cupy.ndarray(tuple(shape), dtype, memptr=buffer.data + offset)

    def empty(self, device_id: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        with self.scope(device_id):
            return cupy.empty(tuple(shape), dtype=dtype)

    def pinned_host(self, nbytes: int) -> np.ndarray:
        """nbytes of page-locked host memory (uint8): a GPU copies to and from it by DMA at the
        bus's speed (about 55 GB/s on an H200 against 8-15 GB/s from pageable memory)."""
        memory = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
        return np.frombuffer(memory, np.uint8, nbytes)  # the array keeps the memory alive

    # -- copies -------------------------------------------------------------------------------

    def from_host(self, host: np.ndarray, dst: Any) -> None:
        check_same_layout("cuda: from_host", host, dst)
        if dst.size == 0:
            return
        with self.scope(dst.device.id) as stream:
            # NOTE: not np.ascontiguousarray: it turns a 0-d array into shape (1,), which set()
            # refuses; set() makes host contiguous itself.
            dst.set(np.asarray(host), stream=stream)
            # NOTE: from pinned host memory the copy is asynchronous; the caller may reuse host
            # as soon as we return, so wait for it.
            stream.synchronize()

    def to_host(self, src: Any, out: np.ndarray | None = None) -> np.ndarray:
        if out is not None:
            check_same_layout("cuda: to_host", src, out)
        direct = out if out is not None and out.flags.c_contiguous else None
        with self.scope(src.device.id) as stream:
            if not src.flags.c_contiguous:
                src = cupy.ascontiguousarray(src)
            host = src.get(stream=stream, out=direct)
            stream.synchronize()
        if out is None:
            return host
        if direct is None:
            np.copyto(out, host, casting="no")
        return out

    def copy(self, src: Any, dst: Any) -> None:
        check_same_layout("cuda: copy", src, dst)
        if src.size == 0:
            return
        if not dst.flags.c_contiguous:
            raise DeviceError(f"cuda: the copy destination must be C-contiguous (shape "
                              f"{tuple(dst.shape)}, strides {tuple(dst.strides)})")
        src_id = src.device.id
        dst_id = dst.device.id
        if not src.flags.c_contiguous:
            with self.scope(src_id):
                src = cupy.ascontiguousarray(src)
        if src_id == dst_id:
            with self.scope(dst_id) as stream:
                dst.data.copy_from_device_async(src.data, src.nbytes, stream)
            return
        # Two GPUs: the copy runs on the destination's stream after the source's pending work,
        # and the source's later work waits for the copy (CuPy enables peer access if it can).
        src_stream = self.stream(src_id)
        dst_stream = self.stream(dst_id)
        with cupy.cuda.Device(src_id):
            src_ready = src_stream.record()
        with cupy.cuda.Device(dst_id):
            dst_stream.wait_event(src_ready)
            dst.data.copy_from_device_async(src.data, src.nbytes, dst_stream)
            copied = dst_stream.record()
        with cupy.cuda.Device(src_id):
            src_stream.wait_event(copied)

    def sync(self, device_id: int) -> None:
        self._check_id(device_id)
        cupy.cuda.Device(device_id).synchronize()

    def device_id_of(self, array: Any) -> int:
        return int(array.device.id)

    def from_dlpack(self, obj: Any) -> Any:
        """A cupy array sharing the memory of a DLPack-exporting CUDA object (torch, jax, ...)."""
        return cupy.from_dlpack(obj)

