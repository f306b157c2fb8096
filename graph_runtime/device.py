"""Device identity: DLPack type codes, parsing "cuda:1", and the cpu()/cuda()/opencl() makers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .errors import DeviceError

# DLPack's DLDeviceType codes (dlpack.h); the graph's device_index column holds these.
DLPACK_CODES: dict[str, int] = {
    "cpu": 1,
    "cuda": 2,
    "cuda_host": 3,
    "opencl": 4,
    "vulkan": 7,
    "metal": 8,
    "vpi": 9,
    "rocm": 10,
    "rocm_host": 11,
    "ext_dev": 12,
    "cuda_managed": 13,
    "oneapi": 14,
    "webgpu": 15,
    "hexagon": 16,
}
DEVICE_NAMES: dict[int, str] = {code: name for name, code in DLPACK_CODES.items()}
# Aliases users type; TVM accepts "gpu" and "cl" too.
_ALIASES = {"gpu": "cuda", "cl": "opencl", "llvm": "cpu", "host": "cpu"}


@dataclass(frozen=True, order=True)
class Device:
    """One device as DLPack names it: a type code and an id among devices of that type."""

    device_type: int
    device_id: int = 0

    def __post_init__(self) -> None:
        # NOTE: its hash made once: a specialisation's setup hashes (entry, device) keys some
        # 700 times, and the generated __hash__ built a tuple each time
        object.__setattr__(self, "_hash", hash((self.device_type, self.device_id)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined, no-any-return]

    @property
    def kind(self) -> str:
        """The lowercase type name ("cpu", "cuda", "opencl", ...)."""
        name = DEVICE_NAMES.get(self.device_type)  # NOTE: no f-string built per call
        return name if name is not None else f"type{self.device_type}"

    def __str__(self) -> str:
        # NOTE: the "cpu:0" form everywhere (messages, tables, CLI), the one -d and device() take.
        return f"{self.kind}:{self.device_id}"

    def __repr__(self) -> str:
        return f"Device({self.kind}:{self.device_id})"

    @property
    def spec(self) -> str:
        """The "kind:id" form that `device()` parses back."""
        return f"{self.kind}:{self.device_id}"


DeviceLike = Union[Device, str, int, tuple]


def cpu(device_id: int = 0) -> Device:
    """The host CPU (NumPy)."""
    return Device(1, device_id)


def cuda(device_id: int = 0) -> Device:
    """An NVIDIA GPU (CuPy)."""
    return Device(2, device_id)


def opencl(device_id: int = 0) -> Device:
    """An OpenCL device (PyOpenCL), numbered across all platforms in order."""
    return Device(4, device_id)


def device_type_code(kind: str | int) -> int:
    """The DLPack code for a type name ("cuda", "gpu", "opencl") or a code given as int."""
    if isinstance(kind, int) and not isinstance(kind, bool):
        if kind not in DEVICE_NAMES:
            raise DeviceError(f"unknown DLPack device type code {kind}; known: "
                              + ", ".join(f"{c} ({n})" for c, n in sorted(DEVICE_NAMES.items())))
        return kind
    name = str(kind).strip().lower()
    name = _ALIASES.get(name, name)
    if name.isdigit():
        return device_type_code(int(name))
    if name not in DLPACK_CODES:
        from .backends import REGISTRY  # the kinds with a backend, listed first
        main = list(REGISTRY)
        raise DeviceError(f"unknown device type {kind!r}; expected one of: "
                          + ", ".join(main + sorted(set(DLPACK_CODES) - set(main))))
    return DLPACK_CODES[name]


def device(spec: DeviceLike, device_id: int | None = None) -> Device:
    """Parse "cpu", "cuda:1", "opencl(0)", (2, 0), a type code or a Device into a Device."""
    if isinstance(spec, Device):
        return spec if device_id is None else Device(spec.device_type, device_id)
    if isinstance(spec, tuple):
        if len(spec) != 2:
            raise DeviceError(f"device tuple must be (device_type, device_id), got {spec!r}")
        return Device(device_type_code(spec[0]), int(spec[1]))
    if isinstance(spec, int) and not isinstance(spec, bool):
        return Device(device_type_code(spec), device_id or 0)
    if not isinstance(spec, str):
        raise DeviceError(f"cannot make a device from {type(spec).__name__} {spec!r}; "
                          "expected e.g. 'cpu', 'cuda:1', 'opencl:0'")
    text = spec.strip()
    kind, dev_id = text, 0
    if text.endswith(")") and "(" in text:
        kind, _, rest = text[:-1].partition("(")
        dev_id = _parse_id(rest, spec)
    elif ":" in text:
        kind, _, rest = text.partition(":")
        dev_id = _parse_id(rest, spec)
    if device_id is not None:
        dev_id = device_id
    return Device(device_type_code(kind), dev_id)


def _parse_id(text: str, spec: str) -> int:
    if not text.strip().isdigit():
        raise DeviceError(f"bad device {spec!r}: the id after the type must be a non-negative "
                          "integer, as in 'cuda:1'")
    return int(text)
