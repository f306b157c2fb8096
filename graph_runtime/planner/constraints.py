"""Placement: the user's device constraints (default, per node/func glob, per input and output)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..device import Device, cpu, device_type_code
from ..device import device as parse_device
from ..errors import DeviceError, PlanError
from ..graph.model import Graph
from .virtual_device import VirtualDevice

PLACEMENT_KEYS = ("default_device", "node_devices", "func_devices", "input_devices",
                  "output_devices")
DEVICE_KEYS = ("device_type", "device_id", "virtual_device_id", "target", "memory_scope")


def parse_device_constraint(spec: Any, where: str = "device") -> VirtualDevice:
    """A VirtualDevice from "cuda" (any CUDA device), "cuda:1", a dict, a Device or a VirtualDevice.

    Args:
        spec: the constraint; a dict takes the keys in DEVICE_KEYS.
        where: what to name in an error, e.g. the JSON path `$.node_devices["conv*"]`.
    """
    if isinstance(spec, VirtualDevice):
        return spec
    if isinstance(spec, Device):
        return VirtualDevice.from_device(spec)
    if isinstance(spec, str):
        return _parse_text(spec, where)
    if isinstance(spec, Mapping):
        return _parse_mapping(spec, where)
    raise PlanError(f"{where}: expected a device such as \"cuda\", \"cuda:1\" or "
                    f"{{\"device_type\": \"cuda\", \"device_id\": 1}}, got {type(spec).__name__} "
                    f"{spec!r}")


def _parse_text(text: str, where: str) -> VirtualDevice:
    has_id = ":" in text or text.strip().endswith(")")
    try:
        dev = parse_device(text)
    except DeviceError as e:
        raise PlanError(f"{where}: {e}") from e
    return VirtualDevice(dev.device_type, dev.device_id if has_id else None)


def _parse_mapping(spec: Mapping[str, Any], where: str) -> VirtualDevice:
    unknown = [k for k in spec if k not in DEVICE_KEYS]
    if unknown:
        raise PlanError(f"{where}: unknown key {unknown[0]!r}; allowed keys: "
                        + ", ".join(DEVICE_KEYS))
    if "device_id" in spec and "virtual_device_id" in spec:
        raise PlanError(f"{where}: give device_id or virtual_device_id, not both")
    device_type = None
    if spec.get("device_type") is not None:
        try:
            device_type = device_type_code(spec["device_type"])
        except DeviceError as e:
            raise PlanError(f"{where}.device_type: {e}") from e
    key = "device_id" if "device_id" in spec else "virtual_device_id"
    dev_id = spec.get(key)
    if dev_id is not None and (isinstance(dev_id, bool) or not isinstance(dev_id, int)
                               or dev_id < 0):
        raise PlanError(f"{where}.{key}: expected a non-negative integer, got {dev_id!r}")
    for name in ("target", "memory_scope"):
        if spec.get(name) is not None and not isinstance(spec[name], str):
            raise PlanError(f"{where}.{name}: expected a string, got {spec[name]!r}")
    try:
        return VirtualDevice(device_type, dev_id, spec.get("target"), spec.get("memory_scope"))
    except PlanError as e:
        raise PlanError(f"{where}: {e}") from e


@dataclass(frozen=True)
class Constraint:
    """One user constraint and where it came from, e.g. `node_devices["conv*"]`."""

    device: VirtualDevice
    source: str

    def __str__(self) -> str:
        return f"{self.source} = {self.device}"


@dataclass
class Placement:
    """Device constraints for one plan; keys of the dicts are node globs, func globs, names."""

    default_device: VirtualDevice = field(default_factory=lambda: VirtualDevice.from_device(cpu(0)))
    node_devices: dict[str, VirtualDevice] = field(default_factory=dict)
    func_devices: dict[str, VirtualDevice] = field(default_factory=dict)
    input_devices: dict[str, VirtualDevice] = field(default_factory=dict)
    output_devices: dict[str, VirtualDevice] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_default(self.default_device)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], source: str = "<placement>") -> Placement:
        """Parse the JSON placement form; errors name the file and JSON path."""
        if not isinstance(doc, Mapping):
            raise PlanError(f"{source}: expected a JSON object with keys "
                            f"{', '.join(PLACEMENT_KEYS)}, got {type(doc).__name__}")
        unknown = [k for k in doc if k not in PLACEMENT_KEYS]
        if unknown:
            raise PlanError(f"{source} at $.{unknown[0]}: unknown key; allowed keys: "
                            + ", ".join(PLACEMENT_KEYS))
        kwargs: dict[str, Any] = {}
        if doc.get("default_device") is not None:
            where = f"{source} at $.default_device"
            kwargs["default_device"] = _check_default(
                parse_device_constraint(doc["default_device"], where), where)
        for key in PLACEMENT_KEYS[1:]:
            table = doc.get(key) or {}
            if not isinstance(table, Mapping):
                raise PlanError(f"{source} at $.{key}: expected an object mapping names to "
                                f"devices, got {type(table).__name__}")
            kwargs[key] = {str(name): parse_device_constraint(spec, f"{source} at $.{key}"
                                                              f"[{json.dumps(str(name))}]")
                           for name, spec in table.items()}
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Placement:
        """Read a placement JSON file."""
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except OSError as e:
            raise PlanError(f"cannot read placement file {os.fspath(path)!r}: {e}") from e
        except json.JSONDecodeError as e:
            raise PlanError(f"{os.fspath(path)}: not JSON: {e}") from e
        except UnicodeDecodeError as e:
            raise PlanError(f"{os.fspath(path)}: not UTF-8 text (byte {e.start}: "
                            f"{e.reason})") from e
        except RecursionError as e:
            raise PlanError(f"{os.fspath(path)}: not JSON: nested too deeply") from e
        except ValueError as e:  # integers of thousands of digits
            raise PlanError(f"{os.fspath(path)}: not JSON: {str(e)[:120]}") from e
        return cls.from_dict(doc, os.fspath(path))

    @classmethod
    def from_options(cls, default: str | None = None, place: Iterable[str] = (),
                     inputs: Iterable[str] = (), outputs: Iterable[str] = (),
                     base: Placement | None = None) -> Placement:
        """Build from CLI-style "KEY=DEVICE" strings (--place, --input, --output) over a base.

        Later options override the base's entry for the same key.
        """
        result = base.copy() if base is not None else cls()
        if default is not None:
            result.default_device = _check_default(parse_device_constraint(default, "--default"),
                                                   "--default")
        for flag, items, table in (("--place", place, result.node_devices),
                                   ("--input", inputs, result.input_devices),
                                   ("--output", outputs, result.output_devices)):
            for item in items:
                key, sep, spec = item.rpartition("=")
                if not sep or not key or not spec:
                    raise PlanError(f"{flag} {item!r}: expected NAME=DEVICE, e.g. "
                                    f"{flag} 'conv*=opencl:0'")
                table[key] = parse_device_constraint(spec, f"{flag} {item}")
        return result

    @classmethod
    def from_graph(cls, graph: Graph, default_device: str = "cpu:0") -> Placement:
        """Pin every node where a planned graph already puts it (rule 9: replanning is a no-op)."""
        codes = graph.column("device_index")
        if codes is None:
            raise PlanError(f"{graph.source}: has no device_index column, so its nodes have no "
                            "devices to pin; plan it first")
        ids = graph.column("device_id")
        node_devices = {}
        for node in graph.nodes:
            eid = graph.node_row_ptr[node.nid]
            if graph.node_row_ptr[node.nid + 1] == eid:
                continue
            dev = Device(codes[eid], ids[eid] if ids is not None else 0)
            node_devices[glob_escape(node.name)] = VirtualDevice.from_device(dev)
        return cls(parse_device_constraint(default_device, "default_device"), node_devices)

    def copy(self) -> Placement:
        return Placement(self.default_device, dict(self.node_devices), dict(self.func_devices),
                         dict(self.input_devices), dict(self.output_devices))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form from_dict reads back."""
        doc: dict[str, Any] = {"default_device": device_to_json(self.default_device)}
        for key in PLACEMENT_KEYS[1:]:
            table = getattr(self, key)
            if table:
                doc[key] = {name: device_to_json(dev) for name, dev in table.items()}
        return doc


def _check_default(dev: VirtualDevice, where: str = "default_device") -> VirtualDevice:
    if dev.device_type is None:
        raise PlanError(f"{where}: {dev} has no device type; give one such as \"cpu\" "
                        "or \"cuda:0\"")
    return dev


def glob_escape(name: str) -> str:
    """A pattern matching exactly name, even when name contains *, ? or [."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in name)


def device_to_json(dev: VirtualDevice) -> str | dict[str, Any]:
    """ "cuda:1" / "cuda" when only type and id are set, else the dict form."""
    if dev.target is None and dev.memory_scope is None and dev.device_type is not None:
        text = str(dev)
        return text
    doc: dict[str, Any] = {}
    if dev.device_type is not None:
        doc["device_type"] = Device(dev.device_type).kind
    if dev.virtual_device_id is not None:
        doc["device_id"] = dev.virtual_device_id
    if dev.target is not None:
        doc["target"] = dev.target
    if dev.memory_scope is not None:
        doc["memory_scope"] = dev.memory_scope
    return doc
