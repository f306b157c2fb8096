"""ModuleBase: what every module create() returns shares (naming, argument forms, threads)."""
from __future__ import annotations

import logging
import os
import threading
from abc import abstractmethod
from typing import Any, Mapping, Sequence, TypeVar

import numpy as np

from .._text import count_of
from ..backends import check_device, copy_array
from ..device import Device
from ..errors import GraphError, GraphRuntimeError, ParamsError
from ..graph.model import Graph
from ..lib.kernels.threads import threads_generation
from ..lib.library import Module
from ..nd import NDArray
from .diagnostics import Diagnostics

log = logging.getLogger("graph_runtime")
_Module = TypeVar("_Module", bound="ModuleBase")


class ModuleBase(Diagnostics):
    """A graph bound to devices and kernels, ready to run, with tvm.contrib.graph_executor's
    method names: a static GraphModule, a SymbolicGraphModule (specialised per input shapes) or
    a SegmentedGraphModule (cut at data-dependent nodes), all created by graph_runtime.create.

    This class holds the methods they share, written once over a few primitives each provides
    (_set_one, _get_input_at, _output_at, _run_unlocked, _load_values, _share_input, _clone and
    the Diagnostics ones).

    Threads: a module holds one set of inputs, intermediates and outputs, so it runs one inference
    at a time. run(), set_input() and get_output() called from a second thread while another call
    is under way raise GraphRuntimeError instead of mixing two inferences. run_with(**inputs) sets
    the inputs, runs and returns host copies of the outputs as one atomic call (callers wait their
    turn), safe from many threads. For parallel inferences give each thread its own module with
    clone(): it shares this module's params (one copy of the weights) and has its own buffers.
    """

    # share_params' peer: what the message says the other module must be
    _share_peer = "to share with"

    def __init__(self, graph: Graph, lib: Module, ctxs: Sequence[Device], *, strict: bool,
                 memory_cap: int | Mapping[Any, int] | None, allow_uninitialized: bool) -> None:
        self.graph = graph
        self.lib = lib
        self.ctxs = list(ctxs)
        self.strict = strict
        self.memory_cap = memory_cap
        self.allow_uninitialized = allow_uninitialized
        inputs = graph.input_entries
        self._input_index = {name: i for i, name in enumerate(inputs)}
        self._input_eids = list(inputs.values())
        self._output_eids = list(graph.output_entries)
        # NOTE: a non-blocking acquire is the cheapest owner check on the hot calls;
        # run_with() blocks on it instead.
        self._lock = threading.Lock()
        self._threads_made_in = threads_generation()  # oneDNN's thread mode of its kernels

    def _threads_kept(self) -> bool:
        """Whether oneDNN's thread mode is still the one this module's kernels were made in;
        unlike _threads_moved, asking changes nothing (a shortcut that must not take a move
        for the way that follows it)."""
        return threads_generation() == self._threads_made_in

    def _threads_moved(self) -> bool:
        """Whether oneDNN's thread mode changed since this module's kernels were made (a
        neighbour came or went: onednn/policy.py's recheck); True once per change, the module
        then making its kernels again."""
        made_in = threads_generation()
        if made_in == self._threads_made_in:
            return False
        self._threads_made_in = made_in
        return True

    # ---- what each module kind provides --------------------------------------------------------

    @abstractmethod
    def _set_one(self, index: int, value: Any) -> None:
        """Set input index (a valid one) to value; called holding the module."""

    @abstractmethod
    def _get_input_at(self, index: int, out: Any) -> Any:
        """get_input() of input index (a valid one)."""

    @abstractmethod
    def _output_at(self, index: int, out: Any) -> Any:
        """get_output() of output index (a valid one); called holding the module."""

    @abstractmethod
    def _run_unlocked(self) -> None:
        """One run on the inputs set; called holding the module."""

    @abstractmethod
    def _load_values(self, values: Mapping[str, Any], source: str) -> None:
        """Load params values (names that are not inputs skipped: reported already), source
        naming their origin; called holding the module."""

    @abstractmethod
    def _share_input(self: _Module, other: _Module, name: str) -> None:
        """Bind other's array of param name here, zero copy; called holding the module."""

    @abstractmethod
    def _clone(self: _Module) -> _Module:
        """clone()'s new module; called holding the module."""

    # ---- threads -------------------------------------------------------------------------------

    def _acquire(self, what: str) -> None:
        if not self._lock.acquire(blocking=False):
            raise GraphRuntimeError(
                f"{type(self).__name__}.{what}() called from thread "
                f"{threading.current_thread().name!r} while another thread is in "
                "run/set_input/get_output on the same module; a module runs one inference at a "
                "time. Use run_with(**inputs) (atomic, callers wait their turn) or one module "
                "per thread (module.clone())")

    def _release(self) -> None:
        self._lock.release()

    def run_with(self, **inputs: Any) -> list[np.ndarray]:
        """Set inputs, run once and return every output as a host numpy array, atomically.

        Safe to call from many threads: callers wait for each other, so each gets the outputs of
        its own inputs. Use clone() to run inferences in parallel instead of in turn.
        """
        self._lock.acquire()
        try:
            self._run_with(inputs)
            return self._host_outputs()
        finally:
            self._lock.release()

    def _host_outputs(self) -> list[np.ndarray]:
        """Every output as a host array of its own, for run_with; called holding the module. A
        module that knows an output is a host array copies it once there (not into an NDArray,
        then to the host), all of them in one call (a decode step's nine)."""
        return [self._output_at(index, None).numpy() for index in range(len(self._output_eids))]

    def clone(self: _Module) -> _Module:
        """A new module on the same graph, lib and devices with its own inputs, intermediates
        and outputs, sharing this module's params (loaded with load_params/share_params) zero
        copy: one copy of the weights for many threads. Treat the shared params as read-only."""
        self._acquire("clone")
        try:
            return self._clone()
        finally:
            self._release()

    # ---- names ---------------------------------------------------------------------------------

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

    def get_output_index(self, name: str) -> int:
        """Index of the output called name (its declared name, e.g. an imported model's, or its
        head node's name); GraphError lists the outputs when there is none."""
        if not isinstance(name, str):
            raise GraphError(f"get_output_index needs an output name (a str), got "
                             f"{type(name).__name__} {name!r}")
        return self.graph.output_index(name)

    def get_input_info(self) -> tuple[dict[str, tuple[Any, ...]], dict[str, str]]:
        """(shape by input name, dtype by input name), as TVM's get_input_info; a symbolic dim
        is its name."""
        g = self.graph
        return ({name: tuple(g.shape(eid)) for name, eid in zip(self._input_index,
                                                                 self._input_eids)},
                {name: g.dtype(eid) for name, eid in zip(self._input_index, self._input_eids)})

    def get_output_info(self) -> tuple[list[tuple[Any, ...]], list[str]]:
        """(shape of each output, dtype of each output); a symbolic dim is its name."""
        g = self.graph
        return ([tuple(g.shape(e)) for e in self._output_eids],
                [g.dtype(e) for e in self._output_eids])

    def _input_names(self) -> str:
        names = list(self._input_index)
        return ", ".join(names[:20]) + (f" ... ({len(names)} in all)" if len(names) > 20 else "")

    def _input_position(self, key: int | str) -> int:
        """The index of input key (a name or an index); GraphError when there is none."""
        if isinstance(key, str):
            return self.get_input_index(key)
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not 0 <= key < len(self._input_eids):
                raise GraphError(f"input index {key} is out of range: the graph has "
                                 f"{count_of(len(self._input_eids), 'input')} "
                                 f"({self._input_names()})")
            return int(key)
        raise GraphError(f"input key must be a name or an index, got {type(key).__name__}")

    # ---- inputs --------------------------------------------------------------------------------

    def set_input(self, key: int | str | Mapping[str, Any] | None = None, value: Any = None,
                  **params: Any) -> None:
        """Copy values into inputs by name or index (set_input(key, value), a mapping, or
        name=value): numpy arrays, NDArrays or DLPack tensors."""
        lock = self._lock
        if not lock.acquire(False):
            self._acquire("set_input")
        try:
            self._set_input_unlocked(key, value, params)
        finally:
            lock.release()

    def _set_input_unlocked(self, key: Any, value: Any, params: Mapping[str, Any]) -> None:
        if type(key) is str and value is not None and not params:
            # NOTE: the per-inference call, set_input("data", x), takes the shortest way.
            index = self._input_index.get(key)
            if index is not None:
                self._set_one(index, value)
                return
        if isinstance(key, Mapping):
            params = {**key, **params}
            key = None
        if key is not None:
            if value is None:
                raise GraphError(f"set_input({key!r}) needs a value; got None")
            self._set_one(self._input_position(key), value)
        for name, val in params.items():
            self._set_one(self._input_position(name), val)

    def get_input(self, key: int | str, out: Any = None) -> Any:
        """The input's value: on its device as a view (writing to it changes the input), or
        copied into out."""
        return self._get_input_at(self._input_position(key), out)

    # ---- params --------------------------------------------------------------------------------

    def load_params(self, params: bytes | bytearray | str | os.PathLike | Mapping[str, Any],
                    source: str | None = None) -> None:
        """Set inputs from a TVM params blob, a params/.npz file, or a dict; shapes must match.

        source names a blob's or dict's origin in messages (e.g. the file it was read from).
        A name that is no input is refused with strict=True, else logged and skipped.
        """
        from ..params import load_param_arrays, load_params_file
        if isinstance(params, (bytes, bytearray, memoryview)):
            values: Mapping[str, Any] = load_param_arrays(bytes(params), source or "<params>")
            source = source or "params"
        elif isinstance(params, (str, os.PathLike)):
            values = load_params_file(params, views=True)  # a static module reads into place
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
        self._acquire("load_params")
        try:
            self._load_values(values, source)
        finally:
            self._release()

    def share_params(self: _Module, other: _Module, params_bytes: bytes) -> None:
        """Use other's param arrays (zero copy) for every name in params_bytes, as TVM does."""
        from ..params import load_param_arrays
        if not isinstance(other, type(self)) or not self._can_share_with(other):
            raise GraphError(f"share_params needs a {type(self).__name__} {self._share_peer}, "
                             f"got {type(other).__name__}")
        if not isinstance(params_bytes, (bytes, bytearray, memoryview)):
            raise ParamsError(f"share_params needs the params as bytes (save_param_dict's "
                              f"output), got {type(params_bytes).__name__}")
        names = list(load_param_arrays(bytes(params_bytes)))
        self._acquire("share_params")
        try:
            for name in names:
                self._share_input(other, name)
        finally:
            self._release()

    def _can_share_with(self: _Module, other: _Module) -> bool:
        return True

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
            self._run_with(inputs)
        finally:
            lock.release()

    def _run_with(self, inputs: Mapping[str, Any]) -> None:
        """run(**inputs) holding the module: set them, run once (a module may read the
        caller's arrays until it returns, copying them only where it runs)."""
        if inputs:
            self._set_input_unlocked(None, None, inputs)
        self._run_unlocked()

    def get_output(self, index: int | str, out: Any = None) -> Any:
        """Output index (or name) of the last run as a new NDArray (the next run cannot
        overwrite it), or copied into out."""
        lock = self._lock
        if not lock.acquire(False):
            self._acquire("get_output")
        try:
            return self._output_at(self.graph.output_index(index), out)
        finally:
            lock.release()

    def _get_output_unlocked(self, key: int | str, out: Any) -> Any:
        return self._output_at(self.graph.output_index(key), out)


def copy_out(src: NDArray, out: Any) -> Any:
    """Copy src into out (an NDArray or a numpy array of its shape and dtype); out."""
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
