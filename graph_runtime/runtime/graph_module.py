"""GraphModule: create()'s module for a static graph, with tvm.contrib.graph_executor's names."""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import settings
from .._text import count_of
from ..backends import check_device, copy_array, get_backend
from ..device import Device, DeviceLike, cpu
from ..device import device as parse_device
from ..errors import DeviceError, GraphError, ParamsError
from ..graph.model import Graph, GraphSource
from ..lib.kernels.derived import watch
from ..lib.library import Module
from ..nd import NDArray, from_dlpack
from .executor import Executor, NodeTime, ShapeState
from .measure import add_bytes
from .module_base import ModuleBase, copy_out
from .steps import KernelCache
from .storage import Scratch

_CPU = cpu(0)  # host arrays live here; the one CPU device
log = logging.getLogger("graph_runtime")


def _to_device_list(ctxs: DeviceLike | Sequence[DeviceLike]) -> list[Device]:
    if isinstance(ctxs, (list, tuple)):
        devices = [parse_device(c) for c in ctxs]
    else:
        devices = [parse_device(ctxs)]  # type: ignore[arg-type]
    if not devices:
        raise DeviceError("ctxs is empty; give at least one device, e.g. graph_runtime.cpu()")
    return devices


class GraphModule(ModuleBase):
    """A static graph bound to devices and kernels, ready to run (see graph_runtime.create, and
    ModuleBase for threads: run_with, clone).

    Inputs: run() refuses inputs that were never set (create(..., allow_uninitialized=True) opts
    out, for benchmarks whose values do not matter).
    """

    executor: Executor
    # (shape, dtype, home key) of each input entry, for set_input's fast path
    _input_layout: dict[int, tuple[tuple[int, ...], np.dtype, tuple[int, Device]]]

    def __init__(self, graph: Graph, lib: Module, ctxs: Sequence[Device], *, strict: bool = False,
                 memory_cap: int | Mapping[Any, int] | None = None,
                 allow_uninitialized: bool = False, kernels: KernelCache | None = None,
                 scratch: Scratch | None = None, base: GraphModule | None = None,
                 executor: Executor | None = None) -> None:
        super().__init__(graph, lib, ctxs, strict=strict, memory_cap=memory_cap,
                         allow_uninitialized=allow_uninitialized)
        # executor: made already (Executor.derive: another specialisation's, over graph)
        if executor is None:
            with settings.held():  # read once for the whole build
                executor = Executor(graph, lib, ctxs, strict=strict, memory_cap=memory_cap,
                                    kernels=kernels, scratch=scratch,
                                    base=None if base is None else base.executor)
        self.executor = executor
        self.ctxs = self.executor.ctxs
        ex = self.executor
        # a derived specialisation (a decode step) keeps base's layout of inputs whose shape
        # did not move (its params: some 45 of a decoder's 56 inputs)
        kept: dict[int, tuple[tuple[int, ...], np.dtype, tuple[int, Device]]] = {}
        shapes = before = graph.attrs["shape"][1]
        if base is not None and executor is not None:
            kept, before = base._input_layout, base.graph.attrs["shape"][1]
        self._input_layout = {
            eid: kept[eid] if eid in kept and shapes[eid] == before[eid] else (
                tuple(graph.shape(eid)), np.dtype(graph.dtype(eid)), (eid, ex.entry_device[eid]))
            for eid in self._input_eids}
        self._unset: set[int] = set() if allow_uninitialized else set(self._input_eids)
        self._param_names: set[str] = set()

    def _retarget(self, graph: Graph) -> bool:
        """This module over graph, another specialisation of its symbolic graph, its executor
        made over it in place (Executor.retarget); False, nothing changed, where it cannot."""
        if not self.executor.retarget(graph, self.lib):
            return False
        self._follow(graph)
        return True

    def _restore(self, state: ShapeState) -> bool:
        """This module back at a shape its executor was made over before (Executor.restore)."""
        if not self.executor.restore(state):
            return False
        self._follow(state.graph)
        return True

    def _follow(self, graph: Graph) -> None:
        """graph made this module's (its executor's already): the inputs' layout follows."""
        shapes, before = graph.attrs["shape"][1], self.graph.attrs["shape"][1]
        for eid, (shape, dtype, key) in self._input_layout.items():
            if shapes[eid] != before[eid]:
                self._input_layout[eid] = (tuple(shapes[eid]), dtype, key)
        self.graph = graph

    def _clone(self) -> GraphModule:
        other = GraphModule(self.graph, self.lib, self.ctxs, strict=self.strict,
                            memory_cap=self.memory_cap,
                            allow_uninitialized=self.allow_uninitialized)
        for name in self._param_names:
            other._share_input(self, name)
        return other

    # ---- inputs --------------------------------------------------------------------------------

    def _resolve_input(self, key: int | str) -> int:
        return self._input_eids[self._input_position(key)]

    def _input_name(self, eid: int) -> str:
        return self.graph.nodes[self.graph.arg_nodes[self._input_eids.index(eid)]].name

    def _set_one(self, index: int, value: Any) -> None:
        self._copy_in(self._input_eids[index], value)

    def _set_inputs(self, values: Mapping[str, Any]) -> None:
        """set_input for each (name, value) of inputs this graph has, holding the module once
        (a symbolic module hands a decode step's eleven inputs to its specialisation so)."""
        self._acquire("set_input")
        try:
            index = self._input_index
            for name, value in values.items():
                self._set_one(index[name], value)
        finally:
            self._release()

    def _output_held(self, index: int, out: Any) -> Any:
        """get_output(index, out) of a valid index, holding the module (the symbolic module's
        outputs: its index was checked there)."""
        self._acquire("get_output")
        try:
            return self._output_at(index, out)
        finally:
            self._release()

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

    def _get_input_at(self, index: int, out: Any) -> Any:
        """The input's array on its device (a view: writing to it changes the input).

        Without out=, the input counts as set (the caller may fill the view).
        """
        eid = self._input_eids[index]
        if out is None:
            self._unset.discard(eid)
        dev = self.executor.entry_device[eid]
        view = NDArray(self.executor.arrays[(eid, dev)], dev)
        if out is not None:
            return copy_out(view, out)
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

    def _load_values(self, values: Mapping[str, Any], source: str) -> None:
        from ..params import MappedArrays, read_params_into
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
            self._copy_in(eid, value)
            self._param_names.add(name)
        if isinstance(values, MappedArrays) and direct:
            read_params_into(values.path, values, {n: t for n, (_, t) in direct.items()})
            for name, (eid, _) in direct.items():
                self._unset.discard(eid)
                self.executor.written(eid)  # kernels redo weights derived from it
                self._param_names.add(name)

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

    def _share_input(self, other: GraphModule, name: str) -> None:
        mine = self._resolve_input(name)
        theirs = other._resolve_input(name)
        dev = other.executor.entry_device[theirs]
        if dev != self.executor.entry_device[mine]:
            raise DeviceError(f"share_params: {name!r} lives on {dev} in the other module but "
                              f"on {self.executor.entry_device[mine]} here")
        self._bind_param(name, other.executor.arrays[(theirs, dev)])

    def _adopt_input(self, name: str, array: Any) -> None:
        """Bind array (on the input's device, of its shape) as input name, zero copy: params
        shared with a symbolic graph's specialisations. A frozen array (never written: a new
        load makes a new one, adopted again) counts as one write for the kernels deriving data
        from it (packed weights) instead of being derived again every run."""
        self._adopt_inputs({name: array})

    def _adopt_inputs(self, arrays: Mapping[str, Any]) -> None:
        """_adopt_input for each (name, array), holding the module once (a new specialisation
        adopts every param: a decoder's 45)."""
        self._acquire("share_params")
        try:
            bound = self.executor.arrays
            for name, array in arrays.items():
                eid = self._resolve_input(name)
                if bound[(eid, self.executor.entry_device[eid])] is array:
                    # bound already (Executor.derive kept it from another specialisation), its
                    # counter counted there: adopted again, its kernels would derive again
                    self._unset.discard(eid)
                    self._param_names.add(name)
                    continue
                self._bind_param(name, array)
                version = self.executor.versions.get(eid)
                if version is not None and watch(array, version):
                    version.set_volatile(False)
                    version.count()
        finally:
            self._release()

    def _bind_param(self, name: str, array: Any) -> None:
        mine = self._resolve_input(name)
        self.executor.rebind(mine, array)
        self.executor.pool.adopt(mine, array)
        self._unset.discard(mine)
        self._param_names.add(name)

    # ---- running and outputs -------------------------------------------------------------------

    def _run_unlocked(self) -> None:
        if self._unset:
            self._refuse_unset()
        if self._threads_moved():
            self._follow_threads()
        self.executor.run()

    def _follow_threads(self) -> None:
        """oneDNN's thread mode changed since the kernels were made (a neighbour came or went:
        onednn/policy.py's recheck): make the executor again, its kernels in the new mode.

        Every input (params included) and every output bound zero copy keeps its array, so a
        view handed out by get_input still writes the input; an input's write counter stays
        volatile where it was (a view escaped), else counts as before."""
        old = self.executor
        new = Executor(self.graph, self.lib, self.ctxs, strict=self.strict,
                       memory_cap=self.memory_cap)
        for eid in [*self._input_eids, *self._output_eids]:
            array = old.arrays[(eid, old.entry_device[eid])]
            if eid not in self._input_eids and array is old.pool.views[eid]:
                continue  # an output in the pool: the next run writes the new one
            new.rebind(eid, array)
            new.pool.adopt(eid, array)
            version = new.versions.get(eid)
            if version is not None:
                version.set_volatile(eid in old.escaped_entries)
        new.escaped_entries = set(old.escaped_entries)
        self.executor = new
        log.info("%s: oneDNN's thread mode changed; the executor was made again",
                 self.graph.source)

    def _refuse_unset(self) -> None:
        g = self.graph
        names = [g.nodes[g.entry_node(eid)[0]].name for eid in self._input_eids
                 if eid in self._unset]
        shown = ", ".join(names[:10]) + (f" ... ({len(names)} in all)" if len(names) > 10 else "")
        raise GraphError(f"{g.source}: {count_of(len(names), 'input')} never set: {shown}; "
                         "set them with set_input/load_params (or run(name=value)), or pass "
                         "allow_uninitialized=True to create() to run on whatever the memory "
                         "holds (benchmarks)")

    def _host_outputs(self) -> list[np.ndarray]:
        arrays, devices = self.executor.arrays, self.executor.entry_device
        found = []
        for index, eid in enumerate(self._output_eids):
            src = arrays[(eid, devices[eid])]
            found.append(src.copy() if type(src) is np.ndarray
                         else self._output_at(index, None).numpy())
        return found

    def _output_at(self, index: int, out: Any) -> Any:
        eid = self._output_eids[index]
        dev = self.executor.entry_device[eid]
        src = self.executor.arrays[(eid, dev)]
        if out is not None:
            return copy_out(NDArray(src, dev), out)
        if type(src) is np.ndarray:
            return NDArray(src.copy(), dev)  # a CPU output: one memcpy, no backend lookups
        backend = check_device(dev)
        fresh = backend.empty(dev.device_id, tuple(self.graph.shape(eid)),
                              np.dtype(self.graph.dtype(eid)))
        backend.copy(src, fresh)
        return NDArray(fresh, dev)

    # ---- diagnostics ---------------------------------------------------------------------------

    def _bench_target(self) -> tuple[Callable[[], None], Callable[[], None]]:
        return self.executor.run, self.executor.sync

    def _profile_unlocked(self, repeat: int, progress: Callable[[int], None] | None
                          ) -> list[NodeTime]:
        return self.executor.profile(repeat, progress)

    def _capture(self, names: set[str] | None) -> dict[str, list[np.ndarray]]:
        g = self.graph
        captured: dict[str, list[np.ndarray]] = {}

        def grab(step: Any) -> None:
            if step.nid < 0:
                return
            name = g.nodes[step.nid].name
            if names is not None and name not in names:
                return
            dev = self.executor.node_device[step.nid]
            backend = check_device(dev)
            captured[name] = [backend.to_host(self.executor.arrays[(e, dev)])
                              for e in g.node_entries(step.nid)]

        if self._unset:
            self._refuse_unset()
        self.executor.run_steps(each=grab)
        return captured

    def _report_executor(self, what: str) -> Executor:
        return self.executor

    def _static_modules(self, what: str) -> list[GraphModule]:
        return [self]

    def held_bytes(self) -> dict[Device, int]:
        """What this module holds per device: pool, workspace, control-flow bodies (as
        memory_report().held(), without the columns it does not count)."""
        plan = self.executor.plan
        return add_bytes([plan.bytes_per_device(), plan.workspace_bytes,
                          self.executor.bodies_bytes()])


