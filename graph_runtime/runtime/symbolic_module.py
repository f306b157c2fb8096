"""SymbolicGraphModule: create()'s module for a graph with symbolic dims, specialised on first use.

Each new combination of input shapes (and values of the inputs that decide shapes) gets a static
GraphModule (shapes inferred, storage planned, kernels prepared: runtime/specialize.py), kept in
an LRU cache bounded by a count (cache_size) and by bytes (GRAPH_RUNTIME_SHAPE_CACHE_BYTES);
params are held once per device and bound zero copy into every one.
A cached combination costs a dictionary lookup per run; a new one costs one specialisation,
which measures nothing: its tuning choices are taken per size class (GRAPH_RUNTIME_SHAPE_TUNING,
lib/tuning.py's by_size_class; tune() measures representative shapes ahead of time)..
get_output, benchmark, profile, memory_report... answer for the specialisation the last run()
used (placement, copies and debug_get_outputs: the one for the inputs set now). Specialisations
derived from another share their inputs' and outputs' bytes (storage.Scratch.take_io): a view
get_input hands out is the current shape's input, which a later shape's run may overwrite;
specialised() hands out a module with bytes of its own.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import settings
from .._text import count_of
from ..backends import check_device, copy_array, get_backend
from ..backends.cpu import host_arena
from ..device import Device
from ..errors import GraphError, GraphRuntimeError, ParamsError
from ..graph.model import Graph
from ..graph.symbolic import shape_is_symbolic
from ..lib import tuning
from ..lib.kernels.cpu import jit_setup, team_gemv
from ..lib.kernels.derived import freeze, thaw
from ..lib.library import Module
from ..lib.prepared import PreparedKernel
from ..nd import NDArray, from_dlpack
from .executor import Executor, NodeTime, ShapeState
from .graph_module import GraphModule
from .measure import ShapeCost, SharedBytes, add_bytes
from .module_base import ModuleBase
from .placement import resolve_entry_devices
from .specialize import Specializer
from .storage import Scratch
from .steps import KernelCache

# a server's stream meets dozens of shapes (40 requests of bench/stream.py: 31), a decoder's
# generation one per token: the next generation meets those lengths again in the same order,
# which a count bound below them made miss every one (LRU: 64 kept of bench/generate.py's 129,
# 7.1 ms a token instead of 3.1). The bytes bound (GRAPH_RUNTIME_SHAPE_CACHE_BYTES) decides
# first for a large model (there about 1.5 MB a decode shape: some 700 lengths).
DEFAULT_CACHE_SIZE = 512
MEMO_KERNELS = 8192  # kernels whose shared items _shared_items keeps (a decode step's ~90 steps
# share some 60 kernels with the shape before: a step made anew for a new length keeps its kernel)
log = logging.getLogger("graph_runtime")
Item = tuple[Any, dict[Device, int]]  # something held and its bytes per device (SharedBytes)
# per (kernel id, device): the kernel, its workspace parts (owner id, bytes) and its items then
Memo = dict[tuple[int, Device], tuple[Any, list[tuple[int, int]], list[Item]]]
# what specialising a shape cost (SymbolicGraphModule._last_cost): the bound dims (written out
# when asked: _shape_cost); infer, plan,
# prepare seconds; tuning choices left at their default; derived; re-pointed in place
Cost = tuple[Mapping[str, int], float, float, float, int, bool, bool]


class SymbolicGraphModule(ModuleBase):
    """ModuleBase's API over a graph with symbolic dims (see the module docstring).

    `specializations` counts the static modules built; `cache_size` bounds how many are kept
    (least recently used dropped first).
    """

    def __init__(self, graph: Graph, lib: Module, ctxs: Sequence[Device], *, strict: bool = False,
                 memory_cap: int | Mapping[Any, int] | None = None,
                 allow_uninitialized: bool = False,
                 cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 1:
            raise GraphRuntimeError(f"cache_size must be >= 1, got {cache_size}")
        super().__init__(graph, lib, ctxs, strict=strict, memory_cap=memory_cap,
                         allow_uninitialized=allow_uninitialized)
        self.cache_size = cache_size
        self.entry_device = resolve_entry_devices(graph, self.ctxs, strict)
        self.specializer = Specializer(graph, lib, self.entry_device)
        _freeze_once()
        jit_setup.expect_other_sizes()  # kernels load the code other sizes take at their first run
        if any("dense" in (node.func_name or "") or "matmul" in (node.func_name or "")
               for node in graph.nodes):
            team_gemv.decide_layout()  # a new shape's products read weights as it says
        if any(dev.kind == "cpu" for dev in self.entry_device):
            # numba's one-time set-up (0.3-0.5 s) from now, not from the first request: a
            # static module's kernels start it as create() builds them, and these are built
            # by the first run
            jit_setup.start()
        self._sigs = {sig.name: sig for sig in self.specializer.inputs}
        self._names = [sig.name for sig in self.specializer.inputs]
        self._dtypes = [np.dtype(sig.dtype) for sig in self.specializer.inputs]
        self._value_names = set(self.specializer.value_inputs)
        self._cache: OrderedDict[tuple, GraphModule] = OrderedDict()
        self._current: GraphModule | None = None
        self._current_key: tuple | None = None
        # Latest value of each input: its shape, and the value itself while the current
        # specialisation does not hold it (a new shape, or no specialisation yet).
        self._shapes: dict[str, tuple[tuple[int, ...], str]] = {}
        self._held: dict[str, Any] = {}
        # inside run(**inputs): the inputs whose _held value is the caller's own array (copied
        # once, into the specialisation, instead of copied to be held and copied again)
        self._lent: set[str] = set()
        self._lending = False
        # (name, index) of each input not a param, for _express (None: worked out again)
        self._slots: list[tuple[str, int]] | None = None
        self._values: dict[str, np.ndarray] = {}  # host copies of shape-deciding inputs
        self._params: dict[str, tuple[Device, Any]] = {}  # one device array per param
        self.specializations = 0
        self.derivations = 0  # of them, made from the one used last (Executor.derive)
        # new shapes the module used last was made over in place (Executor.retarget), each
        # kept under the new shape's key instead of the old one's: no module made
        self.retargets = 0
        self.specialize_seconds = 0.0
        self.kernels = KernelCache()  # prepared kernels the specialisations share
        self.scratch = Scratch()  # host memory their intermediates share (one runs at a time)
        # per cached key: its module's own bytes (buffers outside its pool); its pool buffers
        # and its kernels' workspace and control-flow bodies, which a shape shares with those
        # derived from it and with every shape using the same kernels, in _shared (counted once)
        self._kept_bytes: dict[tuple, int] = {}
        self._shared = SharedBytes()
        # per (kernel id, device) of the kept shapes' steps: their items for _shared (every
        # step of a new length, made anew or kept, runs a kernel some shape before ran)
        self._step_items: Memo = {}
        self._kernel_keys: dict[tuple, list] = {}  # per cached key: the shared kernels it uses
        self._recount: set[tuple] = set()  # cached keys whose shared items _kept_total counts anew
        # per key of a shape a kept module was made over in place: that module, the shape as
        # made (Executor.restore) and what making it cost (at most cache_size, least recent
        # dropped); and per such module (by id, while kept) the key it is kept under now
        self._states: OrderedDict[tuple, tuple[GraphModule, ShapeState, Cost]] = OrderedDict()
        self._keyed: dict[int, tuple] = {}
        self._costs: dict[tuple, Cost] = {}  # per cached key: as _last_cost
        # The last run's shape: whether that run specialised it, and what specialising it cost
        self._last_new = False
        self._last_cost: Cost = ({}, 0.0, 0.0, 0.0, 0, False, False)

    @property
    def signature(self) -> str:
        return self.specializer.signature

    def _clone(self) -> SymbolicGraphModule:
        other = SymbolicGraphModule(self.graph, self.lib, self.ctxs, strict=self.strict,
                                    memory_cap=self.memory_cap,
                                    allow_uninitialized=self.allow_uninitialized,
                                    cache_size=self.cache_size)
        for name in self._params:
            other._share_input(self, name)
        return other

    # ---- inputs and params ---------------------------------------------------------------------

    def _set_one(self, index: int, value: Any) -> None:
        """Each input may have any shape the graph's dims allow."""
        name = self._names[index]
        if name in self._params:
            raise GraphError(f"input {name!r} is a param; load it with load_params")
        shape, dtype = _shape_dtype(value)
        sig = self._sigs[name]
        if dtype != self._dtypes[index]:
            raise GraphError(f"input {name!r} (eid {sig.eid}): expected dtype {sig.dtype}, got "
                             f"{dtype} (shape {shape})")
        self._shapes[name] = (shape, sig.dtype)
        if name in self._value_names:
            self._values[name] = _host_copy(value)
        if self._lending:  # run(**inputs): the specialisation they pick copies them once
            self._held[name] = value
            self._lent.add(name)
            return
        current = self._current
        if current is not None and self._current_key is not None \
                and self._current_key[index] == shape and name not in self._held:
            current.set_input(name, value)
            return
        self._held[name] = _keep(value)

    def _get_input_at(self, index: int, out: Any) -> Any:
        held = self._params.get(self._names[index])
        if held is not None and out is None:
            thaw(held[1])  # the caller may write the param through the view
        return self._module("get_input").get_input(index, out)

    def _load_values(self, values: Mapping[str, Any], source: str) -> None:
        """Params held once per device, shared by every specialisation: those on the host in
        one arena (host_arena: read on huge pages), every one checked before any is held."""
        checked = []
        for name, val in values.items():
            sig = self._sigs.get(name)
            if sig is None:
                continue
            if shape_is_symbolic(sig.shape):
                raise ParamsError(f"{source}: param {name!r}: the graph declares it with "
                                  f"symbolic dims {sig.shape}; params need static shapes")
            host = _host_copy(val)
            if tuple(host.shape) != tuple(sig.shape) or host.dtype != np.dtype(sig.dtype):
                raise ParamsError(f"{source}: param {name!r} is {tuple(host.shape)} "
                                  f"{host.dtype} but the graph's input {name!r} (eid "
                                  f"{sig.eid}) is {tuple(sig.shape)} {sig.dtype}")
            checked.append((name, sig, host))
        on_host = [host for _, sig, host in checked
                   if self.entry_device[sig.eid].kind == "cpu"]
        arena = iter(host_arena([host.nbytes for host in on_host]))
        for name, sig, host in checked:
            dev = self.entry_device[sig.eid]
            backend = check_device(dev)
            if dev.kind == "cpu":
                array = np.ndarray(host.shape, host.dtype, next(arena))
            else:
                array = backend.empty(dev.device_id, tuple(host.shape), host.dtype)
            copy_array(get_backend("cpu"), host, backend, array)
            if dev.kind == "cpu":
                freeze(array)  # never written again: its packed forms are shared
            self._params[name] = (dev, array)
            self._shapes[name] = (tuple(host.shape), sig.dtype)
            self._held.pop(name, None)
            for module in self._cache.values():
                module._adopt_input(name, array)
            if name in self._value_names:
                self._values[name] = host
        self._params_changed()

    def _share_input(self, other: SymbolicGraphModule, name: str) -> None:
        """Bind other's device array of param name here and in every specialisation."""
        held = other._params.get(name)
        if held is None:
            raise ParamsError(f"share_params: {name!r} is not a param loaded in the other module "
                              "(load_params there first); its params are: "
                              + (", ".join(other._params) or "none"))
        sig = self._sigs.get(name)
        if sig is None:
            raise GraphError(f"share_params: graph has no input {name!r}; inputs are: "
                             f"{self._input_names()}")
        dev, array = held
        if dev != self.entry_device[sig.eid] or other._shapes[name] != (tuple(sig.shape),
                                                                        sig.dtype):
            raise ParamsError(f"share_params: {name!r} is {other._shapes[name][0]} "
                              f"{other._shapes[name][1]} on {dev} in the other module but "
                              f"{tuple(sig.shape)} {sig.dtype} on {self.entry_device[sig.eid]} "
                              "here")
        self._params[name] = held
        self._shapes[name] = other._shapes[name]
        self._held.pop(name, None)
        for module in self._cache.values():
            module._adopt_input(name, array)
        if name in other._values:
            self._values[name] = other._values[name]
        self._params_changed()

    def _params_changed(self) -> None:
        """Kernels deriving data from the old params are prepared again for new shapes."""
        self._slots = None
        self.kernels.params = {self._sigs[name].eid for name in self._params}
        self.kernels.param_arrays = {self._sigs[name].eid: array
                                     for name, (_, array) in self._params.items()}
        self.kernels.clear()

    # ---- running -------------------------------------------------------------------------------

    def _run_unlocked(self) -> None:
        """Pick (or build) the specialisation for the inputs' shapes, run it."""
        self._specialised().run()

    def _run_with(self, inputs: Mapping[str, Any]) -> None:
        """run(**inputs): an input of a new shape is held as the caller's own array (lent),
        which the specialisation it goes to copies once (set_input copies it to hold it, then
        again into the specialisation); where no specialisation takes them (an error), lent
        inputs still held are copied, as set_input holds them, so nothing set is lost."""
        if not inputs:
            self._run_unlocked()
            return
        module = self._express(inputs)
        if module is not None:
            module.run()
            return
        self._lending = True
        try:
            self._set_input_unlocked(None, None, inputs)
            module = self._specialised()
        finally:
            self._lending = False
            for name in self._lent:
                if name in self._held:
                    self._held[name] = _keep(self._held[name])
            self._lent.clear()
        module.run()

    def _express(self, inputs: Mapping[str, Any]) -> GraphModule | None:
        """run(**inputs) at the shapes the module ran last, every input not a param given as a
        host array of its dtype (a server's repeated shape): set straight into the
        specialisation in use (its _set_inputs, as _specialised sets held inputs), without
        holding, keying or looking it up (a LLaMA decode step's eleven inputs at one length:
        120 -> 85 us before the run; after a run the caches are cold and each step dear). None,
        nothing set, where any of that does not hold: the full way decides."""
        current, key = self._current, self._current_key
        if (current is None or key is None or self._held or self._value_names
                or not self._threads_kept()):
            return None
        slots = self._slots
        if slots is None:
            slots = self._slots = [(name, index) for index, name in enumerate(self._names)
                                   if name not in self._params]
        if len(inputs) != len(slots):
            return None
        dtypes = self._dtypes
        for name, index in slots:
            value = inputs.get(name)
            if (type(value) is not np.ndarray or value.shape != key[index]
                    or value.dtype != dtypes[index]):
                return None
        current._set_inputs(inputs)
        self._last_new = False
        return current

    def _output_at(self, index: int, out: Any) -> Any:
        return self._module("get_output")._output_held(index, out)

    def _host_outputs(self) -> list[np.ndarray]:
        module = self._module("run_with")
        module._acquire("run_with")
        try:
            return module._host_outputs()
        finally:
            module._release()

    def specialised(self) -> GraphModule:
        """The static module for the inputs set now (built and cached if new), whose inputs and
        outputs are its own from now on (Executor.own_io): it may be run or read directly
        while other shapes run here."""
        self._acquire("specialised")
        try:
            module = self._specialised()
            if module.executor.pool.io_ids:
                module.executor.own_io()
                if self._current_key in self._cache:  # its bytes counted anew
                    self._shared.drop(self._current_key)
                    self._shared.add(self._current_key,
                                     _shared_items(module, self._param_ids(),
                                                   memo=self._step_items))
            return module
        finally:
            self._release()

    def _module(self, what: str) -> GraphModule:
        if self._current is None:
            raise GraphError(f"{what}: nothing has run yet; a graph with symbolic dims "
                             f"({self.signature}) is specialised by run() for its inputs' shapes")
        return self._current

    def _key(self) -> tuple:
        missing = [n for n in self._names if n not in self._shapes]
        if missing:
            if not self.allow_uninitialized:
                raise GraphError(f"{self.graph.source}: {count_of(len(missing), 'input')} never "
                                 f"set: {', '.join(missing[:10])}; a graph with symbolic dims "
                                 f"({self.signature}) needs every input to know its shapes")
            raise GraphError(f"{self.graph.source}: inputs {', '.join(missing[:10])} were never "
                             "set, so their shapes (symbolic in this graph) are unknown")
        key: list[Any] = [self._shapes[n][0] for n in self._names]
        for name in sorted(self._value_names):
            array = self._values[name]
            key.append((array.dtype.str, array.shape, array.tobytes()))
        return tuple(key)

    def _specialised(self) -> GraphModule:
        key = self._key()
        if self._threads_moved():
            self._drop_shapes()
        current = self._current
        module: GraphModule | None
        if current is not None and key == self._current_key:
            if not self._held:
                self._last_new = False
                return current
            module = current  # new values for the same shapes
        else:
            module = self._cache.get(key)
        if module is None:
            module = self._retargeted(key) or self._build(key)
        else:
            self._cache.move_to_end(key)
            self._last_new = False
            self._last_cost = self._costs[key]
        if module is not current and len(self._held) + len(self._params) < len(self._names):
            for name in self._names:
                if name in self._held or name in self._params:
                    continue
                if current is not None:  # the value lives in the module used last
                    module.set_input(name, current.get_input(name, out=None))
        module._set_inputs(self._held)
        self._held.clear()
        self._current = module
        self._current_key = key
        return module

    def _drop_shapes(self) -> None:
        """oneDNN's thread mode changed (a neighbour came or went: policy.recheck): every shape
        is made again in the new one, kernels included. The module in use stays readable (its
        inputs are copied into the next)."""
        self._cache.clear()
        self._step_items.clear()
        self._kept_bytes.clear()
        self._shared.clear()
        self._kernel_keys.clear()
        self._recount.clear()
        self._states.clear()
        self._keyed.clear()
        self._costs.clear()
        self.kernels.clear()
        self._current_key = None
        log.info("%s: oneDNN's thread mode changed; every shape is specialised again",
                 self.graph.source)

    def _build(self, key: tuple) -> GraphModule:
        module, self._last_cost = self._static(
            measure=settings.word(settings.SHAPE_TUNING) == "measure")
        self._last_new = True
        module._adopt_inputs({name: array for name, (_, array) in self._params.items()})
        self._cache[key] = module
        self._kept_bytes[key] = sum(module.executor.plan.extra_bytes.values())
        self._shared.add(key, _shared_items(module, self._param_ids(), memo=self._step_items))
        self._kernel_keys[key] = self.kernels.hold()
        self._costs[key] = self._last_cost
        if module.executor.pool.io_ids:  # derived: it may be re-pointed, and brought back here
            self._keep_state(key, module, self._last_cost)
        bound = settings.shape_cache_bytes()
        while len(self._cache) > 1 and (len(self._cache) > self.cache_size
                                        or self._kept_total() > bound):
            old_key, old = self._cache.popitem(last=False)
            for step in old.executor.steps:  # the memo holds no dropped shape's kernels
                self._step_items.pop((id(step.kernel), step.device), None)
            del self._kept_bytes[old_key]
            self._shared.drop(old_key)
            self._recount.discard(old_key)
            if self._keyed.pop(id(old), None) is not None:  # its shapes go with it
                for gone in [k for k, met in self._states.items() if met[0] is old]:
                    del self._states[gone]
            self.kernels.release(self._kernel_keys.pop(old_key))
            del self._costs[old_key]
            if old_key == self._current_key:
                self._current_key = None  # still usable as `current` for the copies above
        return module

    def _retargeted(self, key: tuple) -> GraphModule | None:
        """A kept module made over key's shapes in place and kept under key instead of its
        own: one that was made over them before (Executor.restore: a server's next generation
        meets the last one's lengths), else the module used last (Executor.retarget: a decode
        step's next length, where only sizes move and every kernel serves the new ones, costs
        its shape inference and new views, no module; derived, each length made and kept a
        module, 1.5 ms a token on a 1.6 ms run). None where neither can: no module used yet or
        one not kept, one made in full or handed out by specialised() (it keeps its shapes), a
        kernel not serving the new sizes, storage outgrown, tuning measured per shape, inputs
        whose values decide shapes."""
        met = self._states.get(key)
        if met is not None:
            module, state, cost = met
            old_key = self._keyed.get(id(module))
            if old_key is not None and self._cache.get(old_key) is module \
                    and module._restore(state):
                self._states.move_to_end(key)
                self._rekey(module, old_key, key, cost, new=False)
                return module
            del self._states[key]
        current, old_key = self._current, self._current_key
        if (current is None or old_key is None or self._cache.get(old_key) is not current
                or not current.executor.pool.io_ids or self._value_names
                or settings.word(settings.SHAPE_TUNING) == "measure"):
            return None
        start = time.perf_counter()
        # the params' shapes are fixed (load_params checks them): infer_shapes keeps their last
        shapes = {n: self._shapes[n][0] for n in self._names if n not in self._params}
        entry_shapes = self.specializer.infer_shapes(shapes, {}, fast=True)
        inferred = time.perf_counter()
        static = self.specializer.static_graph(entry_shapes, self.specializer.last_env)
        planned = time.perf_counter()
        with tuning.by_size_class(), settings.held():
            if not current._retarget(static):
                return None
        done = time.perf_counter()
        crossed = self.kernels.hold()  # kernels it now uses under another size class's key
        self.retargets += 1
        self.specialize_seconds += done - start
        made: Cost = (self.specializer.last_env, inferred - start, planned - inferred,
                      done - planned, 0, True, True)
        self._keep_state(key, current, made)
        self._rekey(current, old_key, key, made, new=True)
        if crossed:
            self._kernel_keys[key] = self._kernel_keys[key] + crossed
        return current

    def _keep_state(self, key: tuple, module: GraphModule, cost: Cost) -> None:
        """module, made over key's shapes (derived or re-pointed), as restore brings it back."""
        self._states[key] = (module, module.executor.state(), cost)
        self._keyed[id(module)] = key
        if len(self._states) > self.cache_size:
            self._states.popitem(last=False)

    def _rekey(self, module: GraphModule, old_key: tuple, key: tuple, cost: Cost,
               new: bool) -> None:
        """module, kept under old_key, made over key's shapes in place: kept under key now."""
        del self._cache[old_key]
        self._cache[key] = module
        self._keyed[id(module)] = key
        if self._current_key == old_key:
            self._current_key = None  # the module used last is at other shapes now
        self._kept_bytes[key] = self._kept_bytes.pop(old_key)
        self._shared.rename(old_key, key)
        self._recount.discard(old_key)
        self._recount.add(key)  # its kernels' workspace may have grown at these sizes
        self._kernel_keys[key] = self._kernel_keys.pop(old_key)
        del self._costs[old_key]
        self._last_cost = self._costs[key] = cost
        self._last_new = new

    def _param_ids(self) -> set[int]:
        return {id(array) for _, array in self._params.values()}

    def _kept_total(self) -> int:
        """The bytes the cached shapes keep, params and the shared scratch aside."""
        for key in self._recount:  # re-pointed in place since counted
            self._shared.drop(key)
            self._shared.add(key, _shared_items(self._cache[key], self._param_ids(),
                                                memo=self._step_items))
        self._recount.clear()
        return sum(self._kept_bytes.values()) + self._shared.total

    def _static(self, measure: bool, kernels: KernelCache | None = None
                ) -> tuple[GraphModule, Cost]:
        """The static module for the shapes (and values) set now, counted, and what it cost
        (as _last_cost); its tuning choices are measured only when measure is set, else taken
        per size class. kernels: where its kernels are shared (default: the module's)."""
        start = time.perf_counter()
        kernels = self.kernels if kernels is None else kernels
        kernels.taken = []  # a build that failed before leaves none
        kernels.pending = []
        defaults = tuning.class_defaults
        shapes = {n: self._shapes[n][0] for n in self._names}
        values = {self._sigs[n].eid: v for n, v in self._values.items()}
        entry_shapes = self.specializer.infer_shapes(shapes, values, fast=True)
        inferred = time.perf_counter()
        try:
            static = self.specializer.static_graph(entry_shapes, self.specializer.last_env)
            planned = time.perf_counter()
            base = self._current if kernels is self.kernels else None
            with contextlib.nullcontext() if measure else tuning.by_size_class(), \
                    settings.held():
                # from the specialisation used last where only sizes move (a decode step)
                derived = None if base is None else base.executor.derive(
                    static, self.lib, held=self._current_key in self._cache)
                module = GraphModule(static, self.lib, self.ctxs, strict=self.strict,
                                     memory_cap=self.memory_cap,
                                     allow_uninitialized=self.allow_uninitialized,
                                     kernels=kernels, scratch=self.scratch, base=base,
                                     executor=derived)
        except GraphRuntimeError:
            # a shape taken from the graph's expression that its rule contradicts: every rule
            # asked names the node and the dims (else the error stands)
            self.specializer.infer_shapes(shapes, values)
            raise
        done = time.perf_counter()
        self.specializations += 1
        self.derivations += derived is not None
        self.specialize_seconds += done - start
        return module, (self.specializer.last_env, inferred - start, planned - inferred,
                        done - planned, tuning.class_defaults - defaults, derived is not None,
                        False)

    def _shape_cost(self) -> ShapeCost:
        """The last run's shape: new or kept, what specialising it cost (by this run or the one
        that met it first), what is kept across shapes."""
        env, infer, plan, prepare, defaults, derived, retargeted = self._last_cost
        bound = ", ".join(f"{k}={v}" for k, v in env.items())
        return ShapeCost(bound, self._last_new, infer, plan, prepare, defaults, len(self._cache),
                         self._kept_total(), settings.shape_cache_bytes(), derived, retargeted)

    # ---- diagnostics: the specialisation for the inputs set (or the last run's) ----------------

    def _bench_target(self) -> tuple[Callable[[], None], Callable[[], None]]:
        executor = self._specialised().executor
        return executor.run, executor.sync

    def _profile_unlocked(self, repeat: int, progress: Callable[[int], None] | None
                          ) -> list[NodeTime]:
        """When this call met a new shape (built, or the module used last re-pointed in place),
        first rows `specialise` (nid -1) hold the time it took: shape inference, storage plan,
        kernels prepared (or re-pointed); a cached shape has none."""
        made = (self.specializations, self.retargets)
        module = self._specialised()
        times = module.profile(repeat, progress)
        if (self.specializations, self.retargets) == made:
            return times
        cost = self._shape_cost()
        last = "re-point kernels" if cost.retargeted else "prepare kernels"
        rows = [NodeTime(-1, f"specialise ({cost.shape or 'static'}): {what}", "__specialise",
                         self.ctxs[0], False, seconds)
                for what, seconds in (("infer shapes", cost.infer_s),
                                      ("plan storage", cost.plan_s),
                                      (last, cost.prepare_s))]
        return [*rows, *times]

    def _capture(self, names: set[str] | None) -> dict[str, list[np.ndarray]]:
        return self._specialised().debug_get_outputs(None if names is None else sorted(names))

    def _report_executor(self, what: str) -> Executor:
        self._acquire(what)
        try:
            return self._specialised().executor
        finally:
            self._release()

    def _static_modules(self, what: str) -> list[GraphModule]:
        return [self._module(what)]

    def held_bytes(self) -> dict[Device, int]:
        """What the module holds per device: every specialisation it keeps (pool, workspace,
        control-flow bodies), and once each the params (each specialisation binds them zero copy)
        and the scratch their intermediates, inputs and outputs share (storage.Scratch; a module
        made before it last grew may still hold a slice of the old one, not counted); a pool
        buffer or a kernel that specialisations share (Executor.derive, the KernelCache) counts
        once."""
        modules = list(self._cache.values())
        if self._current is not None and self._current not in modules:
            modules.append(self._current)  # evicted from the cache but still in use
        params: dict[Device, int] = {}
        for dev, array in self._params.values():
            params[dev] = params.get(dev, 0) + int(array.nbytes)
        shared, skip = SharedBytes(), self._param_ids()
        for index, module in enumerate(modules):
            shared.add(index, _shared_items(module, skip, param_data=True))
        return add_bytes([params, self.scratch.held_bytes(), shared.bytes_per_device(),
                          *(module.executor.plan.extra_bytes for module in modules)])

    @property
    def executor(self) -> Executor:
        """The executor of the specialisation the last run used (for reports)."""
        return self._module("executor").executor


