"""The profile cache: what a measurement is of (KernelCase), its keys, and the JSON file.

A kernel's key is its function name, the lib's definition of it, input and output shapes and
dtypes, node attrs, small params' values and the device name (with the hardware's name, so a
cache moved to another machine misses); a copy's key is its device pair. The file keeps kernel
seconds, copy models, switch costs and calibration factors.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ...backends import check_device
from ...device import Device
from ...errors import PlanError
from ...lib.attrs import NODE_KEYS
from ...lib.library import Module, TensorSpec

CACHE_FORMAT = "graph_runtime.profile_cache"


@dataclass(frozen=True)
class KernelCase:
    """One thing to time: a function with its argument specs and attrs on one device."""

    func_name: str
    device: Device
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    attrs: tuple[tuple[str, str], ...]  # the node's attrs, as text, sorted
    flatten: bool
    # (input position, value_digest) of small params timed with their real values: a kernel's
    # speed can hang on them (np.power of negative bases is far slower at the integral exponent
    # of GPT-2's GELU than at the random exponents samples would give; docs/planner.md).
    constants: tuple[tuple[int, str], ...] = ()


SMALL_PARAM = 64  # params of at most this many elements are measured with their values


def value_digest(array: np.ndarray) -> str:
    """A short digest of an array's dtype and values, not its shape (the key has the entry's)."""
    h = hashlib.sha1(array.dtype.str.encode())
    h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class CopyModel:
    """Seconds to copy n bytes from one device to another: latency + n * per_byte."""

    latency: float
    per_byte: float

    def seconds(self, nbytes: int) -> float:
        return self.latency + nbytes * self.per_byte


@dataclass
class CostCache:
    """The JSON cache: kernel seconds by key, copy models by device pair, calibration factors
    by whole-graph run (calibrate.py); path None keeps it in memory."""

    path: str | None = None
    kernels: dict[str, float] = field(default_factory=dict)
    copies: dict[str, CopyModel] = field(default_factory=dict)
    sequences: dict[str, float] = field(default_factory=dict)
    switches: dict[str, float] = field(default_factory=dict)  # kernel key + previous device

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None) -> CostCache:
        """Read the cache at path (a missing file is an empty cache)."""
        if path is None:
            return cls()
        where = os.fspath(path)
        if not os.path.exists(where):
            return cls(where)
        try:
            with open(where, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise PlanError(f"profile cache {where}: cannot read: {e}") from e
        if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT:
            got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise PlanError(f"profile cache {where} at $.format: expected {CACHE_FORMAT!r}, "
                            f"got {got!r}")
        try:
            kernels = {str(k): float(v) for k, v in doc.get("kernels", {}).items()}
            copies = {str(k): CopyModel(float(v["latency"]), float(v["per_byte"]))
                      for k, v in doc.get("copies", {}).items()}
            sequences = {str(k): float(v) for k, v in doc.get("sequences", {}).items()}
            switches = {str(k): float(v) for k, v in doc.get("switches", {}).items()}
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise PlanError(f"profile cache {where}: expected $.kernels {{key: seconds}}, "
                            f"$.copies {{pair: {{latency, per_byte}}}}, $.sequences "
                            f"{{key: factor}} and $.switches {{key: seconds}}: {e}") from e
        return cls(where, kernels, copies, sequences, switches)

    def save(self) -> None:
        """Write the cache back (nothing without a path)."""
        if self.path is None:
            return
        doc = {"format": CACHE_FORMAT, "version": 1, "kernels": dict(sorted(self.kernels.items())),
               "copies": {k: {"latency": m.latency, "per_byte": m.per_byte}
                          for k, m in sorted(self.copies.items())},
               "sequences": dict(sorted(self.sequences.items())),
               "switches": dict(sorted(self.switches.items()))}
        try:
            with open(self.path, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
        except OSError as e:
            raise PlanError(f"profile cache {self.path}: cannot write: {e}") from e


def device_name(dev: Device) -> str:
    """The device as the cache names it: spec plus the hardware name (a cache moved to another
    machine does not match)."""
    backend = check_device(dev)
    return f"{dev.spec} {backend.device_info(dev.device_id).name}"


def definition_hash(lib: Module, func_name: str, device: Device) -> str:
    """A short hash of how lib defines func_name for device: a changed lib.json misses the cache.

    Chains hash their ops and attrs, source kernels their source; Python kernels their source
    code where inspect finds it, else their qualified name.
    """
    fn = lib.get_function(func_name, device)
    steps = getattr(fn, "steps", None)
    source = getattr(fn, "source", None)
    if steps is not None:
        text = json.dumps([[s.op, dict(s.attrs), s.num_inputs] for s in steps], sort_keys=True,
                          default=str)
    elif isinstance(source, str):
        text = json.dumps([source, getattr(fn, "entry", ""), list(getattr(fn, "options", ()))])
    else:
        try:
            text = inspect.getsource(fn)
        except (OSError, TypeError):
            text = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def kernel_key(case: KernelCase, lib: Module, names: Mapping[Device, str]) -> str:
    """The cache key of a case: function, definition hash, specs, attrs, device name."""
    specs = ";".join(f"{list(s.shape)}{s.dtype}" for s in case.inputs) + "->" + ";".join(
        f"{list(s.shape)}{s.dtype}" for s in case.outputs)
    attrs = ",".join(f"{k}={v}" for k, v in case.attrs)
    if case.constants:
        attrs += "|values=" + ",".join(f"{pos}:{digest}" for pos, digest in case.constants)
    return (f"{case.func_name}|{definition_hash(lib, case.func_name, case.device)}|{specs}|"
            f"{attrs}|{'flat' if case.flatten else 'nd'}|{names[case.device]}")


def copy_key(src: Device, dst: Device, names: Mapping[Device, str]) -> str:
    return f"{names[src]} -> {names[dst]}"


def switch_key(kernel: str, previous: Device, names: Mapping[Device, str]) -> str:
    return f"{kernel}|after {names[previous]}"


def node_attrs_text(attrs: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The node attrs a kernel may read (not func_name, num_inputs, ...), as sorted text."""
    return tuple(sorted((str(k), json.dumps(v, sort_keys=True, default=str))
                        for k, v in attrs.items() if k not in NODE_KEYS or k == "flatten_data"))
