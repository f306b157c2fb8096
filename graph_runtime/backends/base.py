"""The interface every device backend implements: alloc, view, from_host, to_host, copy, sync."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ContextManager, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class DeviceInfo:
    """What `graphrun devices` shows for one device."""

    kind: str
    device_id: int
    name: str
    memory_bytes: int


@runtime_checkable
class Backend(Protocol):
    """One device kind. Arrays it hands out are its native type (numpy / cupy / pyopencl)."""

    name: str            # "cpu" | "cuda" | "opencl"
    device_type: int     # DLPack code
    native_type: type    # what kernels receive
    # True where kernels launch on a "current" device (CUDA): scope() must then be entered.
    has_current_device: bool

    def device_count(self) -> int:
        """How many devices of this kind are visible."""
        ...

    def device_info(self, device_id: int) -> DeviceInfo:
        """Name and total memory of one device."""
        ...

    def memory_capacity(self, device_id: int) -> int:
        """Bytes a pool on this device may use by default (what the device can hold)."""
        ...

    def alloc(self, device_id: int, nbytes: int) -> Any:
        """A raw buffer of at least nbytes (nbytes may be 0) on the device."""
        ...

    def view(self, buffer: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """A native array over buffer bytes [offset, offset + size*itemsize)."""
        ...

    def empty(self, device_id: int, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """A freshly allocated native array."""
        ...

    def from_host(self, host: np.ndarray, dst: Any) -> None:
        """Copy a host array into a native array of the same shape and dtype."""
        ...

    def to_host(self, src: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Copy a native array to the host (into out when given) and return the host array."""
        ...

    def copy(self, src: Any, dst: Any) -> None:
        """Copy between two native arrays of this kind (any device ids)."""
        ...

    def sync(self, device_id: int) -> None:
        """Wait until all queued work on the device has finished."""
        ...

    def scope(self, device_id: int) -> ContextManager[Any]:
        """Make device_id the current device (and its stream current) while the block runs."""
        ...

    def device_id_of(self, array: Any) -> int:
        """The device id a native array lives on."""
        ...