def _shared_items(module: GraphModule, params: set[int], param_data: bool = False,
                  memo: Memo | None = None
                  ) -> list[Item]:
    """What a specialisation may share with others, for SharedBytes: its pool's buffers (the
    scratch's slices and the params, held once by the module, aside; a host buffer kept from a
    larger shape counted at its own size), its kernels' workspace and the control-flow bodies
    they hold (param_data: with what kernels derive from a param once and share, a packed
    weight, which the bound on the shapes kept does not count). Its buffers outside the pool
    are its own (plan.extra_bytes); its inputs' and outputs' bytes shared with other
    specialisations (StoragePool.io_ids) are the scratch's. memo: each kernel's items on its
    step's device at the workspace it had, kept (bounded) across calls."""
    executor = module.executor
    pool = executor.pool
    items: list[tuple[Any, dict[Device, int]]] = []
    for sid, buffer in pool.buffers.items():
        if sid in pool.scratch_ids or sid in pool.io_ids or id(buffer) in params:
            continue
        nbytes = buffer.nbytes if isinstance(buffer, np.ndarray) else pool.plan.sid_bytes[sid]
        items.append((buffer, {pool.plan.sid_device[sid]: int(nbytes)}))
    if memo is not None and len(memo) > MEMO_KERNELS:
        memo.clear()
    for step in executor.steps:
        key = (id(step.kernel), step.device)
        hit = None if memo is None else memo.get(key)
        # a kernel of any shape may grow its workspace; a copy it reads may be another's now
        parts = step.kernel.workspace_items()
        seen = [(id(owner), nbytes) for owner, nbytes in parts]
        if hit is not None and hit[0] is step.kernel and hit[1] == seen:
            items.extend(hit[2])
            continue
        # data derived once from a param (its packed copy), held as long as the param, which
        # the shapes' bound does not count either: counted in the module's report only
        mine: list[Item] = [(owner, {step.device: nbytes}) for owner, nbytes in parts
                            if param_data or isinstance(owner, PreparedKernel)]
        bodies = step.kernel.sub_modules()  # what they hold grows as they run: asked anew
        mine.extend((body, body.held_bytes()) for body in bodies)
        if memo is not None and not bodies:
            memo[key] = (step.kernel, seen, mine)
        items.extend(mine)
    return items


