"""The CPU backend: NumPy arrays over bytearrays; copies are memcpy."""
from __future__ import annotations

import contextlib
import os
import platform
from typing import Any, Sequence

import numpy as np

from . import check_same_layout, view_nbytes
from .base import DeviceInfo

ALIGN = 64  # every buffer's first byte: SIMD-friendly for NumPy's BLAS calls and the kernels
HUGE_PAGE = 2 << 20  # Linux's transparent huge page on x86-64 and most arm64 kernels


def host_arena(sizes: Sequence[int]) -> list[np.ndarray]:
    """uint8 buffers of these sizes, each ALIGN-aligned, carved from one allocation.

    NumPy advises Linux to back any allocation of 4 MB or more with 2 MB pages (transparent
    huge pages, where the kernel allows them): a model's weights allocated one by one are
    mostly under 4 MB (a LLaMA-style decoder's 1-3 MB products) and sit on 4 KB pages, whose
    translations a product streaming 48 MB of them misses on every 4 KB. One arena of 4 MB or
    more starts on a huge-page boundary (its slack is address space only: never touched, never
    resident). On a 2-vCPU Xeon a decode step's chain of products read them 4% faster so
    (docs/measurements.md)."""
    offsets, total = [], 0
    for nbytes in sizes:
        offsets.append(total)
        total += -(-nbytes // ALIGN) * ALIGN
    pad = HUGE_PAGE if total >= 2 * HUGE_PAGE else ALIGN
    raw = np.empty(total + pad, dtype=np.uint8)
    start = (-raw.ctypes.data) % pad
    return [raw[start + offset:start + offset + nbytes]
            for offset, nbytes in zip(offsets, sizes)]


class CpuBackend:
    """Host memory through NumPy; there is one CPU device, id 0 (more ids alias it)."""

    name = "cpu"
    device_type = 1
    native_type: type = np.ndarray
    has_current_device = False

    def scope(self, device_id: int) -> contextlib.nullcontext[None]:
        """Nothing to make current: every call names its device (queue or array) itself."""
        return contextlib.nullcontext()

    def device_count(self) -> int:
        return 1

    def device_info(self, device_id: int) -> DeviceInfo:
        return DeviceInfo("cpu", device_id, cpu_name(), self.memory_capacity(device_id))

    def memory_capacity(self, device_id: int) -> int:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return 1 << 34

    def alloc(self, device_id: int, nbytes: int) -> Any:
        # NOTE: 64-byte alignment keeps every view SIMD-friendly for NumPy's BLAS calls.
        raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGN
        return raw[start:start + nbytes]

    def view(self, buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        view_nbytes("cpu", buffer.nbytes, offset, shape, dtype)
        return np.ndarray(shape, dtype, buffer, offset)  # one call: no slice, view, reshape

    def empty(self, device_id: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return np.empty(shape, dtype=dtype)

    def from_host(self, host: np.ndarray, dst: Any) -> None:
        # NOTE: np.copyto would broadcast a (3,) source into (2, 3); copies must match exactly.
        check_same_layout("cpu: from_host", host, dst)
        np.copyto(dst, host, casting="no")

    def to_host(self, src: Any, out: np.ndarray | None = None) -> np.ndarray:
        if out is None:
            return np.array(src, copy=True)
        check_same_layout("cpu: to_host", src, out)
        np.copyto(out, src, casting="no")
        return out

    def copy(self, src: Any, dst: Any) -> None:
        check_same_layout("cpu: copy", src, dst)
        np.copyto(dst, src, casting="no")

    def sync(self, device_id: int) -> None:
        return None

    def device_id_of(self, array: Any) -> int:
        return 0

    def from_dlpack(self, obj: Any) -> Any:
        """A numpy array sharing the memory of a DLPack-exporting host object (torch, jax, ...)."""
        return np.from_dlpack(obj)


def cpu_name() -> str:
    """The CPU model: /proc/cpuinfo's model name, else platform's, else "host cpu"."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "host cpu"
