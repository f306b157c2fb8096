"""Device-aware storage pool: bytes per storage id, one device per id, a view per entry."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from .._text import fmt_bytes
from ..backends import check_device
from ..backends.cpu import host_arena
from ..device import Device, cuda
from ..errors import DeviceError, GraphError
from ..graph.model import Graph, entry_bytes


@dataclass
class PoolLayout:
    """Which device and how many bytes each storage id needs, before anything is allocated."""

    sid_bytes: dict[int, int]
    sid_device: dict[int, Device]
    sid_first_entry: dict[int, int]
    entry_sid: list[int]
    entry_bytes: list[int]
    entry_device: list[Device]
    extra_bytes: dict[Device, int] = field(default_factory=dict)  # buffers outside the pool
    # Kernels' own memory (chain intermediates, im2col, padded weights), known after prepare.
    workspace_bytes: dict[Device, int] = field(default_factory=dict)
    # the entries of each storage id, made once and shared by the layouts resized from this
    # one (the ids stay): see entries_of
    sid_entries: dict[int, list[int]] | None = field(default=None, repr=False, compare=False)

    def entries_of(self, sid: int) -> list[int]:
        """The entries storage id sid holds."""
        if self.sid_entries is None:
            self.sid_entries = {}
            for eid, owner in enumerate(self.entry_sid):
                self.sid_entries.setdefault(owner, []).append(eid)
        return self.sid_entries[sid]

    def bytes_per_device(self) -> dict[Device, int]:
        """Pool bytes per device with storage sharing, as allocated."""
        totals: dict[Device, int] = {}
        for sid, nbytes in self.sid_bytes.items():
            dev = self.sid_device[sid]
            totals[dev] = totals.get(dev, 0) + nbytes
        for dev, nbytes in self.extra_bytes.items():
            totals[dev] = totals.get(dev, 0) + nbytes
        return totals

    def resized(self, graph: Graph, changed: Collection[int]) -> PoolLayout:
        """This layout with graph's sizes for the entries in changed (another specialisation of
        a symbolic graph: the same storage ids and devices), each of their ids sized again."""
        shapes, dtypes = graph.attrs["shape"][1], graph.attrs["dltype"][1]
        sizes = list(self.entry_bytes)
        sid_bytes = dict(self.sid_bytes)
        touched = set()
        for eid in changed:
            sizes[eid] = entry_bytes(shapes[eid], dtypes[eid])
            touched.add(self.entry_sid[eid])
        for sid in touched:
            sid_bytes[sid] = max(sizes[eid] for eid in self.entries_of(sid))
        return PoolLayout(sid_bytes, self.sid_device, self.sid_first_entry, self.entry_sid, sizes,
                          self.entry_device, dict(self.extra_bytes), dict(self.workspace_bytes),
                          self.sid_entries)

    def unshared_bytes_per_device(self) -> dict[Device, int]:
        """What the pool would take if no two entries shared a storage id."""
        totals: dict[Device, int] = {}
        for eid, nbytes in enumerate(self.entry_bytes):
            dev = self.entry_device[eid]
            totals[dev] = totals.get(dev, 0) + nbytes
        for dev, nbytes in self.extra_bytes.items():
            totals[dev] = totals.get(dev, 0) + nbytes
        return totals


def layout_pool(graph: Graph, entry_device: Sequence[Device]) -> PoolLayout:
    """Size each storage id (max over its entries) and check each id stays on one device."""
    sid_bytes: dict[int, int] = {}
    sid_device: dict[int, Device] = {}
    sid_first: dict[int, int] = {}
    sids: list[int] = []
    sizes: list[int] = []
    # the columns read once (a decoder's step lays out its pool here)
    columns = zip(graph.attrs["storage_id"][1], graph.attrs["shape"][1], graph.attrs["dltype"][1],
                  entry_device)
    for eid, (sid, shape, dtype, dev) in enumerate(columns):
        nbytes = entry_bytes(shape, dtype)
        sids.append(sid)
        sizes.append(nbytes)
        if sid not in sid_device:
            sid_device[sid] = dev
            sid_first[sid] = eid
            sid_bytes[sid] = nbytes
            continue
        if sid_device[sid] != dev:
            first = sid_first[sid]
            raise GraphError(
                f"{graph.source}: storage id {sid} is used on {sid_device[sid]} by entry {first} "
                f"({_entry_label(graph, first)}) and on {dev} by entry {eid} "
                f"({_entry_label(graph, eid)}); a storage id must stay on one device")
        if nbytes > sid_bytes[sid]:
            sid_bytes[sid] = nbytes
    return PoolLayout(sid_bytes, sid_device, sid_first, sids, sizes, list(entry_device))


def check_capacity(graph: Graph, plan: PoolLayout, caps: Mapping[Device, int]) -> None:
    """Refuse a plan whose bytes on some device exceed that device's cap, naming the biggest ids."""
    for dev, total in plan.bytes_per_device().items():
        cap = caps.get(dev)
        if cap is None or total <= cap:
            continue
        on_dev = [sid for sid, d in plan.sid_device.items() if d == dev]
        worst = max(on_dev, key=lambda sid: plan.sid_bytes[sid]) if on_dev else None
        detail = ""
        if worst is not None:
            eid = max(plan.entries_of(worst), key=lambda e: plan.entry_bytes[e])
            detail = (f"; the largest is storage id {worst} ({fmt_bytes(plan.sid_bytes[worst])}) "
                      f"for entry {eid} ({_entry_label(graph, eid)}, shape "
                      f"{tuple(graph.shape(eid))} {graph.dtype(eid)})")
        raise GraphError(f"{graph.source}: the storage pool needs {fmt_bytes(total)} on {dev} but "
                         f"the cap is {fmt_bytes(cap)}{detail}; pass memory_cap= to raise the cap")