_frozen = False


def _freeze_once() -> None:
    """GRAPH_RUNTIME_GC_FREEZE: collect, then freeze what is alive, once per process.

    NOTE: every new shape leaves objects behind (its module, kernels, oneDNN handles), which
    brings on a full collection every few shapes; with numba, oneDNN's bindings and the model
    loaded it scanned about 150,000 objects, 65 ms in a LLaMA stream's 180 ms new shape."""
    global _frozen
    if _frozen or settings.word(settings.GC_FREEZE) == "off":
        return
    _frozen = True
    gc.collect()
    gc.freeze()


def tune(module: SymbolicGraphModule, shapes: Sequence[Mapping[str, Sequence[int]]]) -> int:
    """Measure module's tuning choices at representative shapes ahead of time (at create, never
    in a user's run()): each {input: shape} is specialised with its candidates raced and the
    answers kept in the tuning cache, where every later shape of the same size class finds them
    (lib/tuning.py's size_class). The modules made are not kept, and the module's kept kernels
    are dropped (a later shape prepares its own, with the answers). Returns how many were
    made."""
    if module.specializer.value_inputs:
        raise GraphError(f"tune: inputs {', '.join(module.specializer.value_inputs)} decide "
                         "shapes by their values; set them and run() instead")
    module._acquire("tune")
    saved = dict(module._shapes)
    try:
        for one in shapes:
            unknown = sorted(set(one) - set(module._names))
            if unknown:
                raise GraphError(f"tune: graph has no input {unknown[0]!r}; inputs are: "
                                 f"{module._input_names()}")
            for name in module._names:
                if name in module._params:
                    continue
                if name not in one:
                    raise GraphError(f"tune: no shape for input {name!r} ({module.signature})")
                module._shapes[name] = (tuple(int(d) for d in one[name]),
                                        module._sigs[name].dtype)
            # kernels of its own: a kept one serving the shape's class (any_shape) would skip
            # the race; then none kept is taken for a new shape, which meets the answers
            module._static(measure=True, kernels=KernelCache(params=module.kernels.params))
        module.kernels.clear()
        return len(shapes)
    finally:
        module._shapes = saved
        module._release()


def _shape_dtype(value: Any) -> tuple[tuple[int, ...], np.dtype]:
    """A value's shape and dtype; a NumPy array's taken as NumPy gives them (run(**feeds)'s
    case, every input of every step: no string made or parsed)."""
    if type(value) is np.ndarray:
        return value.shape, value.dtype
    if isinstance(value, (np.ndarray, NDArray)):
        return tuple(int(d) for d in value.shape), np.dtype(value.dtype)
    if hasattr(value, "__dlpack__"):
        nd = from_dlpack(value)
        return tuple(int(d) for d in nd.shape), np.dtype(nd.dtype)
    host = np.asarray(value)
    return tuple(host.shape), host.dtype


def _host_copy(value: Any) -> np.ndarray:
    if isinstance(value, NDArray):
        return value.numpy()
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True)
    if hasattr(value, "__dlpack__"):
        return from_dlpack(value).numpy()
    return np.asarray(value)


def _keep(value: Any) -> Any:
    """A value set_input may read later: host arrays are copied (the caller may reuse them)."""
    if isinstance(value, NDArray):
        return NDArray(check_device(value.device).to_host(value.native), value.device) \
            if value.device.kind == "cpu" else value
    return _host_copy(value)

