"""SymbolicGraphModule: create()'s module for a graph with symbolic dims, specialised on first use.

Each new combination of input shapes (and values of the inputs that decide shapes) gets a static
GraphModule (shapes inferred, storage planned, kernels prepared: runtime/specialize.py), kept in
a bounded LRU cache; params are held once per device and bound zero copy into every one.
A cached combination costs a dictionary lookup per run; a new one costs one specialisation.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np

from .._text import count_of
from ..backends import check_device, copy_array, get_backend
from ..device import Device
from ..errors import GraphError, GraphRuntimeError, ParamsError
from ..graph.model import Graph
from ..graph.symbolic import shape_is_symbolic
from ..lib.library import Module
from ..nd import NDArray, from_dlpack
from .graph_module import GraphModule
from .symbolic_diagnostics import SymbolicDiagnostics
from .placement import resolve_entry_devices
from .specialize import Specializer

DEFAULT_CACHE_SIZE = 8


class SymbolicGraphModule(SymbolicDiagnostics):
    """GraphModule's API over a graph with symbolic dims (see the module docstring).

    get_output, benchmark, profile, memory_report... answer for the specialisation the last
    run() used. `specializations` counts the static modules built; `cache_size` bounds how many
    are kept (least recently used dropped first).
    """

    def __init__(self, graph: Graph, lib: Module, ctxs: Sequence[Device], *, strict: bool = False,
                 memory_cap: int | Mapping[Any, int] | None = None,
                 allow_uninitialized: bool = False,
                 cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 1:
            raise GraphRuntimeError(f"cache_size must be >= 1, got {cache_size}")
        self.graph = graph
        self.lib = lib
        self.ctxs = list(ctxs)
        self.strict = strict
        self.memory_cap = memory_cap
        self.allow_uninitialized = allow_uninitialized
        self.cache_size = cache_size
        self.entry_device = resolve_entry_devices(graph, self.ctxs, strict)
        self.specializer = Specializer(graph, lib, self.entry_device)
        self._sigs = {sig.name: sig for sig in self.specializer.inputs}
        self._names = [sig.name for sig in self.specializer.inputs]
        self._value_names = set(self.specializer.value_inputs)
        self._output_count = len(graph.output_entries)
        self._cache: OrderedDict[tuple, GraphModule] = OrderedDict()
        self._current: GraphModule | None = None
        self._current_key: tuple | None = None
        # Latest value of each input: its shape, and the value itself while the current
        # specialisation does not hold it (a new shape, or no specialisation yet).
        self._shapes: dict[str, tuple[tuple[int, ...], str]] = {}
        self._held: dict[str, Any] = {}
        self._values: dict[str, np.ndarray] = {}  # host copies of shape-deciding inputs
        self._params: dict[str, tuple[Device, Any]] = {}  # one device array per param
        self._lock = threading.Lock()
        self.specializations = 0
        self.specialize_seconds = 0.0

    # ---- what the graph takes ------------------------------------------------------------------

    @property
    def signature(self) -> str:
        return self.specializer.signature

    def get_num_inputs(self) -> int:
        return len(self._names)

    def get_num_outputs(self) -> int:
        return self._output_count

    def get_input_index(self, name: str) -> int:
        if name not in self._sigs:
            raise GraphError(f"graph has no input {name!r}; inputs are: {', '.join(self._names)}")
        return self._names.index(name)

    def get_input_info(self) -> tuple[dict[str, tuple[Any, ...]], dict[str, str]]:
        """(shape by input name, symbolic dims as names; dtype by input name)."""
        return ({s.name: s.shape for s in self.specializer.inputs},
                {s.name: s.dtype for s in self.specializer.inputs})

    def _name_of(self, key: int | str) -> str:
        if isinstance(key, str):
            self.get_input_index(key)
            return key
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool) \
                and 0 <= key < len(self._names):
            return self._names[int(key)]
        raise GraphError(f"input key must be a name or an index below "
                         f"{len(self._names)}, got {key!r}")

    # ---- inputs and params ---------------------------------------------------------------------

    def set_input(self, key: int | str | Mapping[str, Any] | None = None, value: Any = None,
                  **params: Any) -> None:
        """Set inputs by name or index; each may have any shape the graph's dims allow."""
        items: dict[str, Any] = {}
        if isinstance(key, Mapping):
            items.update(key)
        elif key is not None:
            if value is None:
                raise GraphError(f"set_input({key!r}) needs a value; got None")
            items[self._name_of(key)] = value
        items.update(params)
        with self._owned("set_input"):
            for name, val in items.items():
                self._set_one(self._name_of(name), val)

    def _set_one(self, name: str, value: Any) -> None:
        if name in self._params:
            raise GraphError(f"input {name!r} is a param; load it with load_params")
        shape, dtype = _shape_dtype(value)
        sig = self._sigs[name]
        if np.dtype(dtype) != np.dtype(sig.dtype):
            raise GraphError(f"input {name!r} (eid {sig.eid}): expected dtype {sig.dtype}, got "
                             f"{dtype} (shape {shape})")
        self._shapes[name] = (shape, sig.dtype)
        if name in self._value_names:
            self._values[name] = _host_copy(value)
        current = self._current
        if current is not None and self._current_key is not None \
                and self._current_key[self._names.index(name)] == shape \
                and name not in self._held:
            current.set_input(name, value)
            return
        self._held[name] = _keep(value)

    def load_params(self, params: bytes | bytearray | str | os.PathLike | Mapping[str, Any],
                    source: str | None = None) -> None:
        """Params (TVM blob, file or dict) held once per device, shared by every specialisation."""
        from ..params import load_param_arrays, load_params_file
        if isinstance(params, (bytes, bytearray, memoryview)):
            values: Mapping[str, Any] = load_param_arrays(bytes(params), source or "<params>")
        elif isinstance(params, (str, os.PathLike)):
            values = load_params_file(params)
            source = os.fspath(params)
        else:
            values = params
        source = source or "params"
        with self._owned("load_params"):
            for name, val in values.items():
                sig = self._sigs.get(name)
                if sig is None:
                    if self.strict:
                        raise ParamsError(f"{source}: param {name!r} is not an input of the "
                                          f"graph; inputs are: {', '.join(self._names)}")
                    continue
                if shape_is_symbolic(sig.shape):
                    raise ParamsError(f"{source}: param {name!r}: the graph declares it with "
                                      f"symbolic dims {sig.shape}; params need static shapes")
                host = _host_copy(val)
                if tuple(host.shape) != tuple(sig.shape) or host.dtype != np.dtype(sig.dtype):
                    raise ParamsError(f"{source}: param {name!r} is {tuple(host.shape)} "
                                      f"{host.dtype} but the graph's input {name!r} (eid "
                                      f"{sig.eid}) is {tuple(sig.shape)} {sig.dtype}")
                dev = self.entry_device[sig.eid]
                backend = check_device(dev)
                array = backend.empty(dev.device_id, tuple(host.shape), host.dtype)
                copy_array(get_backend("cpu"), host, backend, array)
                self._params[name] = (dev, array)
                self._shapes[name] = (tuple(host.shape), sig.dtype)
                self._held.pop(name, None)
                for module in self._cache.values():
                    module._adopt_input(name, array)
                if name in self._value_names:
                    self._values[name] = host

    # ---- running -------------------------------------------------------------------------------

    def run(self, **inputs: Any) -> None:
        """Set the given inputs, pick (or build) the specialisation for their shapes, run it."""
        if inputs:
            self.set_input(inputs)
        with self._owned("run"):
            self._specialised().run()

    def run_with(self, **inputs: Any) -> list[np.ndarray]:
        """Atomic set_input + run + host copies of every output (callers wait their turn)."""
        with self._lock:
            for name, val in inputs.items():
                self._set_one(self._name_of(name), val)
            module = self._specialised()
            return module.run_with()

    def get_output(self, index: int | str, out: Any = None) -> Any:
        """Output index (or name) of the last run's specialisation."""
        return self._module("get_output").get_output(self.graph.output_index(index), out)

    def get_output_index(self, name: str) -> int:
        """Index of the output called name (declared, else its head node's name)."""
        if not isinstance(name, str):
            raise GraphError(f"get_output_index needs an output name (a str), got "
                             f"{type(name).__name__} {name!r}")
        return self.graph.output_index(name)

    def get_input(self, key: int | str, out: Any = None) -> Any:
        return self._module("get_input").get_input(key, out)

    def get_output_info(self) -> tuple[list[tuple[Any, ...]], list[str]]:
        """(shape of each output, symbolic dims as names; dtype of each output)."""
        eids = list(self.graph.output_entries)
        return [tuple(self.graph.shape(e)) for e in eids], [self.graph.dtype(e) for e in eids]

    def clone(self) -> SymbolicGraphModule:
        """A new module on the same graph, lib and devices with its own specialisations,
        inputs and outputs, sharing this module's params zero copy (treat them as read-only):
        one copy of the weights for many threads."""
        other = SymbolicGraphModule(self.graph, self.lib, self.ctxs, strict=self.strict,
                                    memory_cap=self.memory_cap,
                                    allow_uninitialized=self.allow_uninitialized,
                                    cache_size=self.cache_size)
        with self._owned("clone"):
            for name in self._params:
                other._share_input(self, name)
        return other

    def share_params(self, other: SymbolicGraphModule, params_bytes: bytes) -> None:
        """Use other's param arrays (zero copy) for every name in params_bytes, as TVM does."""
        from ..params import load_param_arrays
        if not isinstance(other, SymbolicGraphModule):
            raise GraphError(f"share_params needs a SymbolicGraphModule to share with, got "
                             f"{type(other).__name__}")
        if not isinstance(params_bytes, (bytes, bytearray, memoryview)):
            raise ParamsError(f"share_params needs the params as bytes (save_param_dict's "
                              f"output), got {type(params_bytes).__name__}")
        with self._owned("share_params"):
            for name in load_param_arrays(bytes(params_bytes)):
                self._share_input(other, name)

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
                             f"{', '.join(self._names)}")
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

    def specialised(self) -> GraphModule:
        """The static module for the inputs set now (built and cached if new)."""
        with self._owned("specialised"):
            return self._specialised()

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
        if key == self._current_key and not self._held:
            return self._current  # type: ignore[return-value]
        module = self._cache.get(key)
        if module is None:
            module = self._build(key)
        else:
            self._cache.move_to_end(key)
        previous = self._current
        if module is not previous:
            for name in self._names:
                if name in self._held or name in self._params:
                    continue
                if previous is not None:  # the value lives in the module used last
                    module.set_input(name, previous.get_input(name, out=None))
        for name, value in self._held.items():
            module.set_input(name, value)
        self._held.clear()
        self._current = module
        self._current_key = key
        return module

    def _build(self, key: tuple) -> GraphModule:
        start = time.perf_counter()
        shapes = {n: self._shapes[n][0] for n in self._names}
        values = {self._sigs[n].eid: v for n, v in self._values.items()}
        entry_shapes = self.specializer.infer_shapes(shapes, values)
        static = self.specializer.static_graph(entry_shapes, self.specializer.last_env)
        module = GraphModule(static, self.lib, self.ctxs, strict=self.strict,
                             memory_cap=self.memory_cap,
                             allow_uninitialized=self.allow_uninitialized)
        for name, (_, array) in self._params.items():
            module._adopt_input(name, array)
        self._cache[key] = module
        while len(self._cache) > self.cache_size:
            old_key, _ = self._cache.popitem(last=False)
            if old_key == self._current_key:
                self._current_key = None  # still usable as `previous` for the copies above
        self.specializations += 1
        self.specialize_seconds += time.perf_counter() - start
        return module

    def _owned(self, what: str) -> Any:
        lock = self._lock
        if not lock.acquire(False):
            raise GraphRuntimeError(
                f"SymbolicGraphModule.{what}() called while another thread is in it; use "
                "run_with(**inputs) or one module per thread")
        return HeldLock(lock)


class HeldLock:
    """`with`: releases a lock taken without blocking (the owner check of a module's calls)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


def _shape_dtype(value: Any) -> tuple[tuple[int, ...], str]:
    if isinstance(value, (np.ndarray, NDArray)):
        return tuple(int(d) for d in value.shape), str(value.dtype)
    if hasattr(value, "__dlpack__"):
        nd = from_dlpack(value)
        return tuple(int(d) for d in nd.shape), str(nd.dtype)
    host = np.asarray(value)
    return tuple(host.shape), str(host.dtype)


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