def default_caps(devices: Sequence[Device]) -> dict[Device, int]:
    """Each device's capacity as its backend reports it."""
    return {dev: check_device(dev).memory_capacity(dev.device_id) for dev in set(devices)}


SCRATCH_ALIGN = 64  # each id's bytes in the scratch start on a SIMD-friendly boundary


class Scratch:
    """Host memory a symbolic module's specialisations share for their intermediates.

    Only one specialisation of a module runs at a time, and an intermediate is dead once run()
    returns, so every specialisation's intermediate storage ids can live in the same bytes.
    A new shape then allocates nothing: a fresh buffer costs its page faults on first touch
    (about 0.9 ms per MB on a VM, 40 ms of a 200 ms first run at LLaMA's (4, 194)). The buffer
    grows to the largest need seen (by half again at least, so growing is rare); a module made
    before keeps its slice of the old buffer alive until it is dropped.

    A derived specialisation's graph inputs and outputs (StoragePool.resized) share bytes the
    same way, one growing buffer per storage id: their values matter only while it is the
    current one (made current, it is given every input again; get_output answers for the
    current one), and a decode step's new length then touches no new page (211 page faults a
    step before, about 1.7 us each here, for its 16 past and present tensors).
    """

    def __init__(self) -> None:
        self.buffers: dict[Device, Any] = {}
        self.io: dict[int, tuple[Device, Any]] = {}  # per graph input or output's storage id

    def take(self, dev: Device, nbytes: int) -> Any:
        """At least nbytes of dev's scratch (grown if short)."""
        held = self.buffers.get(dev)
        if held is None or held.nbytes < nbytes:
            held = self.buffers[dev] = _grown(held, dev, nbytes)
        return held

    def take_io(self, sid: int, dev: Device, nbytes: int) -> Any:
        """nbytes of the buffer the specialisations share for storage id sid (an input's or
        output's, always on dev), grown if short."""
        held = self.io.get(sid)
        if held is None or held[1].nbytes < nbytes:
            held = self.io[sid] = (dev, _grown(None if held is None else held[1], dev, nbytes))
        return held[1][:nbytes]

    def io_bytes(self, sid: int) -> int:
        """How many bytes take_io gives storage id sid without growing."""
        held = self.io.get(sid)
        return 0 if held is None else int(held[1].nbytes)

    def held_bytes(self) -> dict[Device, int]:
        held: dict[Device, int] = {}
        for dev, array in [*self.buffers.items(), *self.io.values()]:
            held[dev] = held.get(dev, 0) + int(array.nbytes)
        return held


