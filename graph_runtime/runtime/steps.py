"""The executor's prepared steps: one kernel or copy call each, with its argument arrays bound."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Hashable, NamedTuple

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


@dataclass
class KernelCache:
    """Prepared kernels a symbolic module's specialisations share: a node met again with the
    same input and output shapes (a shape come back, a node whose shapes no dim changes: a
    decoder's products at one new token), and for a chain with symbolic attrs the same values of
    the dims they read, takes the kernel prepared before, primitives and packed weights
    included. A kernel holding no node's data (no derived weights, no sub-modules) is kept by
    its function and node attrs instead of its node, so it serves every node calling them at
    those shapes (a decoder's layers); one taking any shape (PreparedKernel.any_shape: a KV
    cache's concatenate, the attention products, a dense in pieces) is kept by its rows' band
    and last dims' size classes (executor._rounded_shapes), so it serves every past length of a
    class and every prompt of over 16 rows, where its tuning choices pick it too; one that
    serves the next class as well is kept under that class's key too (get_as). A kernel is
    kept while a specialisation kept by the module uses it.

    Only a kernel no setup pass adapts to its module is shared: none told its arrays are stored
    channels-last (one that may be is kept only once its module's layout pass told it nothing:
    settle), none whose storage it asks for, and none deriving data (packed weights) from an
    input other than a param (params are never written in place: a new load makes new arrays,
    and the cache is emptied then). `prepared` counts kernels made, `reused` those taken here.
    """

    params: Collection[int] = ()  # entry ids of the params
    # per param's entry id: its array, which a specialisation built in full takes as that
    # entry's storage (adopted right after: no buffer of the param's size allocated to drop)
    param_arrays: dict[int, Any] = field(default_factory=dict)
    kernels: dict[Hashable, Any] = field(default_factory=dict)
    users: dict[Hashable, int] = field(default_factory=dict)  # kept specialisations using each
    taken: list[Hashable] = field(default_factory=list)  # keys the module being made uses
    pending: list[tuple[Hashable, Any, PreparedKernel]] = field(default_factory=list)
    prepared: int = 0
    reused: int = 0
    generation: int = 0  # counts clear(): an executor's kernels taken before are not kept
    # per node id: its steps' argument keys, the same in every specialisation (devices and
    # flatten_data do not change with shapes), made once instead of per shape
    arg_keys: dict[int, list[ArgKey]] = field(default_factory=dict)
    functions: dict[int, str] = field(default_factory=dict)  # per node id: its function's ident
    # the first specialisation's node devices and inserted copies, which every other shares
    # (runtime/placement.py's replan_placement), and the storage ids its placement checked
    placement: tuple[list[Device], list[Any], object] | None = None

    def get(self, key: Hashable) -> Any:
        fn = self.kernels.get(key)
        if fn is not None:
            self.reused += 1
            self.taken.append(key)
        return fn

    def put(self, key: Hashable | None, fn: Any, kernel: PreparedKernel, eids: list[int]
            ) -> None:
        """Count fn as prepared; keep it when sharing it is safe (see the class docstring) and
        it has a key (a node whose attrs hold shape-deciding values has none)."""
        self.prepared += 1
        if key is None or kernel.storage_requests():
            return
        if any(eids[pos] not in self.params for pos in kernel.cached_inputs()):
            return
        if kernel.channels_last_positions():
            self.pending.append((key, fn, kernel))
            return
        self.kernels[key] = fn
        self.taken.append(key)

    def settle(self, told: Collection[int]) -> None:
        """Keep the pending kernels (put, offering NHWC positions) whose module's layout pass
        told them nothing: told holds the ids of those it told."""
        for key, fn, kernel in self.pending:
            if id(kernel) not in told:
                self.kernels[key] = fn
                self.taken.append(key)
        self.pending = []

    def get_as(self, key: Hashable, kept: Hashable) -> Any:
        """get(key), the kernel kept under `kept` kept under key too where key holds none (an
        any-shape kernel serving the next size class of its arrays: a decoder's mask chains
        past 64 tokens, re-pointed instead of derived); None where neither holds one."""
        if key not in self.kernels and kept in self.kernels:
            self.kernels[key] = self.kernels[kept]
        return self.get(key)

    def hold(self) -> list[Hashable]:
        """The keys the module just made uses, now counted as its (release them with it)."""
        keys, self.taken = self.taken, []
        for key in keys:
            self.users[key] = self.users.get(key, 0) + 1
        return keys

    def release(self, keys: list[Hashable]) -> None:
        """A module dropped: the kernels no kept module uses go."""
        for key in keys:
            left = self.users.get(key, 0) - 1
            if left > 0:
                self.users[key] = left
            else:
                self.users.pop(key, None)
                self.kernels.pop(key, None)

    def clear(self) -> None:
        self.generation += 1
        self.kernels.clear()
        self.users.clear()
