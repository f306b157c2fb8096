"""Turns a graph's nodes into a flat list of prepared calls (kernels and copies) and runs it."""
from __future__ import annotations

import copy
import functools
import logging
import math
import time
from contextlib import nullcontext
import dataclasses
from dataclasses import dataclass
from typing import (Any, Callable, Collection, ContextManager, Generic, Iterable, Iterator, Mapping,
                    Sequence, TypeVar)

import numpy as np

from .. import settings
from .._text import fmt_bytes
from ..backends import check_device, copy_array
from ..device import Device
from ..errors import GraphError, GraphRuntimeError, LibraryError
from ..graph.model import COPY_OP, NOP_OP, Graph, entry_bytes
from ..lib.attrs import WORKSPACE_LIMIT_KEY
from ..lib.kernels.cpu import team_gemv
from ..lib.kernels.threads import ONE_BLAS_THREAD
from ..lib.library import InputVersion, Module, TensorSpec
from ..lib.prepared import PreparedKernel, capabilities
from ..lib.registry import VALUES_KEY
from ..lib.symbolic_chain import DIMS_KEY, Binding
from ..lib.tuning import SMALL_DIM, class_shape
from .cuda_graph import CudaGraphRuns, cuda_graph_runs
from .native_runs import NativeRuns, native_runs
from .flatten_reads import FlattenRead, StagedOutputs, flat_source, plan_flatten_reads
from .in_place import InPlacePlan, in_place_offers, plan_in_place
from .layouts import LayoutPlan, nhwc_view, plan_channels_last
from .measure import add_bytes
from .placement import plan_placement, replan_placement, resolve_entry_devices
from .steps import ArgKey, KernelCache, PreparedCall, in_device_scope
from .storage import (PoolLayout, Scratch, StoragePool, check_capacity, default_caps,
                      pinned_host)
from .storage_check import check_liveness

log = logging.getLogger("graph_runtime")
_UNBOUND = object()  # Executor._bound: not worked out yet

P = TypeVar("P")


@dataclass(frozen=True)
class NodeTime:
    """Device-synchronised wall time of one step, median over the profiled runs."""

    nid: int
    label: str
    func_name: str
    device: Device
    is_copy: bool
    seconds: float


def _settles_later(kernel: PreparedKernel) -> bool:
    """Whether the channels-last pass may change this kernel's workspace (it takes NHWC)."""
    return bool(kernel.channels_last_positions())


def _refused(why: str) -> bool:
    """Executor.retarget's answer where it cannot: False, and why at debug level."""
    log.debug("retarget: %s; derived or built instead", why)
    return False


@dataclass
class ShapeState:
    """An executor at one shape it was made over (the entries its retargets move, at that
    shape): restore puts it back when the shape comes again (a server's next generation meets
    the lengths of the last), without inferring shapes or asking the kernels again."""

    graph: Graph
    moving: frozenset[int]  # the entries the executor's retargets had moved then
    views: dict[int, Any]  # per moving entry
    entry_bytes: dict[int, int]  # per moving entry
    sid_bytes: dict[int, int]  # per storage id of a moving entry
    io: dict[int, tuple[Any, Any]]  # per such id in the shared io bytes: (its slice, the buffer)
    bindings: dict[int, Any]  # Executor._bindings
    # the arrays restore put into the steps' arguments last, with the keys they were bound for
    # (Executor._moving_keys): the next restore whose keys are the same (the list itself may
    # be copied since: derive) puts them back as they are (each _bind a lookup and, flattened,
    # a reshape: 50 a decode step)
    bound: tuple[tuple[ArgKey, ...], list[Any]] | None = None


@dataclass(frozen=True)
class _Transit:
    """What retarget worked out for one change (the entries changing shape, the dims moving):
    their storage ids with each id's entries, the steps to ask (index, entries, kernel key)
    and those to re-point (index, argument positions)."""

    sids: list[tuple[int, tuple[int, ...]]]
    checks: list[tuple[int, list[int], Any]]
    repoint: list[tuple[int, list[int]]]
    # per entry changing shape: its dtype's itemsize (its bytes at each new shape)
    itemsizes: dict[int, int] = dataclasses.field(default_factory=dict)
    # per entry changing shape: its storage id, dtype and key in Executor.arrays (its new
    # view made by np.ndarray itself: the pool's checks hold, each id's bytes being sized)
    views: list[tuple[int, int, np.dtype, tuple[int, Device]]] = dataclasses.field(
        default_factory=list)