def _grown(held: Any, dev: Device, nbytes: int) -> Any:
    """A new buffer of at least nbytes, by half again over held at least (growing is rare)."""
    size = nbytes if held is None else max(nbytes, held.nbytes * 3 // 2)
    return check_device(dev).alloc(dev.device_id, size)


class StoragePool:
    """One buffer per storage id on its device; entries are views of any dtype/shape over it.

    held: ids given the array they hold (a param's, which every specialisation binds).
    With a Scratch, the ids in scratch_ids that live on the host are slices of it instead
    (scratch_bytes: how much of it per device), each starting SCRATCH_ALIGN-aligned.
    """

    def __init__(self, graph: Graph, plan: PoolLayout, scratch: Scratch | None = None,
                 scratch_ids: Collection[int] = (), pinned: Collection[int] = (),
                 held: Mapping[int, Any] | None = None) -> None:
        self.plan = plan
        self.buffers: dict[int, Any] = {}
        self.scratch_bytes: dict[Device, int] = {}
        self.scratch_ids: frozenset[int] = frozenset()  # the ids sliced from the Scratch
        self.io_ids: frozenset[int] = frozenset()  # the ids in its shared io bytes (resized)
        if scratch is not None:
            self._slice_scratch(scratch, [sid for sid in sorted(scratch_ids)
                                          if plan.sid_device[sid].kind == "cpu"
                                          and sid not in pinned])
        for sid, array in (held or {}).items():  # ids given their bytes (Executor's params)
            self.buffers[sid] = array
        for sid in sorted(pinned):  # host ids a GPU copies from or into (Executor.pinned_ids)
            if sid not in self.buffers:
                self.buffers[sid] = pinned_host(plan.sid_bytes[sid])
        left = [(sid, nbytes) for sid, nbytes in sorted(plan.sid_bytes.items())
                if sid not in self.buffers]
        if scratch is None:  # (a specialisation's ids are shared with the ones derived from
            # it, which would keep an arena alive whole: each its own buffer there)
            self.buffers.update(_host_buffers([(sid, nbytes) for sid, nbytes in left
                                               if plan.sid_device[sid].kind == "cpu"]))
        for sid, nbytes in left:
            if sid not in self.buffers:
                self.buffers[sid] = _alloc(sid, nbytes, plan.sid_device[sid])
        # each device's backend and each dtype, looked up once (_view makes a decode step's
        # ~26 new views per length with them)
        backends = self._backends = {dev: check_device(dev)
                                     for dev in set(plan.sid_device.values())}
        shapes, dtypes = graph.attrs["shape"][1], graph.attrs["dltype"][1]
        types = self._types = {name: np.dtype(name) for name in set(dtypes)}
        self.views: list[Any] = []
        for eid, sid in enumerate(plan.entry_sid):
            self.views.append(backends[plan.sid_device[sid]].view(
                self.buffers[sid], 0, tuple(shapes[eid]), types[dtypes[eid]]))

    def _slice_scratch(self, scratch: Scratch, sids: list[int]) -> None:
        offsets: dict[Device, int] = {}
        places = []
        for sid in sids:
            dev = self.plan.sid_device[sid]
            start = offsets.get(dev, 0)
            places.append((sid, dev, start))
            nbytes = self.plan.sid_bytes[sid]
            offsets[dev] = start + -(-nbytes // SCRATCH_ALIGN) * SCRATCH_ALIGN
        buffers = {dev: scratch.take(dev, total) for dev, total in offsets.items()}
        self.scratch_ids = frozenset(sid for sid, _, _ in places)
        for sid, dev, start in places:  # each up to the next id's start: room to grow (resized)
            nbytes = -(-self.plan.sid_bytes[sid] // SCRATCH_ALIGN) * SCRATCH_ALIGN
            self.buffers[sid] = buffers[dev][start:start + nbytes]
        self.scratch_bytes = offsets

    def resized(self, graph: Graph, plan: PoolLayout, changed: Collection[int],
                fresh: Collection[int], scratch: Scratch | None = None
                ) -> tuple[StoragePool, set[int]] | None:
        """This pool over plan (PoolLayout.resized: the same ids, other sizes) for another
        specialisation, which runs only when this one does not: the ids in fresh (graph inputs
        and outputs) get the scratch's shared bytes for them (Scratch.take_io; without one,
        buffers of their own: io_ids says which), every other id keeps its buffer, None where
        one is too small for its new bytes. With it, the entries whose views are new: those in
        changed and those of the fresh ids."""
        for eid in changed:
            sid = plan.entry_sid[eid]
            if sid not in fresh and self.buffers[sid].nbytes < plan.sid_bytes[sid]:
                return None
        new = copy.copy(self)
        new.plan, new.buffers, new.views = plan, dict(self.buffers), list(self.views)
        shared = set()
        for sid in fresh:
            dev = plan.sid_device[sid]
            if scratch is None or dev.kind != "cpu":
                new.buffers[sid] = _alloc(sid, plan.sid_bytes[sid], dev)
            else:
                new.buffers[sid] = scratch.take_io(sid, dev, plan.sid_bytes[sid])
                shared.add(sid)
        new.io_ids = frozenset(shared)
        renewed = set(changed)
        for sid in fresh:
            renewed.update(plan.entries_of(sid))
        for eid in renewed:
            new.views[eid] = new._view(graph, eid)
        return new, renewed

    def _view(self, graph: Graph, eid: int) -> Any:
        """Entry eid's view of its storage id's buffer, at graph's shape and dtype."""
        sid = self.plan.entry_sid[eid]
        dtype = graph.attrs["dltype"][1][eid]
        return self._backends[self.plan.sid_device[sid]].view(
            self.buffers[sid], 0, tuple(graph.attrs["shape"][1][eid]),
            self._types.get(dtype) or np.dtype(dtype))

    def own_io(self, graph: Graph) -> list[tuple[int, Any, Any]]:
        """Give the ids in io_ids buffers of their own, their bytes copied (a specialisation
        handed out, which may then run or be read on its own); (entry, old view, new view) for
        each of their entries."""
        moved = []
        for sid in sorted(self.io_ids):
            buffer = _alloc(sid, self.plan.sid_bytes[sid], self.plan.sid_device[sid])
            buffer[...] = self.buffers[sid]
            self.buffers[sid] = buffer
            for eid in self.plan.entries_of(sid):
                old, self.views[eid] = self.views[eid], self._view(graph, eid)
                moved.append((eid, old, self.views[eid]))
        self.io_ids = frozenset()
        return moved

    def owns_storage(self, eid: int) -> bool:
        """True when no other entry shares eid's storage id (nothing else writes its bytes) and
        no other specialisation shares its bytes (io_ids)."""
        sid = self.plan.entry_sid[eid]
        return len(self.plan.entries_of(sid)) == 1 and sid not in self.io_ids

    def can_place(self, eid: int, array: Any) -> bool:
        """Whether place(eid, array) may: entry eid shares its storage id with no other entry
        and array has its shape and dtype."""
        old = self.views[eid]
        return (self.owns_storage(eid) and tuple(array.shape) == tuple(old.shape)
                and array.dtype == old.dtype)

    def place(self, eid: int, array: Any) -> None:
        """Make array entry eid's storage (a kernel's layout), dropping the pool's buffer; array
        is given the entry's current values. Only where can_place(eid, array).
        """
        sid = self.plan.entry_sid[eid]
        old = self.views[eid]
        if not self.can_place(eid, array):
            raise AssertionError(f"entry {eid} cannot take a {array.dtype} {array.shape} array "
                                 f"as its storage")
        array[...] = old
        self.buffers[sid] = array
        self.views[eid] = array

    def adopt(self, eid: int, array: Any) -> None:
        """Drop the pool's buffer for eid when it is its id's only user: array (bound with
        Executor.rebind, e.g. another module's param) replaces it, so the memory is not held
        twice."""
        if self.owns_storage(eid):
            self.buffers[self.plan.entry_sid[eid]] = array
            self.views[eid] = array


def pinned_host(nbytes: int) -> Any:
    """Page-locked host bytes (from the CUDA backend, which has the allocator)."""
    backend: Any = check_device(cuda(0))
    return backend.pinned_host(nbytes)


def _alloc(sid: int, nbytes: int, dev: Device) -> Any:
    """Storage id sid's buffer on dev; DeviceError naming the id where the backend fails."""
    try:
        return check_device(dev).alloc(dev.device_id, nbytes)
    except DeviceError:
        raise
    except Exception as e:  # out of memory surfaces as the backend library's own error
        raise DeviceError(f"allocating storage id {sid} ({fmt_bytes(nbytes)}) on {dev} "
                          f"failed: {type(e).__name__}: {e}") from e


def _host_buffers(sizes: Sequence[tuple[int, int]]) -> dict[int, Any]:
    """(storage id, bytes) on the host, each id's buffer a slice of one arena (host_arena:
    the weights a static module holds in its pool, read on huge pages); DeviceError naming
    them where the allocation fails."""
    if not sizes:
        return {}
    try:
        buffers = host_arena([nbytes for _, nbytes in sizes])
    except MemoryError as e:
        total = sum(nbytes for _, nbytes in sizes)
        raise DeviceError(f"allocating {len(sizes)} storage ids ({fmt_bytes(total)}) on the "
                          f"host failed: {type(e).__name__}: {e}") from e
    return {sid: buffer for (sid, _), buffer in zip(sizes, buffers)}


def _entry_label(graph: Graph, eid: int) -> str:
    nid, index = graph.entry_node(eid)
    return f"{graph.nodes[nid].label} output {index}"
