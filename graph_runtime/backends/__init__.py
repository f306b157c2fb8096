"""Backend registry: maps a device kind to its Backend, and copies arrays between any two kinds."""
from __future__ import annotations

import importlib
import math
from typing import Any, Callable

import numpy as np

from ..device import DEVICE_NAMES, Device, device_type_code
from ..errors import DeviceError, GraphRuntimeError
from .base import Backend, DeviceInfo

# One line per device kind: name -> (module, class). Nothing else in the package lists devices.
REGISTRY: dict[str, tuple[str, str]] = {
# The order is also the order `-d auto` adds devices in (cpu first: TVM's ctxs[0]).
    "cpu": ("graph_runtime.backends.cpu", "CpuBackend"),
    "cuda": ("graph_runtime.backends.cuda", "CudaBackend"),
    "opencl": ("graph_runtime.backends.opencl", "OpenCLBackend"),
}

_instances: dict[str, Backend] = {}
_failures: dict[str, str] = {}


def get_backend(kind: str | int | Device) -> Backend:
    """The backend for a kind ("cuda", a DLPack code or a Device); DeviceError says why not."""
    if isinstance(kind, Device):
        name = kind.kind
    else:
        name = DEVICE_NAMES[device_type_code(kind)]
    backend = _instances.get(name)
    if backend is not None:
        return backend
    if name not in REGISTRY:
        raise DeviceError(f"no backend for device type {name!r}; graph_runtime supports: "
                          + ", ".join(REGISTRY))
    if name in _failures:
        raise DeviceError(_failures[name])
    module_name, class_name = REGISTRY[name]
    try:
        module = importlib.import_module(module_name)
        backend = getattr(module, class_name)()
    except DeviceError as e:
        _failures[name] = str(e)
        raise
    except ImportError as e:
        # A backend module should turn its own missing package into a DeviceError; this
        # catches a broken install (the module itself or a dependency of the package).
        _failures[name] = f"{name}: importing {module_name} failed ({e})"
        raise DeviceError(_failures[name]) from e
    _instances[name] = backend
    return backend


def check_device(dev: Device) -> Backend:
    """The backend of dev, after checking that dev's id exists on this machine."""
    backend = get_backend(dev)
    count = backend.device_count()
    if dev.device_id >= count or dev.device_id < 0:
        raise missing_device(str(dev), dev.kind, count)
    return backend


def missing_device(name: str, kind: str, count: int) -> DeviceError:
    """The error for a device (named as the caller names it) beyond the count of its kind here."""
    return DeviceError(f"{name} does not exist: this machine has {count} {kind} device(s)"
                       + (f" (ids 0..{count - 1})" if count else ""))


def list_devices() -> tuple[list[DeviceInfo], dict[str, str]]:
    """Every usable device here, and for each missing kind the reason it is missing."""
    found: list[DeviceInfo] = []
    missing: dict[str, str] = {}
    for name in REGISTRY:
        try:
            backend = get_backend(name)
            count = backend.device_count()
        except DeviceError as e:
            missing[name] = str(e)
            continue
        if count == 0:
            missing[name] = f"{name}: no device visible"
        for i in range(count):
            found.append(backend.device_info(i))
    return found, missing


def available_backends() -> list[str]:
    """Names of the device kinds with at least one device here ("cpu" always first)."""
    names = []
    for name in REGISTRY:
        try:
            if get_backend(name).device_count() > 0:
                names.append(name)
        except DeviceError:
            continue
    return names


def copy_array(src_backend: Backend, src: Any, dst_backend: Backend, dst: Any) -> None:
    """Copy src into dst across any two kinds; pairs without a direct path go through the host.

    Each backend method checks shapes and dtypes (and makes host data contiguous) itself, so the
    direct paths add no second check to the executor's copy steps.
    """
    if src_backend is dst_backend:
        src_backend.copy(src, dst)
    elif src_backend.name == "cpu":
        dst_backend.from_host(src, dst)
    elif dst_backend.name == "cpu":
        src_backend.to_host(src, out=dst)
    else:
        # Checked first: a mismatch must not cost a transfer to the host before it is reported.
        check_same_layout(f"copy {src_backend.name} -> {dst_backend.name}", src, dst)
        dst_backend.from_host(src_backend.to_host(src), dst)


def run_in_scope(backend: Backend, device_id: int, fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, wrapped to run inside backend.scope(device_id) where the backend has a current device."""
    if not backend.has_current_device:
        return fn

    def scoped(*args: Any) -> Any:
        with backend.scope(device_id):
            return fn(*args)
    return scoped


def check_same_layout(what: str, src: Any, dst: Any) -> None:
    """Raise unless two arrays (of any kind) have the same shape and dtype; copies need that."""
    if tuple(src.shape) != tuple(dst.shape) or np.dtype(src.dtype) != np.dtype(dst.dtype):
        raise GraphRuntimeError(f"{what}: the source is {tuple(src.shape)} {np.dtype(src.dtype)} "
                                f"but the destination is {tuple(dst.shape)} {np.dtype(dst.dtype)}; "
                                "shapes and dtypes must match")


def view_nbytes(kind: str, capacity: int, offset: int, shape: tuple[int, ...],
                dtype: np.dtype) -> int:
    """The bytes a view needs, after checking it lies inside a buffer of capacity bytes."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize  # Python ints: no overflow
    if offset < 0 or offset + nbytes > capacity:
        raise DeviceError(f"{kind}: a {tuple(shape)} {np.dtype(dtype)} view at byte offset "
                          f"{offset} needs bytes [{offset}, {offset + nbytes}), but the buffer "
                          f"has {capacity}")
    return nbytes


__all__ = ["Backend", "DeviceInfo", "REGISTRY", "get_backend", "check_device", "list_devices",
           "available_backends", "copy_array", "run_in_scope", "check_same_layout",
           "missing_device", "view_nbytes"]