class Executor:
    """Prepared steps over a storage pool. Setup resolves everything; run() is a tight loop."""

    pool: StoragePool  # allocated by the storage setup pass, over the ids it plans
    cuda_graph: CudaGraphRuns | None

    def __init__(self, graph: Graph, lib: Module, ctxs: Sequence[Device], *, strict: bool = False,
                 memory_cap: int | Mapping[Device, int] | None = None,
                 kernels: KernelCache | None = None, scratch: Scratch | None = None,
                 base: Executor | None = None) -> None:
        self.graph = graph
        self._kernels = kernels  # shared with the other specialisations of a symbolic module
        self._scratch = scratch  # ditto: host memory for the intermediates (storage.Scratch)
        self.ctxs = list(ctxs)
        for dev in self.ctxs:
            check_device(dev)
        self.entry_device = resolve_entry_devices(graph, self.ctxs, strict)
        placed = kernels.placement if kernels is not None else None
        if placed is None:
            self.node_device, self.copies, plan = plan_placement(graph, self.entry_device,
                                                                 self.ctxs[0], strict)
            if kernels is not None:  # with the storage ids checked
                kernels.placement = (self.node_device, self.copies, graph.attrs["storage_id"][1])
        else:  # another specialisation of the module's graph: only sizes change
            self.node_device = placed[0]
            self.copies, plan = replan_placement(graph, self.entry_device, *placed)
        for c in self.copies:
            log.info("%s: inserted a copy of eid %d (%s) from %s to %s for %s", graph.source,
                     c.eid, c.producer, c.src, c.dst, ", ".join(c.readers))
        self.caps = self._caps(plan, memory_cap)
        check_capacity(graph, plan, self.caps)
        self.plan: PoolLayout = plan
        # Every array a step may touch, by (eid, device): inserted copies' buffers, then the
        # pool's views once the storage pass has planned the ids and allocated it.
        self.arrays: dict[tuple[int, Device], Any] = {}
        for c in self.copies:
            shape, dtype = tuple(graph.shape(c.eid)), np.dtype(graph.dtype(c.eid))
            if c.dst.kind == "cpu" and c.src.kind == "cuda":  # page-locked: see pinned_ids
                nbytes = entry_bytes(shape, graph.dtype(c.eid))
                self.arrays[(c.eid, c.dst)] = pinned_host(nbytes).view(dtype).reshape(shape)
            else:
                self.arrays[(c.eid, c.dst)] = check_device(c.dst).empty(c.dst.device_id, shape,
                                                                       dtype)
        # Same-device __copy nodes whose readers read the source directly (no step).
        self.dropped_copies: set[int] = set()
        self._aliased: set[int] = set()
        # (reader's key, source's key) per dropped copy: the reader's array is the source's.
        self._alias_keys: list[tuple[tuple[int, Device], tuple[int, Device]]] = []
        self._io_eids = set(graph.input_entries.values()) | set(graph.output_entries)
        # per step index whose kernel came from the shared cache and may be told NHWC: how to
        # prepare one of its own (telling changes the kernel)
        self._unshare: dict[int, Callable[[], Any]] = {}
        self._told: set[int] = set()  # step indices the layout pass told of NHWC arrays
        self._uses: dict[tuple[int, Device], list[tuple[list[Any], int, bool]]] | None = None
        self._ready = False  # set up: rebind() may index the steps' arguments once
        # per node id: the key its kernel is kept under in the shared cache (a later
        # specialisation made from this one takes the kernel of a node whose shapes it keeps)
        self.kernel_keys: dict[int, Any] = {}
        # derive's index of the steps' entries and dims (_touched), shared by derived executors
        self._step_index: tuple[dict[int, list[int]], list[tuple[int, frozenset[str]]],
                                set[int]] | None = None
        self._input_eids: set[int] | None = None  # the graph inputs' entries (_plan_versions)
        self._bindings: dict[int, Any] = {}  # per symbolic chain's node: _bound
        # the entries retarget gave new views, and where the steps hold them (_moving_args)
        self._moving: set[int] = set()
        self._moving_index: list[tuple[list[Any], int, ArgKey]] | None = None
        self._moving_keys: tuple[ArgKey, ...] = ()  # _moving_index's keys, in its order
        self._moving_steps: list[int] = []  # the steps (and shortcuts) _moving_index reaches
        # for state(), made with each _moving_index: (that list, the moving entries, their ids)
        self._state_index: tuple[list[Any], frozenset[int], tuple[int, ...]] | None = None
        # retarget's work per change met (_Transit), and the pool's bytes per device as its
        # last growth check counted them (None: count again)
        self._transits: dict[tuple[tuple[int, ...], frozenset[str]], _Transit] = {}
        # (step index, kernel key) whose retarget check holds at every shape (_settles_by_rank)
        self._settled: set[tuple[int, Any]] = set()
        # per symbolic chain node: whether its attrs read dims beyond shape targets (_reads_values)
        self._value_reads: dict[int, bool] = {}
        self._pool_bytes: dict[Device, int] | None = None
        # the shared cache's generation its kernels were taken in (KernelCache.clear)
        self._generation = kernels.generation if kernels is not None else 0
        self.escaped_entries: set[int] = set()  # entries escaped() (the count may miss writes)
        # per device: workspace counted but not yet checked against the cap (_count_workspace)
        self._unsettled: dict[Device, int] = {}
        # whether the storage plan's bytes (the inputs, weights among them, and every other
        # entry) stay in the cache between runs: few-row products then read their weights as
        # given, each thread the same rows (team_gemv.weights_cached)
        self._weights_cached = team_gemv.cache_holds(sum(plan.bytes_per_device().values()))
        # The steps' kernels, prepared from shapes alone: the storage pass binds their arrays.
        self.steps = self._prepare_steps(lib, base)
        # Entries no setup pass may change the layout or storage of: inputs, outputs, aliased.
        self._excluded = self._io_eids | self._aliased
        # What the setup passes (SETUP_PASSES, in that order) decide:
        # entries kept NHWC between kernels that write and read them so (runtime/layouts.py);
        self.channels_last: set[int] = set()
        # (input eid, output eid) pairs whose kernel writes the output over the input, given
        # the input's storage id by the storage plan;
        self.in_place: list[tuple[int, int]] = []
        # steps run() runs otherwise: flattens it skips, their readers reading the source
        # (runtime/flatten_reads.py); run_steps runs every step as prepared;
        self.skipped: set[int] = set()
        self.shortcuts: dict[int, PreparedCall] = {}
        # write counters of graph inputs that kernels derive data from (lib.library.InputVersion).
        self.versions: dict[int, InputVersion] = {}
        self.placed: set[int] = set()  # entries stored in arrays their kernels asked for
        for setup in SETUP_PASSES:
            setup.apply(self, setup.plan(self))
        if self._kernels is not None:
            # kernels that offered NHWC positions and were told none are the same as prepared
            self._kernels.settle({id(self.steps[i].kernel) for i in self._told})
        self._unshare.clear()
        self._ready = True
        # the steps no other executor holds (derive shares those whose arrays stay): retarget
        # changes their arguments in place, and copies any other first
        self._own = {id(step) for step in self.steps}
        self.devices = sorted(set(self.entry_device) | {c.dst for c in self.copies})
        self._finish()

    def _finish(self) -> None:
        """What run() calls, and the step each call stands for (to name a failing node)."""
        called = [i for i in range(len(self.steps)) if i not in self.skipped]
        self._call_steps = [self.shortcuts.get(i, self.steps[i]) for i in called]
        self._call_index = {i: n for n, i in enumerate(called)}  # (for _moved)
        self._calls = [(s.fn, s.args) for s in self._call_steps]
        # NOTE: kernels that spread work over the runtime's CPU workers (lib/kernels/threads.py)
        # need the cores to themselves: one threaded OpenBLAS call elsewhere in the run leaves
        # OpenBLAS threads spinning on them, which made ResNet-18 markedly slower (measured in
        # docs/measurements.md).
        self._blas_scope: ContextManager[None] = (
            ONE_BLAS_THREAD if any(s.kernel.uses_workers() for s in self.steps) else nullcontext())
        # On one GPU: run() captured as a CUDA graph and replayed (runtime/cuda_graph.py);
        # cuda_graph_reason says why not where it is None.
        self.cuda_graph, self.cuda_graph_reason = cuda_graph_runs(
            self.devices, bool(self.versions), self._run_calls, self.graph.source)
        # On the CPU: the steps' foreign calls recorded once and replayed from one compiled
        # loop (runtime/native_runs.py); native_reason says why not where it is None.
        self.native: NativeRuns | None = None
        self.native_reason = "on one GPU: a CUDA graph"
        if self.cuda_graph is None:
            self.native, self.native_reason = native_runs(
                self._call_steps, self._calls, self._run_listed, self.graph.source)

    # ---- another specialisation, made from this one ------------------------------------------

    def derive(self, graph: Graph, lib: Module, held: bool = False) -> Executor | None:
        """This executor over graph, another specialisation of its symbolic graph (the same
        nodes, devices and storage ids, other sizes: a decoder's next past length), made by
        touching only what the new sizes change. Entries of a new shape get new views in the
        bytes their storage id holds; graph inputs and outputs (params aside) get the bytes the
        scratch keeps for their storage ids, which the specialisations derived share (a
        dormant one's are never read: storage.Scratch, own_io); nodes whose shapes or dims
        changed get kernels as a full build gives them.
        Every other step, view and setup pass's decision is this executor's.

        None where that is not known to be safe, and the caller builds in full: an executor with
        copies, NHWC entries or a device other than the host; a storage id whose bytes outgrew
        its buffer; a changed node that a setup pass decided on (written in place, skipped
        flatten or its reader, storage it asked for), or whose new kernel asks for storage. No
        layout pass runs: kernels offering NHWC positions are told none (they work as made).

        held: this executor's kernels are all still in the shared cache (its module is kept):
        its steps touching no new array and reading no dim whose value moved are then kept
        without looking at them (a decode step visits the ~30 of ~90 steps its length moves)."""
        shared, before = self._kernels, self.graph.attrs["shape"][1]
        shapes = graph.attrs["shape"][1]
        if (shared is None or self._scratch is None or not self._ready or self.copies
                or self.dropped_copies or self.channels_last or len(shapes) != len(before)
                or any(dev.kind != "cpu" for dev in self.devices)):
            return None
        changed = {eid for eid, (now, was) in enumerate(zip(shapes, before)) if now != was}
        plan = self.plan.resized(graph, changed)
        fresh = {plan.entry_sid[eid] for eid in self._io_eids if eid not in shared.params}
        if any(plan.entry_sid[eid] in fresh for eid in self.placed):
            return None
        resized = self.pool.resized(graph, plan, changed, fresh, self._scratch)
        if resized is None:
            return None
        new = copy.copy(self)
        new.graph, new.plan, (new.pool, renewed) = graph, plan, resized
        new.arrays = dict(self.arrays)
        for eid in renewed:
            new.arrays[(eid, self.entry_device[eid])] = new.pool.views[eid]
        new.kernel_keys, new.escaped_entries, new._uses, new._bindings = {}, set(), None, {}
        new._unshare, new._told = {}, set()
        new._transits, new._pool_bytes, new._settled = {}, None, set()
        decided = {graph.entry_node(o)[0] for _, o in self.in_place}
        decided |= {self.steps[i].nid for i in self.skipped} | {
            call.nid for call in self.shortcuts.values()}
        used = new._bytes_in_use()
        new.steps = []
        made: list[PreparedCall] = []  # the steps given kernels anew
        # (a load of params empties the cache: kernels deriving from the old ones are not kept)
        held = held and self._generation == shared.generation
        visit = self._touched(graph, lib, renewed | changed) if held else None
        new._step_index = self._step_index  # the same steps, in the same order
        kept_ids: set[int] = set()  # this executor's steps the new one shares
        new._generation = shared.generation
        for index, step in enumerate(self.steps):
            if visit is not None and index not in visit:
                key = self.kernel_keys.get(step.nid)
                if key is not None:  # held by this module: in the cache as _kept_step asks
                    new.kernel_keys[step.nid] = key
                    shared.taken.append(key)
                    shared.reused += 1
                new.steps.append(step)
                kept_ids.add(id(step))
                continue
            node = graph.nodes[step.nid]
            eids = [key.eid for key in step.arg_keys]
            kept = new._kept_step(lib, step, self, node, eids, shared, renewed)
            if kept is step:  # its arrays are the base's too: the base's step, shared
                new.steps.append(step)
                kept_ids.add(id(step))
                continue
            if kept is not None and step.nid in decided and not changed.isdisjoint(eids):
                return None  # a setup pass decided on it at other sizes
            if kept is None:
                if step.nid in decided or step.kernel.storage_requests():
                    return None
                n_in = step.num_inputs
                fn = new._node_kernel(lib, node, step.device, eids, n_in, used, len(new.steps))
                kernel = capabilities(fn)
                if kernel.storage_requests():
                    return None
                new._count_workspace(node, step.device, kernel.workspace_bytes()
                                     - step.kernel.workspace_bytes(), used)
                kept = PreparedCall(
                    step.nid, step.label, step.func_name, step.device,
                    in_device_scope(new._site(kernel) or fn, step.device), [], step.arg_keys,
                    n_in, False, kernel)
                made.append(kept)
            kept.args[:] = new._args_of(step, renewed)
            new.steps.append(kept)
        new.shortcuts = {}
        for index, call in self.shortcuts.items():
            new.shortcuts[index] = PreparedCall(
                call.nid, call.label, call.func_name, call.device, call.fn,
                new._args_of(call, renewed), call.arg_keys, call.num_inputs, False, call.kernel)
        check_capacity(graph, plan, self.caps)
        shared.settle(())  # no layout pass here: kernels offering NHWC were told nothing
        # the write counters go on: the kept kernels' derived data stays theirs (a param, bound
        # here already, is not adopted again), a counted write to either executor's input is
        # seen by both (a new shape's inputs are set again, counted)
        new.versions = dict(self.versions)
        # a kept kernel is bound already, to the same counters (the dict's values are shared)
        new._bind_versions(new._plan_versions(made))
        new._unshare.clear()
        self._own -= kept_ids
        self._moving_index = None  # its steps shared now are copied before they change
        new._own = {id(step) for step in new.steps} - kept_ids
        new._moving, new._moving_index = set(), None
        new._finish()
        if new.native is not None and self.native is not None:
            new.native.adopt(self.native)  # the steps kept replay as recorded
        return new

    def retarget(self, graph: Graph, lib: Module) -> bool:
        """This executor made over graph in place: another specialisation of its symbolic graph
        that moves sizes only (a decoder's next past length), where derive would keep every
        step's kernel and every entry of a new shape fits the bytes its storage id holds. The
        entries of new shapes get new views, the steps reading or writing them their arguments
        again; nothing is made but those views. False, with nothing changed, where that does
        not hold: the caller derives or builds instead.

        Only for an executor made by derive whose inputs and outputs are still in the scratch's
        shared bytes (StoragePool.io_ids: own_io hands a module out, which then keeps its shape)
        and whose kernels the shared cache still holds. A step this executor shares with the
        one it was derived from (derive keeps steps whose arrays stay) is copied before its
        arguments change, so that one is never touched.

        What follows from which entries change shape and which dims move (the storage ids,
        the steps to ask and to re-point) is kept per such change (a Transit): a decoder's
        next length asks only what the new sizes decide (bytes, each kernel's serves)."""
        shared, before = self._kernels, self.graph.attrs["shape"][1]
        shapes = graph.attrs["shape"][1]
        if (shared is None or self._scratch is None or not self._ready or not self.pool.io_ids
                or self._generation != shared.generation or len(shapes) != len(before)):
            return False
        changed = tuple(eid for eid, (now, was) in enumerate(zip(shapes, before))
                        if now is not was and now != was)
        if not changed:
            self.graph = graph
            return True
        plan, pool, dtypes = self.plan, self.pool, graph.attrs["dltype"][1]
        pattern = (changed, self._moved_dims(graph, lib))
        transit = self._transits.get(pattern)
        if transit is None:
            if not self.placed.isdisjoint(changed):
                return _refused("an entry stored where its kernel asked changes shape")
            by_sid: dict[int, tuple[int, ...]] = {}
            for eid in changed:
                sid = plan.entry_sid[eid]
                if sid not in by_sid:
                    by_sid[sid] = tuple(plan.entries_of(sid))
            sids = list(by_sid.items())
        else:
            sids = transit.sids
        if transit is None:
            sizes = {eid: entry_bytes(shapes[eid], dtypes[eid]) for eid in changed}
        else:  # (math.prod of a shape: its count of elements; entry_bytes parses the dtype)
            sizes = {eid: math.prod(shapes[eid]) * size
                     for eid, size in transit.itemsizes.items()}
        sid_bytes: dict[int, int] = {}
        entry_now, io_ids, buffers = plan.entry_bytes, pool.io_ids, pool.buffers
        for sid, entries in sids:
            need = 0
            for e in entries:
                nbytes = sizes.get(e)
                if nbytes is None:
                    nbytes = entry_now[e]
                if nbytes > need:
                    need = nbytes
            sid_bytes[sid] = need
            if sid not in io_ids and buffers[sid].nbytes < need:
                # derive would not fit it either: a new pool
                return _refused(f"storage id {sid} outgrew its {buffers[sid].nbytes} bytes")
        # io ids whose shared bytes grow (new bytes: each of their entries gets a new view)
        io = [sid for sid in sid_bytes if sid in io_ids]
        regrow = {sid for sid in io if self._scratch.io_bytes(sid) < sid_bytes[sid]}
        renewed = set(changed)
        for sid in regrow:
            renewed.update(plan.entries_of(sid))
        # this executor at the new sizes, for _kernel_serves (which reads its graph and the
        # bindings it works out): made bare, a copy of every field costs a decode step ~15 us
        probe = Executor.__new__(Executor)
        probe.graph, probe._bindings = graph, {}
        if transit is None or regrow:
            steps = self._retarget_steps(graph, lib, renewed)
            if steps is None:
                return False
            checks, repoint = steps
            if not regrow:  # (a regrow renews more entries: that change is not kept)
                self._transits[pattern] = _Transit(
                    sids, checks, repoint,
                    {eid: np.dtype(dtypes[eid]).itemsize for eid in changed},
                    [(eid, plan.entry_sid[eid], np.dtype(dtypes[eid]),
                      (eid, self.entry_device[eid])) for eid in changed])
        else:
            checks, repoint = transit.checks, transit.repoint
        kept = shared.kernels
        crossed = []  # (position in checks, the key of the class the new shapes round to)
        for at, (index, eids, key) in enumerate(checks):
            step = self.steps[index]
            if key is None or key not in kept:
                return _refused(f"{step.label}'s kernel was dropped from the shared cache")
            if (index, key) in self._settled:
                self._bindings.pop(step.nid, None)  # (worked out again when asked: dims moved)
                continue
            served = probe._kernel_serves(lib, key, step, graph.nodes[step.nid], eids, self)
            if served is None:
                return _refused(f"{step.label}'s kernel does not serve the new shapes")
            if served != key:
                crossed.append((at, served))
            elif self._settles_by_rank(lib, key, step, graph.nodes[step.nid]):
                self._settled.add((index, key))
        self._check_growth(graph, sid_bytes)
        for at, served in crossed:  # kept under that class too (a derive there takes it)
            index, eids, key = checks[at]
            shared.get_as(served, key)  # (a key the module now uses: the caller holds it)
            self.kernel_keys[self.steps[index].nid] = served
            checks[at] = (index, eids, served)
        # every check passed: sizes, views, arguments
        for eid, nbytes in sizes.items():
            plan.entry_bytes[eid] = nbytes
        plan.sid_bytes.update(sid_bytes)
        for sid in io:
            old = buffers[sid]
            new = buffers[sid] = self._scratch.take_io(sid, plan.sid_device[sid], sid_bytes[sid])
            if sid in regrow:  # the values set so far go along (an input of the same shape)
                count = min(old.nbytes, new.nbytes)
                new[:count] = old[:count]
        views, arrays = pool.views, self.arrays
        if transit is not None and not regrow:  # renewed: changed (a derived executor's: CPU)
            for eid, sid, dtype, key in transit.views:
                views[eid] = arrays[key] = np.ndarray(shapes[eid], dtype, buffers[sid])
        else:
            for eid in renewed:
                views[eid] = arrays[(eid, self.entry_device[eid])] = pool._view(graph, eid)
        copied, own = False, self._own
        for index, positions in repoint:
            step = self.steps[index]
            if id(step) not in own:  # shared with the executor it was derived from
                step, copied = self._own_step(index), True
            for pos in positions:
                step.args[pos] = self._bind(step.arg_keys[pos])
        moved = [index for index, _ in repoint]
        for index, call in self.shortcuts.items():  # its own (derive makes them anew)
            for pos, key in enumerate(call.arg_keys):
                if key.eid in renewed:
                    call.args[pos] = self._bind(key)
                    moved.append(index)
        self._moved(moved)
        self.graph = graph
        self._bindings.update(probe._bindings)
        if not renewed.issubset(self._moving):
            self._moving |= renewed
            self._moving_index = None
        if copied:
            self._uses = None
            self._finish()
        return True

    def _settles_by_rank(self, lib: Module, key: tuple, step: PreparedCall, node: Any) -> bool:
        """Whether _kernel_serves's yes for step's kernel holds at every shape retarget meets:
        a kernel taking any shape, kept by its arrays' ranks (which no specialisation of one
        symbolic graph changes: each entry's rank is declared), answering serves as the base
        class does (always yes), on a node whose attrs hold no values and read no dims, or read
        dims that decide its shapes alone (its binding's values are always equal: none). A
        decode step's new length then skips 15 of its 19 checks."""
        attrs = node.attrs
        if not (key[0] == "rank" and step.kernel.any_shape()
                and type(step.kernel).serves is PreparedKernel.serves
                and VALUES_KEY not in attrs):
            return False
        return DIMS_KEY not in attrs or not self._reads_values(lib, node, step.device)

    def _retarget_steps(self, graph: Graph, lib: Module, renewed: set[int]
                        ) -> tuple[list[tuple[int, list[int], Any]],
                                   list[tuple[int, list[int]]]] | None:
        """For retarget: the steps to ask whether their kernels serve graph's sizes (index,
        entries, kernel key), as derive visits them, and those to re-point (index, argument
        positions of renewed entries); None (refused) where a setup pass decided on one."""
        decided = {graph.entry_node(o)[0] for _, o in self.in_place}
        decided |= {self.steps[i].nid for i in self.skipped} | {
            call.nid for call in self.shortcuts.values()}
        checks, repoint = [], []
        for index in sorted(self._touched(graph, lib, renewed)):
            step = self.steps[index]
            eids = [key.eid for key in step.arg_keys]
            checks.append((index, eids, self.kernel_keys.get(step.nid)))
            if not renewed.isdisjoint(eids):
                if step.nid in decided:
                    _refused(f"a setup pass decided on {step.label} at other sizes")
                    return None
                repoint.append((index, [pos for pos, e in enumerate(eids) if e in renewed]))
        return checks, repoint

    def _check_growth(self, graph: Graph, sid_bytes: Mapping[int, int]) -> None:
        """The caps hold as derive checks them with storage ids sized to sid_bytes: per device,
        the pool's bytes (counted once, then followed; restore and derive count again) moved by
        what changes size, the full check_capacity (which names the biggest ids) only where a
        cap is passed."""
        plan = self.plan
        totals = self._pool_bytes
        if totals is None:
            totals = plan.bytes_per_device()
        after, grown = dict(totals), {}
        for sid, nbytes in sid_bytes.items():
            was = plan.sid_bytes[sid]
            if nbytes != was:
                dev = plan.sid_device[sid]
                after[dev] = after.get(dev, 0) + nbytes - was
                if nbytes > was:
                    grown[sid] = nbytes
        if grown and any(after[dev] > cap for dev, cap in self.caps.items() if dev in after):
            check_capacity(graph, dataclasses.replace(plan, sid_bytes={**plan.sid_bytes,
                                                                       **sid_bytes}), self.caps)
        self._pool_bytes = after

    def state(self) -> ShapeState:
        """This executor's shape as retarget made it, for restore."""
        plan, pool, scratch = self.plan, self.pool, self._scratch
        # the steps hold the moving entries' arrays as bound: restore puts back those alone
        # (the list is made here, once per set of moving entries, not by the first restore:
        # a server's second generation, where every state is restored once, would bind again)
        index = self._moving_args()
        made = self._state_index
        if made is None or made[0] is not index:  # the moving entries changed: their ids
            moving = frozenset(self._moving)
            made = self._state_index = (index, moving,
                                        tuple({plan.entry_sid[eid]: None for eid in moving}))
        _, moving, sids = made
        io_ids, buffers = pool.io_ids, pool.buffers
        io = {sid: (buffers[sid], scratch.io[sid][1]) for sid in sids
              if sid in io_ids} if scratch is not None else {}
        views, sizes = pool.views, plan.entry_bytes
        return ShapeState(self.graph, moving, {eid: views[eid] for eid in moving},
                          {eid: sizes[eid] for eid in moving},
                          {sid: plan.sid_bytes[sid] for sid in sids}, io, dict(self._bindings),
                          (self._moving_keys, [a[p] for a, p, _ in index]))

    def restore(self, state: ShapeState) -> bool:
        """This executor back at a shape retarget made it over before (state), its kernels the
        same; False, nothing changed, where it moved other entries since, was handed out
        (own_io) or the shared cache dropped its kernels. Where the shared io bytes grew since,
        the state's entries there get views of the new ones (and keep them)."""
        shared, scratch = self._kernels, self._scratch
        if (shared is None or scratch is None or self._generation != shared.generation
                or not self.pool.io_ids or not state.moving.issubset(self._moving)):
            return False
        plan, pool = self.plan, self.pool
        if len(state.moving) != len(self._moving):  # moved since: those entries at its sizes
            self._extend(state)
        for eid, nbytes in state.entry_bytes.items():
            plan.entry_bytes[eid] = nbytes
        plan.sid_bytes.update(state.sid_bytes)
        self._pool_bytes = None
        grown: set[int] = set()  # the state's entries given views of grown io bytes
        for sid, (buffer, held) in state.io.items():
            if scratch.io[sid][1] is not held:  # grown since: the state's views follow
                buffer = scratch.take_io(sid, plan.sid_device[sid], state.sid_bytes[sid])
                state.io[sid] = (buffer, scratch.io[sid][1])
                pool.buffers[sid] = buffer  # (before the views below, made of it)
                for eid in plan.entries_of(sid):
                    if eid in state.moving:  # (another keeps its view of the bytes before)
                        state.views[eid] = pool._view(state.graph, eid)
                        grown.add(eid)
            pool.buffers[sid] = buffer
        arrays, devices = self.arrays, self.entry_device
        for eid, view in state.views.items():
            pool.views[eid] = arrays[(eid, devices[eid])] = view
        index = self._moving_args()
        keys, bound = self._moving_keys, state.bound
        if bound is None or (bound[0] is not keys and bound[0] != keys):
            bound = state.bound = (keys, [self._bind(key) for key in keys])
        elif grown:  # only those bound again (a server's second generation meets them)
            for i, key in enumerate(keys):
                if key.eid in grown:
                    bound[1][i] = self._bind(key)
        for (args, pos, _), array in zip(index, bound[1]):
            args[pos] = array
        self._moved(self._moving_steps)  # (no other step's arguments moved)
        self.graph = state.graph
        self._bindings = dict(state.bindings)
        return True

    def _extend(self, state: ShapeState) -> None:
        """state (taken before this executor's retargets moved more entries) given those
        entries too, at its shapes: their bytes, their storage ids' and views of the bytes
        those hold (the shared io bytes at their size there)."""
        plan, pool, scratch = self.plan, self.pool, self._scratch
        shapes, dtypes = state.graph.attrs["shape"][1], state.graph.attrs["dltype"][1]
        extra = self._moving - state.moving
        for eid in extra:
            state.entry_bytes[eid] = entry_bytes(shapes[eid], dtypes[eid])
        for sid in {plan.entry_sid[eid] for eid in extra}:
            state.sid_bytes[sid] = max(entry_bytes(shapes[e], dtypes[e])
                                       for e in plan.entries_of(sid))
            if sid in pool.io_ids and sid not in state.io and scratch is not None:
                state.io[sid] = (scratch.take_io(sid, plan.sid_device[sid], state.sid_bytes[sid]),
                                 scratch.io[sid][1])
        for eid in extra:
            sid = plan.entry_sid[eid]
            buffer = state.io[sid][0] if sid in state.io else pool.buffers[sid]
            state.views[eid] = check_device(plan.sid_device[sid]).view(
                buffer, 0, tuple(shapes[eid]), np.dtype(dtypes[eid]))
        state.moving = frozenset(self._moving)
        state.bound = None

    def _moving_args(self) -> list[tuple[list[Any], int, ArgKey]]:
        """Where the steps (and shortcuts) hold the moving entries' arrays, each such step this
        executor's own (copied first where it shares one: derive)."""
        if self._moving_index is None:
            moving, copied = self._moving, False
            for index, step in enumerate(self.steps):
                if id(step) not in self._own and not moving.isdisjoint(
                        k.eid for k in step.arg_keys):
                    self._own_step(index)
                    copied = True
            if copied:
                self._uses = None
                self._finish()
            self._moving_index = [(call.args, pos, key) for call in self._all_steps()
                                  for pos, key in enumerate(call.arg_keys) if key.eid in moving]
            self._moving_keys = tuple(key for _, _, key in self._moving_index)
            self._moving_steps = [index for index, call in [*enumerate(self.steps),
                                                            *self.shortcuts.items()]
                                  if not moving.isdisjoint(k.eid for k in call.arg_keys)]
        return self._moving_index

    def _own_step(self, index: int) -> PreparedCall:
        """Step index made this executor's own: a copy with its own arguments and call site
        in place of one it shares with the executor it was derived from."""
        step = self.steps[index] = self._sited_copy(self.steps[index],
                                                    list(self.steps[index].args))
        self._own.add(id(step))
        return step

    def _sited_copy(self, step: PreparedCall, args: list[Any]) -> PreparedCall:
        """step's call with args and this executor's own call site for its kernel (a site's
        views are of its executor's arrays)."""
        site = self._site(step.kernel)
        fn = step.fn if site is None else in_device_scope(site, step.device)
        return PreparedCall(step.nid, step.label, step.func_name, step.device, fn, args,
                            step.arg_keys, step.num_inputs, False, step.kernel)

    def _touched(self, graph: Graph, lib: Module, renewed: set[int]) -> set[int]:
        """The indices of the steps derive must look at for graph: those touching an entry
        given a new array, reading a dim whose value moved, or holding values a specialisation
        adds."""
        by_eid, dims, always = self._touch_index(lib)
        visit = set(always)
        for eid in renewed:
            visit.update(by_eid.get(eid, ()))
        if dims:
            moved = self._moved_dims(graph, lib)
            visit.update(i for i, names in dims if not names.isdisjoint(moved))
        return visit

    def _touch_index(self, lib: Module) -> tuple[dict[int, list[int]],
                                                 list[tuple[int, frozenset[str]]], set[int]]:
        """_touched's index of the steps' entries and dims (made once per executor built in
        full and shared by those derived from it): each entry's steps, the steps reading
        dims (and which), the steps holding values a specialisation adds."""
        index = self._step_index
        if index is None:
            by_eid: dict[int, list[int]] = {}
            dims: list[tuple[int, frozenset[str]]] = []
            always: set[int] = set()
            for i, step in enumerate(self.steps):
                for key in step.arg_keys:
                    by_eid.setdefault(key.eid, []).append(i)
                attrs = self.graph.nodes[step.nid].attrs
                if VALUES_KEY in attrs:
                    always.add(i)
                elif DIMS_KEY in attrs:
                    fn = lib.get_function(step.func_name, step.device, step.label)
                    names = getattr(fn, "names", None)
                    if names is None:
                        always.add(i)
                    else:
                        dims.append((i, frozenset(names)))
            index = self._step_index = (by_eid, dims, always)
        return index

    def _moved_dims(self, graph: Graph, lib: Module) -> frozenset[str]:
        """The dims whose values graph binds otherwise than this executor's graph (read where
        a step reading dims holds the whole binding)."""
        dims = self._touch_index(lib)[1]
        if not dims:
            return frozenset()
        nid = self.steps[dims[0][0]].nid
        now, was = graph.nodes[nid].attrs[DIMS_KEY], self.graph.nodes[nid].attrs[DIMS_KEY]
        return frozenset(name for name in now.keys() | was.keys()
                         if now.get(name) != was.get(name))

    def _args_of(self, step: PreparedCall, renewed: set[int]) -> list[Any]:
        """step's arguments (its arrays in the executor derived from) with the entries whose
        views are new bound again."""
        args = list(step.args)
        for pos, key in enumerate(step.arg_keys):
            if key.eid in renewed:
                args[pos] = self._bind(key)
        return args

    # ---- setup ---------------------------------------------------------------------------------

    def _caps(self, plan: PoolLayout, memory_cap: Any) -> dict[Device, int]:
        used = set(plan.sid_device.values()) | set(plan.extra_bytes)
        caps = default_caps(list(used))
        if isinstance(memory_cap, int):
            caps = {dev: memory_cap for dev in used}
        elif isinstance(memory_cap, Mapping):
            from ..device import device as parse_device
            for key, value in memory_cap.items():
                caps[parse_device(key)] = int(value)
        return caps

    def _prepare_steps(self, lib: Module, base: Executor | None) -> list[PreparedCall]:
        """One call per node (copies inserted before their first reader). base: another
        specialisation of the same symbolic graph, whose kept kernels serve the nodes whose
        arrays keep their shapes (_kept_step)."""
        g = self.graph
        steps: list[PreparedCall] = []
        prior = {} if base is None or base.channels_last else {
            step.nid: step for step in base.steps if not step.is_copy}
        # Bytes in use per device: the pool and copies, then each kernel's workspace as prepared.
        used = self.plan.bytes_per_device()
        pending = {(c.eid, c.dst): c for c in self.copies}
        rows, shared = g.node_row_ptr, self._kernels
        for node in g.nodes:
            if node.is_arg or node.func_name == NOP_OP:
                continue
            dev = self.node_device[node.nid]
            in_eids = [rows[ref[0]] + ref[1] for ref in node.inputs]
            out_eids = list(range(rows[node.nid], rows[node.nid + 1]))
            if node.func_name == COPY_OP:
                step = self._copy_node_step(node, in_eids, out_eids)
                if step is not None:
                    steps.append(step)
                continue
            # Inserted copies run right before their first reader.
            for eid in in_eids if pending else ():
                c = pending.pop((eid, dev), None)
                if c is not None:
                    steps.append(self._copy_step(-1, f"copy of eid {eid} ({c.producer}) to {dev}",
                                                 eid, c.src, c.dst))
            kept = prior.get(node.nid)
            if kept is not None and shared is not None and base is not None:
                step = self._kept_step(lib, kept, base, node, in_eids + out_eids, shared)
                if step is not None:
                    self._count_workspace(node, dev, step.kernel.workspace_bytes(), used,
                                          _settles_later(step.kernel))
                    steps.append(step)
                    continue
            keys = self._arg_keys(node, dev, in_eids, out_eids)
            fn = self._node_kernel(lib, node, dev, in_eids + out_eids, len(in_eids), used,
                                   len(steps))
            kernel = capabilities(fn)
            self._count_workspace(node, dev, kernel.workspace_bytes(), used,
                                  _settles_later(kernel))
            steps.append(PreparedCall(node.nid, node.label, node.func_name or "", dev,
                                      in_device_scope(self._site(kernel) or fn, dev), [],
                                      keys, len(in_eids), False, kernel))
        return steps

    def _arg_keys(self, node: Any, dev: Device, in_eids: list[int], out_eids: list[int]
                  ) -> list[ArgKey]:
        """A node's argument keys (made once per node when the kernels are shared)."""
        shared = self._kernels
        keys = shared.arg_keys.get(node.nid) if shared is not None else None
        if keys is None:
            flatten = node.flatten_data
            keys = [ArgKey(e, dev if (e, dev) in self.arrays else self.entry_device[e],
                           flatten) for e in in_eids]
            keys += [ArgKey(e, dev, flatten) for e in out_eids]
            if shared is not None:
                shared.arg_keys[node.nid] = keys
        return keys

    def _node_kernel(self, lib: Module, node: Any, dev: Device, eids: list[int], n_in: int,
                     used: dict[Device, int], index: int) -> Any:
        """A node's kernel: from the shared cache when one serves it, else prepared (and kept
        there where sharing is safe); index: its step's, where a shared kernel the layout pass
        may tell of NHWC arrays registers how to prepare its own."""
        g, shared = self.graph, self._kernels
        # the columns read once (a symbolic graph's decode step prepares here per shape)
        shapes, dtypes = g.attrs["shape"][1], g.attrs["dltype"][1]
        fn: Any = None  # the kernel: found in the shared cache, else prepared below
        exact = by_function = None
        if shared is not None:
            exact = self._kernel_key(lib, node, dev, tuple(tuple(shapes[e]) for e in eids))
            if exact is not None:
                # a kernel of a node calling this function (a decoder's layers share
                # one), else this node's own, else one taking any shape of the rows' band
                # that its tuning choices pick here too, else of the size class: any such
                # node's, else this node's (one holding its packed weights)
                ident = shared.functions.get(node.nid)
                if ident is None:
                    ident = shared.functions[node.nid] = _function_ident(node)
                by_function = (ident,) + exact[1:]
                for candidate in _candidate_keys(by_function, exact):
                    found = shared.kernels.get(candidate)
                    if found is None or candidate[0] in _ROUNDED and not \
                            capabilities(found).serves(exact[2]):
                        continue
                    fn = shared.get(candidate)
                    self.kernel_keys[node.nid] = candidate
                    break
        # With flatten_data the arrays are 1-D views, but a prepared kernel is told the
        # declared shapes (and gets flatten_data in attrs): a chain of standard ops needs them
        # to broadcast, and gives its kernels the shapes back (lib/chain.py).
        # (a kernel taken from the shared cache needs neither specs nor attrs)
        nhwc = fn is not None and bool(capabilities(fn).channels_last_positions())
        if fn is None or nhwc:
            in_specs = [TensorSpec(tuple(shapes[e]), dtypes[e]) for e in eids[:n_in]]
            out_specs = [TensorSpec(tuple(shapes[e]), dtypes[e]) for e in eids[n_in:]]
            attrs = dict(node.attrs)
            cap = self.caps.get(dev)
            if cap is not None:
                attrs[WORKSPACE_LIMIT_KEY] = cap - used.get(dev, 0)
        if fn is None:
            with team_gemv.weights_cached(self._weights_cached):
                fn = lib.prepare(node.func_name or "", dev, in_specs, out_specs, attrs,
                                 node=node.label)
            if shared is not None:
                made = capabilities(fn)
                # a kernel holding no node's data (derived weights, sub-modules) serves
                # every node calling its function at these shapes
                alone = not made.cached_inputs() and not made.sub_modules()
                key = by_function if alone and by_function is not None else exact
                if key is not None and made.any_shape():
                    # by ranks where nothing in it depends on sizes, else the band's, unless
                    # one its choices made otherwise holds it
                    rank = _class_key(key, "rank") if made.shape_free() else None
                    band = _class_key(key, "band")
                    key = rank if rank is not None and rank not in shared.kernels else \
                        band if band not in shared.kernels else _class_key(key)
                shared.put(key, fn, made, eids)
                if key is not None and shared.kernels.get(key) is fn:
                    self.kernel_keys[node.nid] = key
        elif nhwc:
            # a shared kernel the layout pass may tell of NHWC arrays gets its own then
            self._unshare[index] = functools.partial(
                lib.prepare, node.func_name or "", dev, in_specs, out_specs, attrs,
                node=node.label)
        return fn

    def _site(self, kernel: PreparedKernel) -> Callable[..., None] | None:
        """What a node's step calls instead of a kernel the specialisations share: its call
        site (PreparedKernel.call_site: state of the node's own, held by the step), if any."""
        return None if self._kernels is None else kernel.call_site()

    def _kept_step(self, lib: Module, kept: PreparedCall, base: Executor, node: Any,
                   eids: list[int], shared: KernelCache, renewed: set[int] | None = None
                   ) -> PreparedCall | None:
        """kept (base's step for node) as this executor's, where its kernel serves here as it
        is: the node's arrays have the shapes they had in base, or it takes any shape and was
        kept by its shapes' band or size class, which the new shapes round to as well, and
        serves them (a decode step's concatenations, attention and mask chains, without asking
        the cache); its attrs hold no values a specialisation adds, and the same values of the
        dims they read (of those deciding more than a shape, for a kernel taking any shape);
        the kernel is still in the shared cache and, where a layout pass follows (not in
        derive), offers no NHWC positions that it could tell; else None (prepared or looked up
        by key). renewed (derive): the entries whose arrays this executor made anew; a step
        touching none of them is kept itself, shared with base (its arguments are the same
        arrays: a rebind here, of an input or a param, touches no shared step, as inputs and
        outputs are renewed and params are the same arrays)."""
        key = base.kernel_keys.get(node.nid)
        served = None if key is None else self._kernel_serves(lib, key, kept, node, eids, base)
        if served is None or (renewed is None and kept.kernel.channels_last_positions()):
            return None
        if shared.get_as(served, key) is None:
            return None
        self.kernel_keys[node.nid] = served
        if renewed is not None and renewed.isdisjoint(eids):
            return kept  # the same arrays (and so the same site) as in base
        return self._sited_copy(kept, [])  # its arguments bound by the caller

    def _kernel_serves(self, lib: Module, key: tuple, kept: PreparedCall, node: Any,
                       eids: list[int], base: Executor) -> tuple | None:
        """The key kept's kernel (base's for node, kept under key) serves node here by, as it
        is: key where the node's arrays have the shapes they had in base, or where it takes
        any shape, was kept by its shapes' band or size class, which the new shapes round to
        as well, and serves them; the key of the class they round to where that moved (a
        decoder's past length past 64) and the kernel serves them, the shared cache holding
        no other kernel there (the caller keeps it there too: KernelCache.get_as). Its attrs
        hold no values a specialisation adds, and the same values of the dims they read (of
        those deciding more than a shape, for a kernel taking any shape). None where it does
        not serve."""
        if VALUES_KEY in node.attrs:
            return None
        shapes, before = self.graph.attrs["shape"][1], base.graph.attrs["shape"][1]
        by_class = key[0] in _ROUNDED and kept.kernel.any_shape()
        served = key
        if any(shapes[e] != before[e] for e in eids):
            if not by_class:
                return None
            now = tuple(tuple(shapes[e]) for e in eids)
            if not kept.kernel.serves(now):
                return None
            rounded = _rounded(key[0], now)
            if rounded != key[3]:
                served = key[:3] + (rounded,) + key[4:]
                held = base._kernels.kernels if base._kernels is not None else {}
                there = held.get(served)
                if there is not None and there is not held.get(key):
                    return None  # that class's own kernel: derive takes it
        if node.attrs.get(DIMS_KEY) is not None:
            if by_class and not base._reads_values(lib, node, kept.device):
                # its dims only shape its arrays, which serves asked: the binding base held
                # is of other dims (worked out again when asked), none is compared
                base._bindings.pop(node.nid, None)
                return served
            # a chain with symbolic attrs: the same values of those it reads
            was, bound = base._bound(lib, node.nid, kept.device), self._bound(lib, node.nid,
                                                                            kept.device)
            if was is None or bound is None:
                return None
            if (was.values != bound.values) if by_class else (was != bound):
                return None
        return served

    def _kernel_key(self, lib: Module, node: Any, dev: Device,
                    shapes: tuple[tuple[int, ...], ...]) -> tuple | None:
        """What decides a node's prepared kernel, for sharing it across specialisations (of one
        graph: its dtypes are the same): its arrays' shapes (inputs, then outputs), and for a
        chain with symbolic attrs the values of the dims those read (a decoder's reshapes by
        (batch, seq) are the same kernel at every past length); None for a node whose
        shape-deciding values travel in its attrs (never shared)."""
        attrs = node.attrs
        if VALUES_KEY in attrs:
            return None
        key = (node.nid, dev, shapes)
        if DIMS_KEY not in attrs:
            return key
        binding = self._binding(lib, node, dev)
        return None if binding is None else key + (binding(attrs[DIMS_KEY]),)

    def _bound(self, lib: Module, nid: int, dev: Device) -> Any:
        """Node nid's binding_key at this executor's dims (None where its function has none),
        worked out once per executor: derive asks it of the executor derived from, for the ~6
        symbolic chains a decode step's new length touches, at every length."""
        bound = self._bindings.get(nid, _UNBOUND)
        if bound is _UNBOUND:
            node = self.graph.nodes[nid]
            binding = self._binding(lib, node, dev)
            bound = self._bindings[nid] = None if binding is None else binding(
                node.attrs[DIMS_KEY])
        return bound

    def _reads_values(self, lib: Module, node: Any, dev: Device) -> bool:
        """Whether a symbolic chain's attrs read dims other than as shape targets (its
        binding's values), or it has no binding_key; looked up once per node (a decode step's
        mask chains are asked at every new length)."""
        reads = self._value_reads.get(node.nid)
        if reads is None:
            fn = lib.get_function(node.func_name or "", dev, node.label)
            reads = self._value_reads[node.nid] = getattr(fn, "binding_key", None) is None \
                or bool(getattr(fn, "value_names", True))
        return reads

    @staticmethod
    def _binding(lib: Module, node: Any, dev: Device) -> Callable[[Any], Any] | None:
        """A symbolic chain's binding_key (the values of the dims its attrs read)."""
        return getattr(lib.get_function(node.func_name or "", dev, node.label), "binding_key",
                       None)

    # ---- setup passes (SETUP_PASSES): each plan reads, its apply changes ----------------------

    def _plan_channels_last(self) -> LayoutPlan:
        """The entries kept NHWC between kernels that take it (runtime/layouts.py)."""
        return plan_channels_last(self.graph, self.steps, self.entry_device, self._excluded)

    def _keep_channels_last(self, plan: LayoutPlan) -> None:
        """Tell the kernels which of their arrays hold NHWC bytes (their workspace may shrink:
        buffers for reorders they no longer make); the storage pass binds NHWC views there."""
        self.channels_last = plan.entries
        self._told = set(plan.positions)
        for index, positions in sorted(plan.positions.items()):
            step = self.steps[index]
            if index in self._unshare:
                fn = self._unshare[index]()
                step.fn, step.kernel = in_device_scope(fn, step.device), capabilities(fn)
            before = step.kernel.workspace_bytes()
            step.kernel.use_channels_last(positions)
            grown = step.kernel.workspace_bytes() - before
            self.plan.workspace_bytes[step.device] = (
                self.plan.workspace_bytes.get(step.device, 0) + grown)
        self._check_settled_workspace()
        if plan.entries:
            log.info("%s: %d entries kept NHWC between kernels that take it", self.graph.source,
                     len(plan.entries))

    def _plan_storage(self) -> InPlacePlan:
        """The pool's storage ids: the graph's, with each output its kernel declares it may
        write over a dying input given that input's id where the lives stay apart
        (runtime/in_place.py), checked."""
        if settings.word(settings.IN_PLACE) == "off":
            return InPlacePlan()
        offers = in_place_offers(self.graph, self.steps, self.entry_device, self._excluded,
                                 self.channels_last, reshapes=self._kernels is None)
        plan = plan_in_place(self.graph, offers, self.plan.entry_sid, self.plan.sid_bytes,
                             self._excluded)
        if plan.pairs:
            self._check_in_place(plan.moves, plan.pairs)
        return plan

    def _allocate(self, plan: InPlacePlan) -> None:
        """Allocate the pool over the planned ids and bind every step's arrays: the pool's views
        (NHWC ones for the NHWC entries), copies' buffers, dropped copies' sources."""
        self.in_place = plan.pairs
        for eid, sid in plan.moves.items():
            self.plan.entry_sid[eid] = sid
        if plan.pairs:  # a reshape written in place: its output's view holds its bytes
            pairs = set(plan.pairs)
            self.skipped.update(
                index for index, step in enumerate(self.steps) if not step.is_copy
                and step.kernel.reshapes() and (step.arg_keys[0].eid, step.arg_keys[1].eid)
                in pairs)
        io_sids = {self.plan.entry_sid[eid] for eid in self._io_eids}
        self.pool = StoragePool(self.graph, self.plan, self._scratch,
                                [sid for sid in self.plan.sid_bytes if sid not in io_sids],
                                self.pinned_ids(), self._param_storage())
        for eid, view in enumerate(self.pool.views):
            self.arrays[(eid, self.entry_device[eid])] = (
                nhwc_view(view) if eid in self.channels_last else view)
        for reader, source in self._alias_keys:
            self.arrays[reader] = self.arrays[source]
        for step in self.steps:
            step.args[:] = [self._bind(k) for k in step.arg_keys]
        if plan.pairs:
            log.info("%s: %d outputs written in place over an input (%d entries given another "
                     "storage id)", self.graph.source, len(plan.pairs), len(plan.moves))

    def _param_storage(self) -> dict[int, Any]:
        """Per storage id holding one param alone: the param's array (a symbolic module's, which
        it adopts into every specialisation it builds; allocating the id's own bytes to drop
        them cost a LLaMA prompt's new shape 44 buffers, some 7 ms)."""
        given = self._kernels.param_arrays if self._kernels is not None else {}
        held: dict[int, Any] = {}
        for eid, array in given.items():
            sid = self.plan.entry_sid[eid]
            if (type(array) is np.ndarray and self.plan.entry_device[eid].kind == "cpu"
                    and len(self.plan.entries_of(sid)) == 1
                    and array.nbytes == self.plan.sid_bytes[sid] and array.flags.c_contiguous):
                held[sid] = array
        return held

    def pinned_ids(self) -> set[int]:
        """Host storage ids a copy step moves to or from a GPU: page-locked, so the copy runs
        at the bus's speed (an H200 read pageable memory at 8 GB/s, pinned at 55 GB/s)."""
        ids = set()
        for step in self.steps:
            if not step.is_copy:
                continue
            kinds = {key.device.kind for key in step.arg_keys}
            if kinds != {"cpu", "cuda"}:
                continue
            for key in step.arg_keys:
                sid = self.plan.entry_sid[key.eid]
                if key.device.kind == "cpu" and self.plan.sid_device[sid].kind == "cpu":
                    ids.add(sid)
        return ids

    def _plan_requested_storage(self) -> dict[int, Any]:
        """{eid: array} for the entries given the storage their kernel asked for
        (PreparedKernel.storage_requests), the first request winning.

        A padded CPU GEMV wants its weight inside a larger zeroed buffer
        (lib/kernels/cpu/padded_gemv.py).
        An entry shared with another storage user, read through a copy or flattened keeps the
        pool's buffer; the kernel then takes its plain path.
        """
        placed: dict[int, Any] = {}
        for step in self.steps:
            for pos, array in step.kernel.storage_requests().items():
                eid, dev, flat = step.arg_keys[pos]
                if (flat or eid in placed or eid in self._aliased
                        or dev != self.entry_device[eid] or not self.pool.can_place(eid, array)):
                    continue
                placed[eid] = array
        return placed

    def _place_requested(self, placed: dict[int, Any]) -> None:
        """Make each array its entry's storage, holding the entry's values, in every step."""
        self.placed = set(placed)
        for eid, array in placed.items():
            self.pool.place(eid, array)
            self.rebind(eid, array)

    def _plan_flatten_reads(self) -> list[FlattenRead]:
        """The flattens run() may skip (runtime/flatten_reads.py), over the pool's storage ids
        (with the in-place moves)."""
        return plan_flatten_reads(self.graph, self.steps, self.entry_device, self._excluded,
                                  self.channels_last, self.plan.entry_sid, self.skipped)

    def _skip_flattens(self, reads: list[FlattenRead]) -> None:
        """Prepare the skipping readers' calls (on the views as they end up), each where its
        source's rows are a view and the memory cap leaves room for its workspace."""
        for read in reads:
            reader = self.steps[read.reader]
            if read.reader in self.shortcuts:
                continue  # a second flatten into the same reader: keep the first
            source = self.arrays[(read.source, self.entry_device[read.source])]
            rows = flat_source(source, read.source in self.channels_last)
            if rows is None:
                continue
            args = list(reader.args)
            args[read.position] = rows
            # the reader's own call where it reads the rows as they are, else its variant
            own = read.kernel is reader.kernel
            fn: Any = reader.fn if own else read.kernel
            extra = 0 if own else read.kernel.workspace_bytes()
            if read.staged:
                fn = StagedOutputs(fn, {pos: (tuple(args[pos].shape), str(args[pos].dtype))
                                        for pos in read.staged})
                extra += sum(int(b.nbytes) for b in fn.buffers.values())
            used = self._bytes_in_use()
            cap = self.caps.get(reader.device)
            if cap is not None and used.get(reader.device, 0) + extra > cap:
                continue  # a shortcut is worth no GraphError: the flatten runs instead
            self._count_workspace(self.graph.nodes[reader.nid], reader.device, extra, used)
            self.shortcuts[read.reader] = PreparedCall(
                reader.nid, reader.label, reader.func_name, reader.device,
                fn if own and not read.staged else in_device_scope(fn, reader.device), args,
                list(reader.arg_keys), reader.num_inputs, False, capabilities(fn))
            self.skipped.add(read.flatten)
        if self.skipped:
            log.info("%s: run() skips %d flatten(s), their readers reading the source",
                     self.graph.source, len(self.skipped))

    def _plan_versions(self, steps: list[PreparedCall] | None = None
                       ) -> list[tuple[PreparedKernel, dict[int, int | None]]]:
        """Per kernel that caches derived inputs (lib/prepared.py), per such position: the graph
        input whose write counter it shares, or None for a volatile counter of its own (of
        steps: default, every step's).

        Only a graph input read in place, with a storage id of its own, is written solely through
        GraphModule's setters, which count; any other entry gets a volatile counter.
        """
        if steps is None:
            steps = self.steps + list(self.shortcuts.values())
        if not steps:
            return []
        g = self.graph
        inputs = self._input_eids
        if inputs is None:  # the same in every specialisation (derive copies it)
            inputs = self._input_eids = {g.entry_id(nid, 0) for nid in g.arg_nodes}
        plan = []
        for step in steps:
            counted: dict[int, int | None] = {}
            for pos in step.kernel.cached_inputs():
                eid, dev, _ = step.arg_keys[pos]
                counted[pos] = (eid if eid in inputs and dev == self.entry_device[eid]
                                and self.pool.owns_storage(eid) else None)
            if counted:
                plan.append((step.kernel, counted))
        return plan

    def _bind_versions(self, plan: list[tuple[PreparedKernel, dict[int, int | None]]]) -> None:
        """Bind the counters: one per graph input, shared by its kernels; volatile ones else."""
        for kernel, counted in plan:
            kernel.bind_versions({
                pos: InputVersion(volatile=True) if eid is None
                else self.versions.setdefault(eid, InputVersion())
                for pos, eid in counted.items()})

    # ---- setup helpers -------------------------------------------------------------------------

    def _bytes_in_use(self) -> dict[Device, int]:
        """The pool's bytes and every kernel's workspace so far, per device."""
        used = self.plan.bytes_per_device()
        for dev, nbytes in self.plan.workspace_bytes.items():
            used[dev] = used.get(dev, 0) + nbytes
        return used

    def _check_in_place(self, moves: Mapping[int, int], pairs: list[tuple[int, int]]) -> None:
        """Check the in-place plan's ids as the graph's plan is, before the pool is made; a
        failure is runtime/in_place.py's fault, not the graph's, and names the way around it."""
        sids = list(self.plan.entry_sid)
        for eid, sid in moves.items():
            sids[eid] = sid
        try:
            check_liveness(self.graph, sids, pairs)
        except GraphError as e:
            raise GraphError(f"the executor's in-place plan (runtime/in_place.py; the graph's own "
                             f"storage plan passed) is wrong: {e}. This is a graph_runtime bug; "
                             f"{settings.IN_PLACE.name}=off runs with the graph's plan") from e

    def _count_workspace(self, node: Any, dev: Device, nbytes: int,
                         used: dict[Device, int], settles_later: bool = False) -> None:
        """Add a kernel's workspace to its device's total; GraphError naming the node past the cap.

        Chain intermediates, im2col buffers, padded weights: memory the pool does not hold.
        settles_later: a kernel the channels-last pass may tell of NHWC neighbours, dropping
        its reorder buffers; its bytes are checked against the cap once that pass has run
        (_check_settled_workspace), so a cap the finished module meets is not refused for
        buffers it no longer keeps.
        """
        if not nbytes:
            return
        self.plan.workspace_bytes[dev] = self.plan.workspace_bytes.get(dev, 0) + nbytes
        used[dev] = used.get(dev, 0) + nbytes
        if settles_later:
            self._unsettled[dev] = self._unsettled.get(dev, 0) + nbytes
        cap = self.caps.get(dev)
        if cap is not None and used[dev] - self._unsettled.get(dev, 0) > cap:
            self._over_cap(node, dev, nbytes, used[dev], cap)

    def _check_settled_workspace(self) -> None:
        """After the channels-last pass: each device's total within its cap, else GraphError
        naming the first kernel (in run order) whose workspace brings it past."""
        self._unsettled = {}
        used = self.plan.bytes_per_device()
        for step in self.steps:
            nbytes = 0 if step.is_copy else step.kernel.workspace_bytes()
            used[step.device] = used.get(step.device, 0) + nbytes
            cap = self.caps.get(step.device)
            if nbytes and cap is not None and used[step.device] > cap:
                self._over_cap(self.graph.nodes[step.nid], step.device, nbytes,
                               used[step.device], cap)

    def _over_cap(self, node: Any, dev: Device, nbytes: int, total: int, cap: int) -> None:
        raise GraphError(f"{self.graph.source}: {node.label} ({node.func_name}) keeps "
                         f"{fmt_bytes(nbytes)} of workspace on {dev}, which brings the total "
                         f"there to {fmt_bytes(total)} but the cap is {fmt_bytes(cap)}; "
                         "pass memory_cap= to raise the cap")

    def bodies_bytes(self) -> dict[Device, int]:
        """What the control-flow bodies its kernels hold keep, per device."""
        return add_bytes(module.held_bytes() for step in self.steps
                         for module in step.kernel.sub_modules())

    def written(self, eid: int) -> None:
        """Count a write into input eid from outside run(), so derived data is redone."""
        version = self.versions.get(eid)
        if version is not None:
            version.count()

    def escaped(self, eid: int) -> None:
        """Entry eid may now change without a count (a view handed out, a zero-copy bind)."""
        if self._ready:  # setup's own binds (requested storage) hand nothing out
            self.escaped_entries.add(eid)
        version = self.versions.get(eid)
        if version is not None:
            version.set_volatile(True)

    def _copy_node_step(self, node: Any, in_eids: list[int], out_eids: list[int]
                        ) -> PreparedCall | None:
        """The copy a __copy node makes; None for one within a device that reads as a view."""
        g = self.graph
        if len(in_eids) != 1 or len(out_eids) != 1:
            raise GraphError(f"{g.source}: {node.label} is a __copy with {len(in_eids)} inputs "
                             f"and {len(out_eids)} outputs; expected 1 and 1")
        src_eid, dst_eid = in_eids[0], out_eids[0]
        src_spec = (tuple(g.shape(src_eid)), g.dtype(src_eid))
        dst_spec = (tuple(g.shape(dst_eid)), g.dtype(dst_eid))
        if src_spec != dst_spec:
            raise GraphError(f"{g.source}: {node.label} copies eid {src_eid} {src_spec} into eid "
                             f"{dst_eid} {dst_spec}; a __copy needs equal shape and dtype")
        src, dst = self.entry_device[src_eid], self.entry_device[dst_eid]
        if src == dst and self._can_alias(node.nid, src_eid, dst_eid):
            self._alias_keys.append(((dst_eid, dst), (src_eid, src)))
            self._aliased.update((src_eid, dst_eid))
            self.dropped_copies.add(node.nid)
            log.info("%s: %s copies within %s; its readers read eid %d directly", g.source,
                     node.label, src, src_eid)
            return None
        return self._copy_step(node.nid, node.label, src_eid, src, dst, dst_eid)

    def _can_alias(self, nid: int, src_eid: int, dst_eid: int) -> bool:
        """Whether dst may be read straight from src's storage: src is not an input or output
        (zero copy could rebind one of them alone), no `__nop` aliases dst (its output would
        keep dst's own, unwritten storage), and nothing else writes src's storage id between
        the copy and dst's last reader."""
        if src_eid in self._io_eids or dst_eid in self._io_eids:
            return False
        live = self.graph.liveness
        if live.aliased(dst_eid):
            return False
        return not live.written_between(src_eid, nid, live.last_read[dst_eid])

    def _copy_step(self, nid: int, label: str, src_eid: int, src: Device, dst: Device,
                   dst_eid: int | None = None) -> PreparedCall:
        src_backend = check_device(src)
        dst_backend = check_device(dst)

        def copy(src_array: Any, dst_array: Any) -> None:
            copy_array(src_backend, src_array, dst_backend, dst_array)

        keys = [ArgKey(src_eid, src, False),
                ArgKey(src_eid if dst_eid is None else dst_eid, dst, False)]
        return PreparedCall(nid, label, COPY_OP, dst, copy, [], keys, 1, True, capabilities(copy))

    def _bind(self, key: ArgKey) -> Any:
        eid, dev, flatten = key
        array = self.arrays[(eid, dev)]
        return array.reshape(-1) if flatten else array

    # ---- binding (zero copy) -------------------------------------------------------------------

    def own_io(self) -> None:
        """Inputs and outputs in bytes other specialisations share (derive) get buffers of
        their own, their values kept: this executor's module is handed out, and may run or be
        read while another specialisation is the current one."""
        for eid, old, view in self.pool.own_io(self.graph):
            if self.arrays.get((eid, self.entry_device[eid])) is old:
                self.rebind(eid, view)

    def rebind(self, eid: int, array: Any) -> None:
        """Make every step that touches eid on its home device use array instead of the pool view.

        Only references to this entry change, so entries sharing its storage id keep the pool
        (the bug of apache/tvm#9448 and #17152 cannot happen here).
        """
        dev = self.entry_device[eid]
        self.arrays[(eid, dev)] = array
        self.escaped(eid)
        if self._ready and self.cuda_graph is not None:
            self.cuda_graph.invalidate()  # the graph holds the old array's address
        if self._ready:
            self._moved()
        if not self._ready or eid not in self._io_eids:  # in setup the shortcuts may change
            uses = self._uses_of(self._all_steps(), {eid}).get((eid, dev), [])
        else:
            if self._uses is None:  # built once: a symbolic module binds every param here
                self._uses = self._uses_of(self._all_steps(), self._io_eids)
            uses = self._uses.get((eid, dev), [])
        for args, pos, flatten in uses:
            args[pos] = array.reshape(-1) if flatten else array

    def _all_steps(self) -> list[PreparedCall]:
        """The steps and their shortcuts: every argument list an entry's array may sit in."""
        return self.steps + list(self.shortcuts.values())

    @staticmethod
    def _uses_of(steps: list[PreparedCall], eids: Collection[int]
                 ) -> dict[tuple[int, Device], list[tuple[list[Any], int, bool]]]:
        """Per (eid, device) of eids: the argument lists (and positions) holding its array."""
        uses: dict[tuple[int, Device], list[tuple[list[Any], int, bool]]] = {}
        for step in steps:
            for pos, (e, d, flatten) in enumerate(step.arg_keys):
                if e in eids:
                    uses.setdefault((e, d), []).append((step.args, pos, flatten))
        return uses

    # ---- running -------------------------------------------------------------------------------

    def run(self) -> None:
        """Run every step once, in order. Work may still be queued on devices when it returns."""
        if self.cuda_graph is not None:
            self.cuda_graph.run()
        elif self.native is not None:
            self.native.run()
        else:
            self._run_listed(self._calls, self._call_steps)

    def _run_calls(self) -> None:
        self._run_listed(self._calls, self._call_steps)

    def _run_listed(self, calls: list[tuple[Callable[..., Any], Any]],
                    steps: list[PreparedCall]) -> None:
        """Make calls in order; steps[i] is the step calls[i] stands for (named when it
        fails)."""
        done = 0
        with self._blas_scope:
            try:
                for fn, args in calls:
                    fn(*args)
                    done += 1
            except GraphRuntimeError as e:
                named = self._named(steps[done], e)
                if named is e:
                    raise
                raise named from e
            except Exception as e:
                raise self._failed(steps[done], e) from e

    def _moved(self, steps: Iterable[int] | None = None) -> None:
        """The steps' arguments changed (steps: the indices of those that may have, in
        self.steps; None: any): a replay of their recorded calls records again."""
        native = getattr(self, "native", None)  # (none before the first _finish)
        if native is not None:
            native.invalidate(None if steps is None else
                              [self._call_index[i] for i in steps if i in self._call_index])

    def _failed(self, step: PreparedCall, e: Exception) -> LibraryError:
        """The one error a kernel's own exception becomes, naming the node (wrapped once)."""
        return LibraryError(f"{self.graph.source}: {step.label} ({step.func_name} on "
                            f"{step.device}) failed: {type(e).__name__}: {e}")

    def _named(self, step: PreparedCall, e: GraphRuntimeError) -> GraphRuntimeError:
        """A kernel's refusal at run (a data check: an index out of range) with its node named,
        or e itself when it names the node already."""
        if step.label in str(e):
            return e
        return type(e)(f"{self.graph.source}: {step.label} ({step.func_name} on {step.device}): "
                       f"{e}")

    def sync(self) -> None:
        """Wait for every device this graph uses."""
        for dev in self.devices:
            check_device(dev).sync(dev.device_id)

    def run_steps(self, each: Callable[[PreparedCall], None] | None = None,
                  timer: Callable[[PreparedCall, float], None] | None = None) -> None:
        """Run step by step, syncing each device after its step (profiling and debugging)."""
        with self._blas_scope:
            self._run_steps(each, timer)

    def _run_steps(self, each: Callable[[PreparedCall], None] | None,
                   timer: Callable[[PreparedCall, float], None] | None) -> None:
        for step in self.steps:
            backend = check_device(step.device)
            start = time.perf_counter()
            try:
                step.fn(*step.args)
                backend.sync(step.device.device_id)
            except GraphRuntimeError as e:
                named = self._named(step, e)
                if named is e:
                    raise
                raise named from e
            except Exception as e:
                raise self._failed(step, e) from e
            if timer is not None:
                timer(step, time.perf_counter() - start)
            if each is not None:
                each(step)

    def profile(self, repeat: int = 1, progress: Callable[[int], None] | None = None
                ) -> list[NodeTime]:
        """Per-step device-synchronised wall times, median over repeat runs."""
        if repeat < 1:
            raise GraphRuntimeError(f"profile repeat must be >= 1, got {repeat}")
        self.run()  # warm-up: first calls compile kernels and fault in pages
        self.sync()
        samples: dict[int, list[float]] = {id(s): [] for s in self.steps}
        for r in range(repeat):
            self.run_steps(timer=lambda s, t: samples[id(s)].append(t))
            if progress is not None:
                progress(r + 1)
        result = []
        for s in self.steps:
            times = sorted(samples[id(s)])
            result.append(NodeTime(s.nid, s.label, s.func_name, s.device, s.is_copy,
                                   times[len(times) // 2]))
        return result


def _function_ident(node: Any) -> str:
    """What a node's kernel is made of besides its shapes: its function and its own attrs (a
    one-op function takes the node's), without the dims and values a specialisation adds."""
    return repr((node.func_name, sorted((k, v) for k, v in node.attrs.items()
                                        if k not in (DIMS_KEY, VALUES_KEY))))


def _class_key(key: tuple, kind: str = "class", classes: tuple | None = None) -> tuple:
    """A kernel key (by function, or by node for one holding the node's data: Executor.
    _prepare_steps) with its shapes rounded: where a kernel taking any shape (PreparedKernel.
    any_shape) is kept. By their ranks alone (kind "rank": a kernel nothing in which depends
    on sizes, PreparedKernel.shape_free), by their rows' bands (kind "band": one kernel for
    every row count over SMALL_DIM where its tuning choices agree, PreparedKernel.serves), else
    by their size classes (_rounded_shapes). classes: the key's shapes rounded so already. A symbolic
    chain's binding counts only its dims that decide more than a shape (Binding.values: the
    kernel reads its arrays' shapes at each call)."""
    func, dev, shapes = key[:3]
    return (kind, func, dev, classes or _rounded(kind, shapes)) + tuple(
        b.values if isinstance(b, Binding) else b for b in key[3:])


def _candidate_keys(by_function: tuple, exact: tuple) -> Iterator[tuple]:
    """The keys a node's kernel may be kept by, in the order they are asked: its function's
    and its own at these shapes, then both by band, then by size class (each made only when
    the ones before missed: a decode step asks for some 30 nodes)."""
    yield by_function
    yield exact
    for kind in _ROUNDED:
        rounded = _rounded(kind, exact[2])
        yield _class_key(by_function, kind, rounded)
        yield _class_key(exact, kind, rounded)


# The kinds of key an any-shape kernel is kept by, as asked: its arrays' ranks alone (a
# PreparedKernel.shape_free one), their rows' band, their size classes.
_ROUNDED = ("rank", "band", "class")


def _rounded(kind: str, shapes: tuple[tuple[int, ...], ...]) -> tuple:
    """shapes as a key of that kind holds them: their ranks, or rounded (_rounded_shapes)."""
    if kind == "rank":
        return tuple(len(shape) for shape in shapes)
    return _rounded_shapes(shapes, kind == "band")


@functools.lru_cache(maxsize=1024)  # a decode step asks the same few shapes ~20 times
def _rounded_shapes(shapes: tuple[tuple[int, ...], ...], band: bool) -> tuple:
    """Each array's rank, its rows (every dim but the last, together) and its last dim's size
    class (tuning.class_shape). The rows by their size class too ((3, 193) and (4, 156): 579
    and 624 rows, class 1024), or with band exact up to SMALL_DIM and one band over it: a dense
    in pieces serves a prompt of any batch and length over SMALL_DIM rows (bench/stream.py's
    (2, 20) after (4, 194): its 29 products no longer prepared again per size class)."""
    return tuple(_rounded_shape(shape, band) for shape in shapes)


@functools.lru_cache(maxsize=1024)
def _rounded_shape(shape: tuple[int, ...], band: bool) -> tuple[int, int, int]:
    """One array's part of _rounded_shapes (a new length's ~14 steps of new shapes hold some 5
    shapes between them: each rounded once)."""
    rows, last = class_shape((math.prod(shape[:-1]), shape[-1] if shape else 1))
    return (len(shape), -1 if band and rows > SMALL_DIM else rows, last)


@dataclass(frozen=True)
class SetupPass(Generic[P]):
    """One setup pass over the prepared steps: plan reads the executor and changes nothing;
    apply is the one place its plan changes arrays, step arguments, the pool or byte counts."""

    name: str
    plan: Callable[[Executor], P]
    apply: Callable[[Executor, P], None]


# The setup passes, in the order they run, each planning over what the ones before applied:
# the layouts come first, as a kernel told its NHWC positions declares its in-place pairs
# (lib/prepared.py) and the flatten reads must know which sources hold NHWC bytes; the storage
# pass plans the pool's ids with the in-place pairs, allocates it and binds every step's
# arrays once; requested storage goes to entries sole in their id as planned; the flatten reads
# check those ids; input counters go to the shortcuts' kernels too, and count only an input
# sole in its id.
SETUP_PASSES: tuple[SetupPass[Any], ...] = (
    SetupPass("channels-last", Executor._plan_channels_last, Executor._keep_channels_last),
    SetupPass("storage", Executor._plan_storage, Executor._allocate),
    SetupPass("requested-storage", Executor._plan_requested_storage, Executor._place_requested),
    SetupPass("flatten-reads", Executor._plan_flatten_reads, Executor._skip_flattens),
    SetupPass("input-versions", Executor._plan_versions, Executor._bind_versions),
)
