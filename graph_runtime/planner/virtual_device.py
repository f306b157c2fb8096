"""VirtualDevice: a possibly partial device constraint, with join and default.

As TVM's include/tvm/target/virtual_device.h defines them.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..device import DEVICE_NAMES, DLPACK_CODES, Device
from ..errors import PlanError

# The device type a target string implies, by its first word ("llvm -mcpu=x" -> cpu).
_TARGET_KINDS = {"llvm": "cpu", "c": "cpu", "cpu": "cpu", "cuda": "cuda", "nvptx": "cuda",
                 "opencl": "opencl", "vulkan": "vulkan", "metal": "metal", "rocm": "rocm",
                 "hexagon": "hexagon", "webgpu": "webgpu"}


def target_device_type(target: str) -> int | None:
    """The DLPack type code a target string implies, or None for a target kind we do not know."""
    words = target.split()
    kind = _TARGET_KINDS.get(words[0].lower()) if words else None
    return DLPACK_CODES[kind] if kind else None


@dataclass(frozen=True)
class VirtualDevice:
    """Where data lives and code runs; None in a field means "unconstrained" (TVM: -1, null, "").

    Like TVM, a target that implies a device type fills an unset device_type, and a target that
    disagrees with a given device_type is rejected.
    """

    device_type: int | None = None
    virtual_device_id: int | None = None
    target: str | None = None
    memory_scope: str | None = None

    def __post_init__(self) -> None:
        if self.target is None:
            return
        implied = target_device_type(self.target)
        if implied is None:
            return
        if self.device_type is None:
            object.__setattr__(self, "device_type", implied)
        elif self.device_type != implied:
            raise PlanError(f"target {self.target!r} runs on {DEVICE_NAMES.get(implied)}, "
                            f"not on device type {_kind(self.device_type)}")

    @property
    def is_fully_unconstrained(self) -> bool:
        return (self.device_type is None and self.virtual_device_id is None
                and self.target is None and self.memory_scope is None)

    @property
    def is_fully_constrained(self) -> bool:
        return (self.device_type is not None and self.virtual_device_id is not None
                and self.target is not None and self.memory_scope is not None)

    def to_device(self) -> Device:
        """The Device this names; both device_type and virtual_device_id must be set."""
        if self.device_type is None or self.virtual_device_id is None:
            raise PlanError(f"virtual device {self} names no single device: it needs both a "
                            "device type and a device id")
        return Device(self.device_type, self.virtual_device_id)

    @classmethod
    def from_device(cls, dev: Device) -> VirtualDevice:
        return cls(dev.device_type, dev.device_id)

    def __str__(self) -> str:
        text = "?" if self.device_type is None else _kind(self.device_type)
        if self.virtual_device_id is not None:
            text += f":{self.virtual_device_id}"
        extras = [f"target={self.target!r}"] if self.target is not None else []
        if self.memory_scope is not None:
            extras.append(f"scope={self.memory_scope!r}")
        return text + (f" ({', '.join(extras)})" if extras else "")


def _kind(code: int) -> str:
    return DEVICE_NAMES.get(code, f"type{code}")


_FIELDS = ("device_type", "virtual_device_id", "target", "memory_scope")


def join(a: VirtualDevice, b: VirtualDevice) -> VirtualDevice | None:
    """The most constrained device agreeing with both, or None when a field is set differently."""
    if a == b or b.is_fully_unconstrained:
        return a
    if a.is_fully_unconstrained:
        return b
    values = {}
    for name in _FIELDS:
        x = getattr(a, name)
        y = getattr(b, name)
        if x is not None and y is not None and x != y:
            return None
        values[name] = x if x is not None else y
    try:
        return VirtualDevice(**values)
    except PlanError:  # a target from one side contradicts the device type of the other
        return None


def join_conflict(a: VirtualDevice, b: VirtualDevice) -> str:
    """Which field makes join(a, b) fail, as "device_type: cuda vs opencl" (for messages)."""
    for name in _FIELDS:
        x = getattr(a, name)
        y = getattr(b, name)
        if x is not None and y is not None and x != y:
            if name == "device_type":
                return f"device_type: {_kind(x)} vs {_kind(y)}"
            return f"{name}: {x!r} vs {y!r}"
    return "target and device_type disagree"


def default(a: VirtualDevice, b: VirtualDevice) -> VirtualDevice:
    """a with each unset field taken from b; b's target only where the device types agree."""
    device_type = a.device_type if a.device_type is not None else b.device_type
    target = a.target
    if target is None and b.target is not None and b.device_type == device_type:
        target = b.target
    return VirtualDevice(
        device_type=device_type,
        virtual_device_id=(a.virtual_device_id if a.virtual_device_id is not None
                           else b.virtual_device_id),
        target=target,
        memory_scope=a.memory_scope if a.memory_scope is not None else b.memory_scope,
    )