def _check_layout(what: str, eid: int, want_shape: tuple[int, ...], want_dtype: Any,
                  shape: tuple[int, ...], dtype: Any) -> None:
    """GraphError naming the input/output and entry unless shape and dtype are as the graph says."""
    if tuple(shape) != tuple(want_shape) or np.dtype(dtype) != np.dtype(want_dtype):
        raise GraphError(f"{what} (eid {eid}): expected {tuple(want_shape)} "
                         f"{np.dtype(want_dtype)}, got {tuple(shape)} {np.dtype(dtype)}")


def create(graph: GraphSource, libmod: Module | str | os.PathLike | None = None,
           ctxs: DeviceLike | Sequence[DeviceLike] = _CPU, *, strict: bool = False,
           memory_cap: int | Mapping[Any, int] | None = None,
           allow_uninitialized: bool = False, cache_size: int | None = None) -> ModuleBase:
    """A module: graph (JSON text, path, dict or Graph), a lib, devices (ctxs[0] primary).

    A static graph gives a GraphModule. A graph with symbolic dims (docs/symbolic_shapes.md)
    gives a SymbolicGraphModule, specialised per input-shape combination (cache_size bounds how
    many it keeps), and one with data-dependent sizes a SegmentedGraphModule; all three have
    ModuleBase's methods.

    libmod may be a Module, a lib file path, or None for the standard op library.
    allow_uninitialized: let run() go with inputs never set (benchmarks); refused by default.
    One module runs one inference at a time: see ModuleBase for threads (run_with, clone).
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
            return SegmentedGraphModule(
                g, lib, _to_device_list(ctxs), cuts, strict=strict, memory_cap=memory_cap,
                allow_uninitialized=allow_uninitialized, cache_size=cache_size)
        from .symbolic_module import DEFAULT_CACHE_SIZE, SymbolicGraphModule
        return SymbolicGraphModule(
            g, lib, _to_device_list(ctxs), strict=strict, memory_cap=memory_cap,
            allow_uninitialized=allow_uninitialized,
            cache_size=cache_size or DEFAULT_CACHE_SIZE)
    return GraphModule(g, lib, _to_device_list(ctxs), strict=strict, memory_cap=memory_cap,
                       allow_uninitialized=allow_uninitialized)
