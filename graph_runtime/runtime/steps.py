"""The executor's prepared steps: one kernel or copy call each, with its argument arrays bound."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from ..backends import check_device, run_in_scope
from ..device import Device
from ..lib.prepared import PreparedKernel


class ArgKey(NamedTuple):
    """Which array a step's argument is: entry eid as it lives on device, flattened to 1-D or
    not (a node with flatten_data)."""

    eid: int
    device: Device
    flat: bool


@dataclass
class PreparedCall:
    """One prepared call: a kernel or a copy, with its argument arrays bound.

    Not to be confused with lib.chain.Step, one op inside a fused function.
    """

    nid: int            # node id; -1 for a copy the executor inserted
    label: str
    func_name: str
    device: Device
    fn: Callable[..., Any]
    args: list[Any]
    arg_keys: list[ArgKey]
    num_inputs: int     # arg_keys[:num_inputs] are read, the rest written
    is_copy: bool
    kernel: PreparedKernel  # what the executor may ask of fn (lib/prepared.py), unwrapped


def in_device_scope(fn: Callable[..., Any], dev: Device) -> Callable[..., Any]:
    """Wrap fn so it runs with dev current, for backends that have a current device (CUDA).

    Device 0 is current by default, so its kernels skip the wrapper (standard ops enter the
    backend's scope themselves, for its stream).
    """
    if dev.device_id == 0:
        return fn
    return run_in_scope(check_device(dev), dev.device_id, fn)
