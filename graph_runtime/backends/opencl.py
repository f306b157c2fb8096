"""The OpenCL backend: PyOpenCL buffers and arrays, one context and in-order queue per device."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Sequence

import numpy as np

from ..errors import DeviceError, LibraryError
from . import check_same_layout, missing_device, view_nbytes
from .base import DeviceInfo

try:
    import pyopencl as cl
    import pyopencl.array as cl_array
except ImportError as _import_error:
    raise DeviceError("opencl: pyopencl not installed; pip install 'graph_runtime[opencl]' (and an "
                      "OpenCL driver, e.g. Debian's pocl-opencl-icd)") from _import_error

_NO_ICD = ("install an OpenCL driver (ICD), e.g. Debian's pocl-opencl-icd, or a GPU vendor's "
           "OpenCL runtime")


class OpenCLBackend:
    """OpenCL devices numbered across all platforms in platform order (opencl:0, opencl:1, ...)."""

    name = "opencl"
    device_type = 4
    native_type: type = cl_array.Array
    has_current_device = False

    def __init__(self) -> None:
        try:
            platforms = cl.get_platforms()
        except cl.Error as e:
            raise DeviceError(f"opencl: no OpenCL platform found ({e}); {_NO_ICD}") from e
        self._devices: list[Any] = []
        self._platform_names: list[str] = []
        for platform in platforms:
            try:
                found = platform.get_devices()
            except cl.Error:
                # NOTE: a platform without devices raises DEVICE_NOT_FOUND; others may still work.
                continue
            self._devices.extend(found)
            self._platform_names.extend(platform.name.strip() for _ in found)
        if not self._devices:
            names = ", ".join(p.name.strip() for p in platforms) or "none"
            raise DeviceError(f"opencl: OpenCL platforms found ({names}) but no device on any of "
                              f"them; {_NO_ICD}")
        self._lock = threading.Lock()
        self._contexts: dict[int, Any] = {}
        self._queues: dict[int, Any] = {}
        self._ids_by_context: dict[int, int] = {}
        self._programs: dict[tuple[int, str, tuple[str, ...]], Any] = {}

    # -- devices, contexts, queues, programs -------------------------------------------------

    def scope(self, device_id: int) -> contextlib.nullcontext[None]:
        """Nothing to make current: every call names its device (queue or array) itself."""
        return contextlib.nullcontext()

    def device_count(self) -> int:
        return len(self._devices)

    def cl_device(self, device_id: int) -> Any:
        """The pyopencl.Device behind opencl:device_id."""
        count = len(self._devices)
        if not 0 <= device_id < count:
            raise missing_device(f"opencl:{device_id}", "opencl", count)
        return self._devices[device_id]

    def device_info(self, device_id: int) -> DeviceInfo:
        dev = self.cl_device(device_id)
        name = f"{dev.name.strip()} ({self._platform_names[device_id]})"
        return DeviceInfo("opencl", device_id, name, int(dev.global_mem_size))

    def memory_capacity(self, device_id: int) -> int:
        return int(self.cl_device(device_id).global_mem_size)

    def context(self, device_id: int) -> Any:
        """The one pyopencl.Context of this device (created on first use)."""
        ctx = self._contexts.get(device_id)
        if ctx is None:
            dev = self.cl_device(device_id)
            with self._lock:
                ctx = self._contexts.get(device_id)
                if ctx is None:
                    ctx = cl.Context([dev])
                    self._ids_by_context[ctx.int_ptr] = device_id
                    self._contexts[device_id] = ctx
        return ctx

    def queue(self, device_id: int) -> Any:
        """The one in-order pyopencl.CommandQueue of this device; kernels and copies share it."""
        queue = self._queues.get(device_id)
        if queue is None:
            ctx = self.context(device_id)
            with self._lock:
                queue = self._queues.get(device_id)
                if queue is None:
                    queue = cl.CommandQueue(ctx, self._devices[device_id])
                    self._queues[device_id] = queue
        return queue

    def program(self, device_id: int, source: str, options: Sequence[str] = (), *,
                name: str = "program") -> Any:
        """A built pyopencl.Program, built once per device, source and options.

        Args:
            name: what the program is for (a function name), used in the build error.
        """
        key = (device_id, source, tuple(options))
        prg = self._programs.get(key)
        if prg is not None:
            return prg
        dev = self.cl_device(device_id)
        try:
            prg = cl.Program(self.context(device_id), source).build(options=list(options),
                                                                    devices=[dev])
        except cl.Error as e:
            raise LibraryError(f"opencl:{device_id}: building OpenCL {name} failed on "
                               f"{dev.name.strip()} with options {list(options)}; build log:\n"
                               f"{e}") from e
        with self._lock:
            self._programs[key] = prg
        return prg

    # -- memory -------------------------------------------------------------------------------

    def alloc(self, device_id: int, nbytes: int) -> Any:
        dev = self.cl_device(device_id)
        limit = int(dev.max_mem_alloc_size)
        if nbytes > limit:
            raise DeviceError(f"opencl:{device_id} ({dev.name.strip()}): cannot allocate one "
                              f"buffer of {nbytes} bytes; the device's largest single allocation "
                              f"(CL_DEVICE_MAX_MEM_ALLOC_SIZE) is {limit} bytes")
        try:
            # NOTE: OpenCL refuses zero-size buffers, so an empty pool entry still gets one byte.
            return cl.Buffer(self.context(device_id), cl.mem_flags.READ_WRITE, size=max(nbytes, 1))
        except cl.Error as e:
            raise DeviceError(f"opencl:{device_id}: allocating {nbytes} bytes failed: {e}") from e

    def view(self, buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        view_nbytes("opencl", buffer.size, offset, shape, dtype)
        device_id = self._ids_by_context.get(buffer.context.int_ptr)
        if device_id is None:
            raise DeviceError("opencl: view() needs a buffer from alloc(); this one belongs to a "
                              "context the backend did not make")
        queue = self.queue(device_id)
        return cl_array.Array(queue, tuple(shape), dtype, data=buffer, offset=offset)

    def empty(self, device_id: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.view(self.alloc(device_id, nbytes), 0, tuple(shape), np.dtype(dtype))

    # -- copies -------------------------------------------------------------------------------

    def from_host(self, host: np.ndarray, dst: Any) -> None:
        check_same_layout("opencl: from_host", host, dst)
        _check_contiguous(dst, "from_host destination")
        if dst.size == 0:
            return
        host = np.ascontiguousarray(host)
        cl.enqueue_copy(self._queue_of(dst), dst.base_data, host, dst_offset=dst.offset,
                        is_blocking=True)

    def to_host(self, src: Any, out: np.ndarray | None = None) -> np.ndarray:
        if out is not None:
            check_same_layout("opencl: to_host", src, out)
        _check_contiguous(src, "to_host source")
        if out is not None and out.flags.c_contiguous:
            direct = out
        else:
            direct = np.empty(src.shape, src.dtype)
        if src.size:
            cl.enqueue_copy(self._queue_of(src), direct, src.base_data, src_offset=src.offset,
                            is_blocking=True)
        if out is None:
            return direct
        if direct is not out:
            # NOTE: OpenCL reads into contiguous memory only; a strided out takes one host copy.
            np.copyto(out, direct, casting="no")
        return out

    def copy(self, src: Any, dst: Any) -> None:
        check_same_layout("opencl: copy", src, dst)
        _check_contiguous(src, "copy source")
        _check_contiguous(dst, "copy destination")
        if src.size == 0:
            return
        if src.context.int_ptr == dst.context.int_ptr:
            cl.enqueue_copy(self._queue_of(dst), dst.base_data, src.base_data,
                            byte_count=src.nbytes, src_offset=src.offset, dst_offset=dst.offset)
            return
        # NOTE: buffers of two contexts cannot meet in one enqueue_copy; go through the host.
        self.from_host(self.to_host(src), dst)

    def sync(self, device_id: int) -> None:
        self.queue(device_id).finish()

    def device_id_of(self, array: Any) -> int:
        return self._device_id_of_context(array.context)

    def _queue_of(self, array: Any) -> Any:
        """Our queue for arrays in our contexts; an array from a foreign context uses its own."""
        device_id = self._ids_by_context.get(array.context.int_ptr)
        if device_id is not None:
            return self.queue(device_id)
        if array.queue is None:
            raise DeviceError("opencl: an array from a context this backend did not make has no "
                              "queue; attach one with array.with_queue(queue)")
        return array.queue

    def _device_id_of_context(self, ctx: Any) -> int:
        device_id = self._ids_by_context.get(ctx.int_ptr)
        if device_id is not None:
            return device_id
        # A context made outside this backend (user arrays): find its device in our numbering.
        for dev in ctx.devices:
            for i, ours in enumerate(self._devices):
                if ours == dev:
                    return i
        raise DeviceError(f"opencl: an array's context holds devices "
                          f"{[d.name.strip() for d in ctx.devices]}, none of which is an opencl "
                          f"device this backend numbers")


def _check_contiguous(array: Any, what: str) -> None:
    if not array.flags.c_contiguous:
        raise DeviceError(f"opencl: the {what} must be C-contiguous (shape {tuple(array.shape)}, "
                          f"strides {tuple(array.strides)}); copy it with .copy() first")
