"""NDArray: one tensor on one device, wrapping a backend array (numpy, cupy, pyopencl)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .backends import REGISTRY, check_device, check_same_layout, copy_array, get_backend
from .device import DEVICE_NAMES, Device, DeviceLike, cpu
from .device import device as parse_device
from .errors import DeviceError, GraphRuntimeError


class NDArray:
    """A tensor on one device; `.native` is what kernels on that device receive.

    Copies whose shapes or dtypes do not match raise GraphRuntimeError itself (the value is
    wrong, not a device or a graph); a missing device or package raises DeviceError.
    """

    __slots__ = ("_native", "_device")

    def __init__(self, native: Any, device: Device) -> None:
        self._native = native
        self._device = device

    @property
    def native(self) -> Any:
        """The backend array: numpy.ndarray, cupy.ndarray or pyopencl.array.Array."""
        return self._native

    @property
    def device(self) -> Device:
        return self._device

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self._native.shape)

    @property
    def dtype(self) -> str:
        """The dtype as TVM spells it ("float32", "int8", "bool")."""
        return np.dtype(self._native.dtype).name

    @property
    def ndim(self) -> int:
        return len(self._native.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self._native.dtype).itemsize

    def numpy(self) -> np.ndarray:
        """A host copy (waits for the device's queued work)."""
        return get_backend(self._device).to_host(self._native)

    def copyto(self, target: Device | NDArray | str) -> NDArray:
        """Copy into target: an NDArray (returned) or a device (a new array there)."""
        if isinstance(target, NDArray):
            return target.copyfrom(self)
        dev = parse_device(target)
        dst = empty(self.shape, self.dtype, dev)
        return dst.copyfrom(self)

    def copyfrom(self, source: Any) -> NDArray:
        """Copy an NDArray, a DLPack object (torch, cupy) or host data (numpy, list) into self.

        Host data of another dtype is cast like numpy's "same_kind" rule (float64 -> float32,
        int64 -> int32); device data must match the dtype exactly. Shapes must match.
        """
        if not isinstance(source, NDArray):
            if _is_dlpack_device_array(source):
                source = from_dlpack(source)
            else:
                source = self._host_like(source)
        if isinstance(source, np.ndarray):
            check_same_layout(f"NDArray.copyfrom into {self._device}", source, self._native)
            get_backend(self._device).from_host(source, self._native)
            return self
        check_same_layout(f"NDArray.copyfrom {source._device} -> {self._device}", source._native,
                          self._native)
        copy_array(get_backend(source._device), source._native, get_backend(self._device),
                   self._native)
        return self

    def _host_like(self, source: Any) -> np.ndarray:
        host = np.asarray(source)
        if host.shape != self.shape:
            raise GraphRuntimeError(f"NDArray.copyfrom into {self._device}: the source is "
                                    f"{host.shape} {host.dtype} but the array is {self.shape} "
                                    f"{self.dtype}; shapes must match")
        target = np.dtype(self._native.dtype)
        if host.dtype != target:
            if not np.can_cast(host.dtype, target, casting="same_kind"):
                raise GraphRuntimeError(f"NDArray.copyfrom into {self._device}: cannot cast "
                                        f"{host.dtype} data to the array's {target} (only "
                                        "same-kind casts such as float64 -> float32)")
            host = host.astype(target)
        return host

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        export = self._dlpack_export()
        # NOTE: the consumer reads the memory right away; finish our queued writes first.
        get_backend(self._device).sync(self._device.device_id)
        return export(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        self._dlpack_export()
        return (self._device.device_type, self._device.device_id)

    def _dlpack_export(self) -> Any:
        """The native array's __dlpack__, or DeviceError for kinds without one (pyopencl)."""
        export = getattr(self._native, "__dlpack__", None)
        if export is None:
            raise DeviceError(f"{self._device.kind} arrays have no DLPack export "
                              f"({type(self._native).__name__}); use .numpy() for a host copy")
        return export

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            same_dtype = dtype is None or np.dtype(dtype) == np.dtype(self._native.dtype)
            if isinstance(self._native, np.ndarray) and same_dtype:
                return self._native
            # NOTE: numpy's protocol asks for ValueError when copy=False cannot be honoured.
            raise ValueError(f"a {self._device} NDArray needs a copy to become a numpy array")
        host = self.numpy()
        return host if dtype is None else host.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"<NDArray {self.shape} {self.dtype} @ {self._device}>\n{self.numpy()!r}"

    def __str__(self) -> str:
        return str(self.numpy())


def empty(shape: Sequence[int] | int, dtype: Any = "float32",
          device: DeviceLike = cpu(0)) -> NDArray:
    """An uninitialised array on device ("cpu", "opencl:0", gr.cuda(1), ...)."""
    dev = parse_device(device)
    shape_tuple = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(
        int(n) for n in shape)
    if any(n < 0 for n in shape_tuple):
        raise GraphRuntimeError(f"empty: shape {shape_tuple} has a negative dimension")
    backend = check_device(dev)
    return NDArray(backend.empty(dev.device_id, shape_tuple, _dtype(dtype, "empty")), dev)


def array(obj: Any, device: DeviceLike = cpu(0), dtype: Any = None) -> NDArray:
    """A copy of obj (numpy array, list, NDArray, or a DLPack object like torch/cupy) on device."""
    dev = parse_device(device)
    if _is_dlpack_device_array(obj):
        obj = from_dlpack(obj)
    if isinstance(obj, NDArray):
        if dtype is None or _dtype(dtype, "array") == np.dtype(obj.dtype):
            return obj.copyto(dev)
        obj = obj.numpy()
    host = np.asarray(obj, dtype=None if dtype is None else _dtype(dtype, "array"))
    return empty(host.shape, host.dtype, dev).copyfrom(host)


def from_dlpack(obj: Any) -> NDArray:
    """Wrap a DLPack-exporting object (torch, cupy, numpy, jax) without copying."""
    if isinstance(obj, NDArray):
        return obj
    if not hasattr(obj, "__dlpack__"):
        raise DeviceError(f"from_dlpack: {type(obj).__name__} has no __dlpack__ method; pass a "
                          "tensor such as a torch.Tensor, cupy.ndarray or numpy.ndarray")
    if hasattr(obj, "__dlpack_device__"):
        device_type, device_id = (int(v) for v in obj.__dlpack_device__())
    else:
        device_type, device_id = 1, 0
    kind = DEVICE_NAMES.get(device_type, f"type{device_type}")
    dev = Device(device_type, device_id)
    backend = check_device(dev) if kind in REGISTRY else None
    importer = getattr(backend, "from_dlpack", None)
    if importer is None:
        raise DeviceError(f"from_dlpack: no backend imports DLPack tensors on {kind} (device type "
                          f"{device_type}); copy the tensor to the host or a CUDA GPU first")
    return NDArray(importer(obj), dev)


def _is_dlpack_device_array(obj: Any) -> bool:
    """True for DLPack objects other than numpy data (numpy takes the plain host path)."""
    return hasattr(obj, "__dlpack__") and not isinstance(obj, (np.ndarray, np.generic, NDArray))


def _dtype(value: Any, where: str) -> np.dtype:
    try:
        return np.dtype(value)
    except TypeError as e:
        raise GraphRuntimeError(f"{where}: unknown dtype {value!r}; expected a numpy dtype name "
                                "such as 'float32', 'int64' or 'bool'") from e
