"""Module: a kernel library mapping (func_name, device kind) to a destination-passing callable."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from ..device import DEVICE_NAMES, Device, DeviceLike, device_type_code
from ..device import device as parse_device
from ..errors import GraphRuntimeError, LibraryError


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one argument, known before any data exists (at create() time)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"{tuple(self.shape)} {self.dtype}"


# A registered function is either a plain callable f(*inputs, *outputs) or an object with
#   prepare(device, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
#           attrs: Mapping[str, Any]) -> Callable[..., None]
# which validates shapes/attrs and allocates workspace once, at create() time. A prepared
# kernel with storage requests, workspace, cached inputs or workers is a prepared.PreparedKernel.
Kernel = Callable[..., Any]


class InputVersion:
    """How often an input entry was written from outside run() (set_input, load_params).

    Kernels that derive data from an input once (Winograd-transformed weights) compare `value`
    with the one they derived from. `volatile` means the entry may change without a count (it is
    computed by a node, bound zero copy, shared, or its view was handed out): derive every run.
    """

    __slots__ = ("value", "volatile", "__weakref__")
    # every count or change of volatile in the process, counted (count, set_volatile): a
    # replay of recorded foreign calls (runtime/native_runs.py) records again when it moved
    changes = 0

    def __init__(self, volatile: bool = False) -> None:
        self.value = 0
        self.volatile = volatile

    def count(self) -> None:
        """One more write from outside run()."""
        self.value += 1
        InputVersion.changes += 1

    def set_volatile(self, volatile: bool) -> None:
        if volatile != self.volatile:
            self.volatile = volatile
            InputVersion.changes += 1


def _kind_of(device: DeviceLike) -> str:
    if isinstance(device, Device):
        return device.kind
    if isinstance(device, int) and not isinstance(device, bool):
        return DEVICE_NAMES[device_type_code(device)]
    return parse_device(device).kind


class Module:
    """A named table of kernels; the same func_name may exist for several device kinds."""

    def __init__(self, name: str = "lib") -> None:
        self.name = name
        self._table: dict[tuple[str, str], Kernel] = {}
        self.source: str | None = None  # file this module was loaded from, for messages

    def register(self, func_name: str, fn: Kernel | None = None, *,
                 device: DeviceLike = "cpu") -> Any:
        """Add fn under func_name for a device kind; without fn, returns a decorator."""
        kind = _kind_of(device)

        def add(f: Kernel) -> Kernel:
            if not callable(f) and not hasattr(f, "prepare"):
                raise LibraryError(f"{self.name}: function {func_name!r} for {kind} is not "
                                   f"callable (got {type(f).__name__})")
            self._table[(func_name, kind)] = f
            return f

        if fn is None:
            return add
        return add(fn)

    def import_module(self, other: "Module") -> None:
        """Merge another module's functions into this one (later registrations win)."""
        self._table.update(other._table)

    def has_function(self, func_name: str, device: DeviceLike) -> bool:
        return (func_name, _kind_of(device)) in self._table

    def devices_for(self, func_name: str) -> list[str]:
        """Device kinds that have func_name, in registration order."""
        return [kind for (name, kind) in self._table if name == func_name]

    def function_names(self) -> list[str]:
        return sorted({name for name, _ in self._table})

    def items(self) -> Iterable[tuple[tuple[str, str], Kernel]]:
        return self._table.items()

    def get_function(self, func_name: str, device: DeviceLike, node: str | None = None) -> Kernel:
        """The kernel for func_name on device; LibraryError names the devices that have it."""
        kind = _kind_of(device)
        fn = self._table.get((func_name, kind))
        if fn is not None:
            return fn
        where = f" ({node})" if node else ""
        others = self.devices_for(func_name)
        if others:
            raise LibraryError(f"no function {func_name!r} for {kind}{where}; it exists for: "
                               + ", ".join(others))
        known = self.function_names()
        hint = ", ".join(known[:12]) + (" ..." if len(known) > 12 else "")
        raise LibraryError(f"no function {func_name!r} in lib {self.name!r}{where}; "
                           f"it has: {hint or 'no functions'}")

    def prepare(self, func_name: str, device: Device, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any] | None = None,
                node: str | None = None) -> Callable[..., Any]:
        """The ready-to-call kernel for one node: validated and with workspace, at create() time."""
        fn = self.get_function(func_name, device, node)
        prepare = getattr(fn, "prepare", None)
        if prepare is None:
            return _returns_nothing(fn, func_name, node)
        try:
            return prepare(device, list(inputs), list(outputs), dict(attrs or {}))
        except GraphRuntimeError as e:
            if node and node not in str(e):
                raise type(e)(f"{node}: {e}") from e
            raise
        except Exception as e:  # a kernel's own bug or a NumPy error while preparing
            raise LibraryError(f"{node or func_name}: preparing {func_name!r} for {device} "
                               f"failed: {type(e).__name__}: {e}") from e

    def __contains__(self, func_name: str) -> bool:
        return any(name == func_name for name, _ in self._table)

    def __repr__(self) -> str:
        return f"Module({self.name!r}, {len(self._table)} functions)"


def _returns_nothing(fn: Kernel, func_name: str, node: str | None) -> Kernel:
    """fn wrapped once so that returning a value (instead of writing out) is an error.

    Only user-registered plain callables get this; standard ops are prepared objects and keep
    their direct call. Returning one of the arguments (np.add(x, y, out=out) returns out) is fine.
    """
    where = f" ({node})" if node else ""

    def checked(*args: Any) -> None:
        result = fn(*args)
        if result is None or any(result is a for a in args):
            return
        raise LibraryError(
            f"kernel {func_name!r}{where} ({getattr(fn, '__qualname__', type(fn).__name__)}) "
            f"returned a {type(result).__name__} instead of None; kernels write their results "
            "into the output arrays they are given (destination passing), e.g. "
            "np.add(x, y, out=out)")
    checked.__wrapped__ = fn  # type: ignore[attr-defined]
    return checked
