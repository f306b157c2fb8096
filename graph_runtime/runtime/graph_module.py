"""GraphModule: the object create() returns, with tvm.contrib.graph_executor's method names."""
from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from .._text import count_of
from ..backends import check_device, copy_array, get_backend
from ..device import Device, DeviceLike, cpu
from ..device import device as parse_device
from ..errors import DeviceError, GraphError, GraphRuntimeError, ParamsError
from ..graph.model import Graph, GraphSource
from ..lib.library import Module
from ..nd import NDArray, from_dlpack
from .diagnostics import Diagnostics
from .executor import Executor

log = logging.getLogger("graph_runtime")
_CPU = cpu(0)  # host arrays live here; the one CPU device


def _to_device_list(ctxs: DeviceLike | Sequence[DeviceLike]) -> list[Device]:
    if isinstance(ctxs, (list, tuple)):
        devices = [parse_device(c) for c in ctxs]
    else:
        devices = [parse_device(ctxs)]  # type: ignore[arg-type]
    if not devices:
        raise DeviceError("ctxs is empty; give at least one device, e.g. graph_runtime.cpu()")
    return devices


class GraphModule(Diagnostics):
    """A graph bound to devices and kernels, ready to run (see graph_runtime.create).

    Threads: a module holds one set of inputs, intermediates and outputs, so it runs one inference
    at a time. run(), set_input() and get_output() called from a second thread while another call
    is under way raise GraphRuntimeError instead of mixing two inferences. run_with(**inputs) sets
    the inputs, runs and returns host copies of the outputs as one atomic call (callers wait their
    turn), safe from many threads. For parallel inferences give each thread its own module with
    clone(): it shares this module's params (one copy of the weights) and has its own buffers.
    Inputs: run() refuses inputs that were never set (create(..., allow_uninitialized=True) opts
    out, for benchmarks whose values do not matter).
    """

    def __init__(self, graph: Graph, lib: Module, ctxs: Sequence[Device], *, strict: bool = False,
                 memory_cap: int | Mapping[Any, int] | None = None,
                 allow_uninitialized: bool = False) -> None:
        self.graph = graph
        self.lib = lib
        self.strict = strict
        self.memory_cap = memory_cap
        self.allow_uninitialized = allow_uninitialized
        self.executor = Executor(graph, lib, ctxs, strict=strict, memory_cap=memory_cap)
        # NOTE: a non-blocking acquire is the cheapest owner check on the hot calls;
        # run_with() blocks on it instead.
        self._lock = threading.Lock()
        self.ctxs = self.executor.ctxs
        inputs = graph.input_entries
        self._input_index = {name: i for i, name in enumerate(inputs)}
        self._input_eids = list(inputs.values())
        self._output_eids = list(graph.output_entries)
        # (shape, dtype, home key) of each input entry, for set_input's fast path.
        ex = self.executor
        self._input_layout = {eid: (tuple(graph.shape(eid)), np.dtype(graph.dtype(eid)),
                                    (eid, ex.entry_device[eid]))
                              for eid in self._input_eids}
        self._unset: set[int] = set() if allow_uninitialized else set(self._input_eids)
        self._param_names: set[str] = set()

    # ---- threads -------------------------------------------------------------------------------

    def _acquire(self, what: str) -> None:
        if not self._lock.acquire(blocking=False):
            raise GraphRuntimeError(
                f"GraphModule.{what}() called from thread {threading.current_thread().name!r} "
                "while another thread is in run/set_input/get_output on the same module; a "
                "module runs one inference at a time. Use run_with(**inputs) (atomic, callers "
                "wait their turn) or one module per thread (module.clone())")

    def _release(self) -> None:
        self._lock.release()

    def run_with(self, **inputs: Any) -> list[np.ndarray]:
        """Set inputs, run once and return every output as a host numpy array, atomically.

        Safe to call from many threads: callers wait for each other, so each gets the outputs of
        its own inputs. Use clone() to run inferences in parallel instead of in turn.
        """
        self._lock.acquire()
        try:
            if inputs:
                self._set_input_unlocked(None, None, inputs)
            self._run_unlocked()
            return [self._get_output_unlocked(i, None).numpy()
                    for i in range(len(self._output_eids))]
        finally:
            self._lock.release()

    def clone(self) -> "GraphModule":
        """A new module on the same graph, lib and devices with its own inputs, intermediates
        and outputs, sharing this module's params (loaded with load_params/share_params) zero
        copy: one copy of the weights for many threads. Treat the shared params as read-only."""
        other = GraphModule(self.graph, self.lib, self.ctxs, strict=self.strict,
                            memory_cap=self.memory_cap,
                            allow_uninitialized=self.allow_uninitialized)
        for name in self._param_names:
            other._share_input(self, name)
        return other

    # ---- inputs --------------------------------------------------------------------------------

    def get_num_inputs(self) -> int:
        """Number of graph inputs (arg nodes: data and params)."""
        return len(self._input_eids)

    def get_num_outputs(self) -> int:
        return len(self._output_eids)

    def get_input_index(self, name: str) -> int:
        """Index of the input called name; GraphError lists the inputs when there is none."""
        index = self._input_index.get(name)
        if index is None:
            raise GraphError(f"graph has no input {name!r}; inputs are: {self._input_names()}")
        return index

    def get_input_info(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """(shape by input name, dtype by input name), as TVM's get_input_info."""
        g = self.graph
        shapes = {g.nodes[nid].name: tuple(g.shape(eid))
                  for nid, eid in zip(g.arg_nodes, self._input_eids)}
        dtypes = {g.nodes[nid].name: g.dtype(eid)
                  for nid, eid in zip(g.arg_nodes, self._input_eids)}
        return shapes, dtypes

    def get_output_info(self) -> tuple[list[tuple[int, ...]], list[str]]:
        """(shape of each output, dtype of each output)."""
        g = self.graph
        return ([tuple(g.shape(e)) for e in self._output_eids],
                [g.dtype(e) for e in self._output_eids])

    def _input_names(self) -> str:
        names = list(self._input_index)
        return ", ".join(names[:20]) + (f" ... ({len(names)} in all)" if len(names) > 20 else "")

    def _resolve_input(self, key: int | str) -> int:
        if isinstance(key, str):
            return self._input_eids[self.get_input_index(key)]
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not 0 <= key < len(self._input_eids):
                raise GraphError(f"input index {key} is out of range: the graph has "
                                 f"{count_of(len(self._input_eids), 'input')} "
                                 f"({self._input_names()})")
            return self._input_eids[int(key)]
        raise GraphError(f"input key must be a name or an index, got {type(key).__name__}")

    def _input_name(self, eid: int) -> str:
        return self.graph.nodes[self.graph.arg_nodes[self._input_eids.index(eid)]].name

    def set_input(self, key: int | str | Mapping[str, Any] | None = None, value: Any = None,
                  **params: Any) -> None:
        """Copy values into inputs by name or index: numpy arrays, NDArrays or DLPack tensors."""
        lock = self._lock
        if not lock.acquire(False):
            self._acquire("set_input")
        try:
            self._set_input_unlocked(key, value, params)
        finally:
            lock.release()

    def _set_input_unlocked(self, key: Any, value: Any, params: Mapping[str, Any]) -> None:
        if type(key) is str and value is not None and not params:
            # NOTE: the per-inference call, set_input("data", x): after run() has streamed the
            # weights through the caches every lookup misses, so it takes the shortest way to
            # _copy_in (whose own fast path makes a host array for a CPU input one memcpy).
            index = self._input_index.get(key)
            if index is not None:
                self._copy_in(self._input_eids[index], value)
                return
        if isinstance(key, Mapping):
            params = {**key, **params}
            key = None
        if key is not None:
            if value is None:
                raise GraphError(f"set_input({key!r}) needs a value; got None")
            self._copy_in(self._resolve_input(key), value)
        for name, val in params.items():
            self._copy_in(self._resolve_input(name), val)

    def _copy_in(self, eid: int, value: Any) -> None:
        shape, dtype, key = self._input_layout[eid]
        if self._unset:
            self._unset.discard(eid)
        if (type(value) is np.ndarray and key[1] == _CPU and value.dtype == dtype
                and value.shape == shape):
            # NOTE: the common case (a host array for a CPU input) is one memcpy, no lookups.
            np.copyto(self.executor.arrays[key], value)
            self.executor.written(eid)  # kernels redo weights derived from it (Winograd)
            return
        self.executor.written(eid)
        dev = self.executor.entry_device[eid]
        dst = self.executor.arrays[(eid, dev)]
        src_backend, src = self._native(value, eid)
        copy_array(src_backend, src, check_device(dev), dst)

    def _native(self, value: Any, eid: int) -> tuple[Any, Any]:
        """(backend, native array) for a user value, checked against entry eid's shape and dtype."""
        if isinstance(value, np.ndarray):
            self._check_value(eid, tuple(value.shape), str(value.dtype))
            return get_backend("cpu"), value
        if isinstance(value, NDArray) or hasattr(value, "__dlpack__"):
            nd = value if isinstance(value, NDArray) else from_dlpack(value)
            self._check_value(eid, tuple(nd.shape), str(nd.dtype))
            return check_device(nd.device), nd.native
        try:
            host = np.asarray(value, dtype=self.graph.dtype(eid))
        except (TypeError, ValueError) as e:
            raise GraphError(f"input {self._input_name(eid)!r} (eid {eid}): cannot make a "
                             f"{self.graph.dtype(eid)} array of a {type(value).__name__}: "
                             f"{e}") from e
        self._check_value(eid, tuple(host.shape), str(host.dtype))
        return get_backend("cpu"), host

    def _check_value(self, eid: int, shape: tuple[int, ...], dtype: str) -> None:
        want_shape, want_dtype, _ = self._input_layout[eid]
        _check_layout(f"input {self._input_name(eid)!r}", eid, want_shape, want_dtype, shape,
                      dtype)

    def get_input(self, key: int | str, out: Any = None) -> Any:
        """The input's array on its device (a view: writing to it changes the input).

        Without out=, the input counts as set (the caller may fill the view).
        """
        eid = self._resolve_input(key)
        if out is None:
            self._unset.discard(eid)
        dev = self.executor.entry_device[eid]
        view = NDArray(self.executor.arrays[(eid, dev)], dev)
        if out is not None:
            return _copy_out(view, out)
        self.executor.escaped(eid)  # the caller may write through the view: no longer counted
        return view

    def set_input_zero_copy(self, key: int | str, value: Any) -> None:
        """Bind an array as the input itself (no copy); it must be on the input's device."""
        self._bind_zero_copy(self._resolve_input(key), value, f"input {key!r}")

    def set_output_zero_copy(self, index: int, value: Any) -> None:
        """Have run() write output index straight into the given array."""
        if not 0 <= index < len(self._output_eids):
            raise GraphError(f"output index {index} is out of range: the graph has "
                             f"{count_of(len(self._output_eids), 'output')}")
        self._bind_zero_copy(self._output_eids[index], value, f"output {index}")

    def _bind_zero_copy(self, eid: int, value: Any, what: str) -> None:
        g = self.graph
        dev = self.executor.entry_device[eid]
        if isinstance(value, NDArray):
            nd = value
        elif isinstance(value, np.ndarray):
            nd = NDArray(value, _CPU)
        elif hasattr(value, "__dlpack__"):
            nd = from_dlpack(value)
        else:
            raise GraphError(f"{what} (eid {eid}): zero copy needs an NDArray, a numpy array or "
                             f"a DLPack tensor, got {type(value).__name__}")
        if nd.device.device_type != dev.device_type or (
                nd.device.device_id != dev.device_id and dev.kind != "cpu"):
            raise DeviceError(f"{what} (eid {eid}) lives on {dev} but the array given is on "
                              f"{nd.device}; zero copy needs the same device")
        _check_layout(what, eid, tuple(g.shape(eid)), g.dtype(eid), tuple(nd.shape), nd.dtype)
        native = nd.native
        if isinstance(native, np.ndarray) and not native.flags.c_contiguous:
            raise GraphError(f"{what} (eid {eid}): zero copy needs a C-contiguous array")
        self._acquire("set_input_zero_copy")
        try:
            self.executor.rebind(eid, native)
            self._unset.discard(eid)
        finally:
            self._release()

    # ---- params --------------------------------------------------------------------------------

    def load_params(self, params: bytes | bytearray | str | os.PathLike | Mapping[str, Any],
                    source: str | None = None) -> None:
        """Set inputs from a TVM params blob, a params/.npz file, or a dict; shapes must match.

        source names a blob's or dict's origin in messages (e.g. the file it was read from).
        """
        from ..params import MappedArrays, load_param_arrays, load_params_file, read_params_into
        if isinstance(params, (bytes, bytearray, memoryview)):
            values: Mapping[str, Any] = load_param_arrays(bytes(params), source or "<params>")
            source = source or "params"
        elif isinstance(params, (str, os.PathLike)):
            values = load_params_file(params, views=True)  # read into place, below
            source = os.fspath(params)
        else:
            values = params
            source = source or "params"
        unknown = [name for name in values if name not in self._input_index]
        if unknown:
            verb = "is not an input" if len(unknown) == 1 else "are not inputs"
            message = (f"{source}: {count_of(len(unknown), 'param')} {verb} of the graph: "
                       f"{', '.join(map(repr, unknown[:10]))}; inputs are: {self._input_names()}")
            if self.strict:
                raise ParamsError(message)
            log.warning("%s (ignored)", message)
        g = self.graph
        direct: dict[str, tuple[int, np.ndarray]] = {}  # read into place after the checks
        for name, value in values.items():
            if name not in self._input_index:
                continue
            eid = self._resolve_input(name)
            shape = tuple(getattr(value, "shape", np.shape(value)))
            dtype = str(getattr(value, "dtype", np.asarray(value).dtype))
            if shape != tuple(g.shape(eid)) or np.dtype(dtype) != np.dtype(g.dtype(eid)):
                raise ParamsError(f"{source}: param {name!r} is {shape} {dtype} but the graph's "
                                  f"input {name!r} (eid {eid}) is {tuple(g.shape(eid))} "
                                  f"{g.dtype(eid)}")
            target = None
            if isinstance(values, MappedArrays) and name in values.offsets:
                target = self._read_target(eid, value)
            if target is not None:
                direct[name] = (eid, target)
                continue
            self._acquire("load_params")
            try:
                self._copy_in(eid, value)
            finally:
                self._release()
            self._param_names.add(name)
        if direct:
            assert isinstance(values, MappedArrays)
            self._acquire("load_params")
            try:
                read_params_into(values.path, values, {n: t for n, (_, t) in direct.items()})
                for name, (eid, _) in direct.items():
                    self._unset.discard(eid)
                    self.executor.written(eid)  # kernels redo weights derived from it
                    self._param_names.add(name)
            finally:
                self._release()

    def _read_target(self, eid: int, value: Any) -> np.ndarray | None:
        """The CPU array input eid lives in, when a params file's bytes can be read straight
        into it (params.read_params_into): a C-contiguous writable array of value's layout."""
        shape, dtype, key = self._input_layout[eid]
        dst = self.executor.arrays[key] if key[1] == _CPU else None
        if (type(dst) is not np.ndarray or type(value) is not np.ndarray
                or value.dtype != dtype or dst.dtype != dtype or dtype == np.bool_
                or dst.shape != shape or not dst.flags.c_contiguous or not dst.flags.writeable
                or sys.byteorder != "little"):
            return None
        return dst

    def share_params(self, other: "GraphModule", params_bytes: bytes) -> None:
        """Use other's param arrays (zero copy) for every name in params_bytes, as TVM does."""
        from ..params import load_param_arrays
        if not isinstance(other, GraphModule):
            raise GraphError(f"share_params needs a GraphModule to share with, got "
                             f"{type(other).__name__}")
        if not isinstance(params_bytes, (bytes, bytearray, memoryview)):
            raise ParamsError(f"share_params needs the params as bytes (save_param_dict's "
                              f"output), got {type(params_bytes).__name__}")
        for name in load_param_arrays(bytes(params_bytes)):
            self._share_input(other, name)

    def _share_input(self, other: "GraphModule", name: str) -> None:
        mine = self._resolve_input(name)
        theirs = other._resolve_input(name)
        dev = other.executor.entry_device[theirs]
        if dev != self.executor.entry_device[mine]:
            raise DeviceError(f"share_params: {name!r} lives on {dev} in the other module but "
                              f"on {self.executor.entry_device[mine]} here")
        self._adopt_input(name, other.executor.arrays[(theirs, dev)])

    def _adopt_input(self, name: str, array: Any) -> None:
        """Bind array (on the input's device, of its shape) as input name, zero copy: params
        shared between modules (share_params, clone, a symbolic graph's specialisations)."""
        mine = self._resolve_input(name)
        self._acquire("share_params")
        try:
            self.executor.rebind(mine, array)
            self.executor.pool.adopt(mine, array)
            self._unset.discard(mine)
            self._param_names.add(name)
        finally:
            self._release()

    # ---- running and outputs -------------------------------------------------------------------

    def run(self, **inputs: Any) -> None:
        """Set the given inputs, then run the graph once.

        Refused (GraphRuntimeError) while another thread is in run/set_input/get_output, and
        (GraphError naming them) while some input was never set, unless the module was created
        with allow_uninitialized=True.
        """
        lock = self._lock
        if not lock.acquire(False):
            self._acquire("run")
        try:
            if inputs:
                self._set_input_unlocked(None, None, inputs)
            self._run_unlocked()
        finally:
            lock.release()

    def _run_unlocked(self) -> None:
        if self._unset:
            self._refuse_unset()
        self.executor.run()

    def _refuse_unset(self) -> None:
        g = self.graph
        names = [g.nodes[g.entry_node(eid)[0]].name for eid in self._input_eids
                 if eid in self._unset]
        shown = ", ".join(names[:10]) + (f" ... ({len(names)} in all)" if len(names) > 10 else "")
        raise GraphError(f"{g.source}: {count_of(len(names), 'input')} never set: {shown}; "
                         "set them with set_input/load_params (or run(name=value)), or pass "
                         "allow_uninitialized=True to create() to run on whatever the memory "
                         "holds (benchmarks)")

    def get_output_index(self, name: str) -> int:
        """Index of the output called name (its declared name, e.g. an imported model's, or its
        head node's name); GraphError lists the outputs when there is none."""
        if not isinstance(name, str):
            raise GraphError(f"get_output_index needs an output name (a str), got "
                             f"{type(name).__name__} {name!r}")
        return self.graph.output_index(name)

    def get_output(self, index: int | str, out: Any = None) -> Any:
        """Output index (or name) as a new NDArray (the next run cannot overwrite it), or copied
        into out."""
        lock = self._lock
        if not lock.acquire(False):
            self._acquire("get_output")
        try:
            return self._get_output_unlocked(index, out)
        finally:
            lock.release()

    def _get_output_unlocked(self, key: int | str, out: Any) -> Any:
        eid = self._output_eids[self.graph.output_index(key)]
        dev = self.executor.entry_device[eid]
        src = self.executor.arrays[(eid, dev)]
        if out is not None:
            return _copy_out(NDArray(src, dev), out)
        if type(src) is np.ndarray:
            return NDArray(src.copy(), dev)  # a CPU output: one memcpy, no backend lookups
        backend = check_device(dev)
        fresh = backend.empty(dev.device_id, tuple(self.graph.shape(eid)),
                              np.dtype(self.graph.dtype(eid)))
        backend.copy(src, fresh)
        return NDArray(fresh, dev)


def _check_layout(what: str, eid: int, want_shape: tuple[int, ...], want_dtype: Any,
                  shape: tuple[int, ...], dtype: Any) -> None:
    """GraphError naming the input/output and entry unless shape and dtype are as the graph says."""
    if tuple(shape) != tuple(want_shape) or np.dtype(dtype) != np.dtype(want_dtype):
        raise GraphError(f"{what} (eid {eid}): expected {tuple(want_shape)} "
                         f"{np.dtype(want_dtype)}, got {tuple(shape)} {np.dtype(dtype)}")


def _copy_out(src: Any, out: Any) -> Any:
    if isinstance(out, NDArray):
        if tuple(out.shape) != tuple(src.shape) or np.dtype(out.dtype) != np.dtype(src.dtype):
            raise GraphError(f"out= is {tuple(out.shape)} {out.dtype} but the value is "
                             f"{tuple(src.shape)} {src.dtype}")
        copy_array(check_device(src.device), src.native, check_device(out.device), out.native)
        return out
    if isinstance(out, np.ndarray):
        if out.shape != tuple(src.shape) or out.dtype != np.dtype(src.dtype):
            raise GraphError(f"out= is {out.shape} {out.dtype} but the value is "
                             f"{tuple(src.shape)} {src.dtype}")
        check_device(src.device).to_host(src.native, out=out)
        return out
    raise GraphError(f"out= must be an NDArray or numpy array, got {type(out).__name__}")


def create(graph: GraphSource, libmod: Module | str | os.PathLike | None = None,
           ctxs: DeviceLike | Sequence[DeviceLike] = _CPU, *, strict: bool = False,
           memory_cap: int | Mapping[Any, int] | None = None,
           allow_uninitialized: bool = False, cache_size: int | None = None) -> GraphModule:
    """A GraphModule: graph (JSON text, path, dict or Graph), a lib, devices (ctxs[0] primary).

    A graph with symbolic dims (docs/symbolic_shapes.md) gives a SymbolicGraphModule with the
    same methods, specialised per input-shape combination; cache_size bounds how many it keeps.

    libmod may be a Module, a lib file path, or None for the standard op library.
    allow_uninitialized: let run() go with inputs never set (benchmarks); refused by default.
    One module runs one inference at a time: see GraphModule for threads (run_with, clone).
    """
    from ..graph.model import Graph
    from ..lib import load_module, standard_module
    g = graph if isinstance(graph, Graph) else Graph.from_json(graph)
    if libmod is None:
        lib = standard_module()
    elif isinstance(libmod, Module):
        lib = libmod
    else:
        lib = load_module(libmod)
    if g.is_symbolic:
        from .segments import find_cuts
        cuts = find_cuts(g, lib)
        if cuts:  # data-dependent sizes: runs in segments (runtime/segmented_module.py)
            from .segmented_module import SegmentedGraphModule
            return SegmentedGraphModule(  # type: ignore[return-value]
                g, lib, _to_device_list(ctxs), cuts, strict=strict, memory_cap=memory_cap,
                allow_uninitialized=allow_uninitialized, cache_size=cache_size)
        from .symbolic_module import DEFAULT_CACHE_SIZE, SymbolicGraphModule
        return SymbolicGraphModule(  # type: ignore[return-value]
            g, lib, _to_device_list(ctxs), strict=strict, memory_cap=memory_cap,
            allow_uninitialized=allow_uninitialized,
            cache_size=cache_size or DEFAULT_CACHE_SIZE)
    return GraphModule(g, lib, _to_device_list(ctxs), strict=strict, memory_cap=memory_cap,
                       allow_uninitialized=allow_uninitialized)
