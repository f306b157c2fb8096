"""Matching a Placement against a graph: the constraints naming each node and output (rule 1)."""
from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from typing import Mapping

from ..errors import PlanError
from .constraints import Constraint, Placement
from ..graph.topology import Topology
from .virtual_device import VirtualDevice, join, join_conflict

_GLOB_CHARS = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class Pinned:
    """The joined constraint on one node or output, with the constraints it came from."""

    device: VirtualDevice
    sources: tuple[Constraint, ...]


@dataclass(frozen=True)
class Resolved:
    """Constraints per node id and per head index; nodes and heads not listed are free."""

    nodes: dict[int, Pinned]
    heads: dict[int, Pinned]


def resolve(topo: Topology, placement: Placement) -> Resolved:
    """Join every constraint naming each node and head; a failed join is a PlanError (rule 1)."""
    found: dict[int, list[Constraint]] = {}
    by_name: dict[str, list[int]] = {}
    for nid, node in enumerate(topo.nodes):
        by_name.setdefault(node.name, []).append(nid)
    for pattern, dev in placement.node_devices.items():
        source = f"node_devices[{json.dumps(pattern)}]"
        nids = _match(pattern, by_name)
        if not nids:
            raise PlanError(f"{source} matches no node; node names are: "
                            + _sample(by_name))
        for nid in nids:
            found.setdefault(nid, []).append(Constraint(dev, source))
    funcs: dict[str, list[int]] = {}
    for nid, node in enumerate(topo.nodes):
        if node.func_name is not None and not node.is_arg:
            funcs.setdefault(node.func_name, []).append(nid)
    for pattern, dev in placement.func_devices.items():
        source = f"func_devices[{json.dumps(pattern)}]"
        nids = _match(pattern, funcs)
        if not nids:
            raise PlanError(f"{source} matches no func_name; func_names are: " + _sample(funcs))
        for nid in nids:
            found.setdefault(nid, []).append(Constraint(dev, source))
    args = {name: [nid for nid in nids if topo.nodes[nid].is_arg] for name, nids in by_name.items()}
    args = {name: nids for name, nids in args.items() if nids}
    for name, dev in placement.input_devices.items():
        source = f"input_devices[{json.dumps(name)}]"
        if name not in args:
            raise PlanError(f"{source}: graph has no input {name!r}; inputs are: " + _sample(args))
        for nid in args[name]:
            found.setdefault(nid, []).append(Constraint(dev, source))
    nodes = {nid: _join_all(topo.label(nid), cons) for nid, cons in sorted(found.items())}
    return Resolved(nodes, _resolve_heads(topo, placement.output_devices))


def _resolve_heads(topo: Topology,
                   output_devices: Mapping[str, VirtualDevice]) -> dict[int, Pinned]:
    keys: dict[str, list[int]] = {}
    for k, (nid, index) in enumerate(topo.heads):
        name = topo.nodes[nid].name
        for key in (str(k), f"{name}:{index}") + ((name,) if index == 0 else ()):
            keys.setdefault(key, []).append(k)
    found: dict[int, list[Constraint]] = {}
    for key, dev in output_devices.items():
        source = f"output_devices[{json.dumps(key)}]"
        if key not in keys:
            raise PlanError(f"{source}: graph has no output {key!r}; outputs are: "
                            + ", ".join(f"{k} ({topo.nodes[nid].name}:{index})"
                                        for k, (nid, index) in enumerate(topo.heads)))
        for k in dict.fromkeys(keys[key]):
            found.setdefault(k, []).append(Constraint(dev, source))
    return {k: _join_all(f"output {k}", cons) for k, cons in sorted(found.items())}


def _match(pattern: str, table: Mapping[str, list[int]]) -> list[int]:
    if not _GLOB_CHARS.search(pattern):
        return list(table.get(pattern, []))
    regex = re.compile(fnmatch.translate(pattern))
    return [nid for name, nids in table.items() if regex.match(name) for nid in nids]


def _sample(table: Mapping[str, list[int]], limit: int = 12) -> str:
    names = list(table)
    if not names:
        return "(none)"
    return ", ".join(names[:limit]) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def _join_all(where: str, cons: list[Constraint]) -> Pinned:
    device = cons[0].device
    for i, con in enumerate(cons[1:], start=1):
        joined = join(device, con.device)
        if joined is None:
            other = next((c for c in cons[:i] if join(c.device, con.device) is None), None)
            if other is not None:
                raise PlanError(f"{where}: {other} conflicts with {con} "
                                f"({join_conflict(other.device, con.device)})")
            raise PlanError(f"{where}: {con} conflicts with the join of "
                            + ", ".join(str(c) for c in cons[:i]) + f", which is {device}")
        device = joined
    return Pinned(device, tuple(cons))
