"""The controller side: Session (every method of TVM's) and DRef, DPackedFunc, DModule."""
from __future__ import annotations

import abc
import atexit
import itertools
import os
import time
import weakref
from typing import Any, Sequence

import numpy as np

from ..device import Device
from ..errors import DiscoError
from ..graph.model import GraphSource
from .ccl import check_reduce_op
from .protocol import Command, DiscoAction, check_arg, host_array

A = DiscoAction
_CALL = int(A.CALL_PACKED)
# Workers give up on a stuck collective sooner than the controller gives up on them, so the
# controller reports the collective's error instead of a bare timeout.
DATA_PLANE_SHARE = 0.8
CCLS = ("cpu", "mpi", "nccl")
_LIVE: "weakref.WeakSet[Session]" = weakref.WeakSet()
_PLAIN = (int, float, str, bool, type(None))


class DRef:
    """An object that exists on all workers under one register id (TVM's disco DRef)."""

    __slots__ = ("reg_id", "session", "__weakref__")

    def __init__(self, reg_id: int, session: Session) -> None:
        self.reg_id = reg_id
        self.session = session

    def __del__(self) -> None:
        try:
            session = self.session
        except AttributeError:  # __init__ never ran
            return
        if session is not None and not session._closed:
            session._pending_frees.append(self.reg_id)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(register {self.reg_id})"

    def debug_get_from_remote(self, worker_id: int, timeout: float | None = None) -> Any:
        """The register's value on one worker (a numpy copy for tensors); for debugging."""
        return self.session.debug_get_from_remote(self.reg_id, worker_id, timeout)

    def debug_copy_from(self, worker_id: int, value: Any) -> None:
        """Set the register on one worker to a copy of value; for debugging."""
        self.session.debug_set_register(self.reg_id, value, worker_id)


class DPackedFunc(DRef):
    """A function on every worker; calling it runs it on all of them (returns a DRef)."""

    __slots__ = ()

    def __call__(self, *args: Any) -> DRef:
        return self.session.call_packed(self, *args)


class DModule(DRef):
    """A kernel library loaded on every worker; mod[name] is a DPackedFunc."""

    __slots__ = ()

    def __getitem__(self, name: str) -> DPackedFunc:
        get = self.session._method("runtime.disco.module_get_function")
        return self.session._as(DPackedFunc, get(self, name))


class DGraphModule(DRef):
    """A GraphModule on every worker; its methods take and return DRefs."""

    __slots__ = ()

    def set_input(self, key: str | int, value: DRef) -> None:
        self.session._method("runtime.disco.graph_module_set_input")(self, key, value)

    def load_params(self, params_path: str) -> None:
        self.session._method("runtime.disco.graph_module_load_params")(self, str(params_path))

    def run(self) -> None:
        self.session._method("runtime.disco.graph_module_run")(self)

    def get_output(self, index: int | str) -> DRef:
        """Output index (or name: a declared one, or its head node's) on every worker (NDArray
        registers, usable by copy_from_worker_0)."""
        return self.session._method("runtime.disco.graph_module_get_output")(self, index)


class Session(abc.ABC):
    """A Disco session: a controller broadcasting commands to workers (TVM's Session,
    python/tvm/runtime/disco/session.py).

    Transports implement _send, _get_reply, _check_alive and _terminate; one that runs
    worker-0 in the caller's thread sets _inline0, so sync_worker_0 needs no round trip.
    """

    def __init__(self, num_workers: int, num_groups: int = 1, timeout: float = 120.0) -> None:
        if not isinstance(num_workers, int) or num_workers < 1:
            raise DiscoError(f"num_workers must be a positive int, got {num_workers!r}")
        if not isinstance(num_groups, int) or num_groups < 1 or num_workers % num_groups:
            raise DiscoError(f"num_groups must be a positive int dividing num_workers "
                             f"({num_workers}), got {num_groups!r}")
        self._num_workers = num_workers
        self.num_groups = num_groups
        self.timeout = float(timeout)
        self._next_reg = 1  # register 0 is reserved
        self._free_regs: list[int] = []
        self._pending_frees: list[int] = []
        self._tokens = itertools.count(1)
        self._errors: list[str] = []
        self._stash: dict[int, tuple] = {}  # replies drained early, by token
        self._methods: dict[str, DPackedFunc] = {}
        self._closed = False
        self._broken: str | None = None
        self._inline0 = False  # worker-0 runs in the caller's thread (transports may set it)
        _LIVE.add(self)

    # ---- transport hooks -----------------------------------------------------------------------

    @abc.abstractmethod
    def _send(self, cmd: Command, worker_id: int | None) -> None:
        """Queue cmd to one worker, or to all when worker_id is None."""

    @abc.abstractmethod
    def _get_reply(self, worker_id: int, timeout: float) -> tuple | None:
        """The next reply from a worker, or None when none came within timeout."""

    def _check_alive(self) -> None:
        """Raise DiscoError naming a worker that died."""

    def _ready_workers(self) -> Sequence[int]:
        """Workers that may have a reply waiting (all of them unless a transport knows better)."""
        return range(self._num_workers)

    def _terminate(self) -> None:
        """Release workers after SHUTDOWN (join threads, reap processes, free channels)."""

    # ---- registers and commands ----------------------------------------------------------------

    @property
    def num_workers(self) -> int:
        return self._num_workers

    def _check_usable(self) -> None:
        if self._closed:
            raise DiscoError(f"{type(self).__name__} is shut down; create a new session")
        if self._broken is not None:
            raise DiscoError(f"{type(self).__name__} is broken: {self._broken}; call "
                             "shutdown() and create a new session")

    def _alloc(self) -> int:
        if self._free_regs:
            return self._free_regs.pop()
        reg = self._next_reg
        self._next_reg += 1
        return reg

    def _take_frees(self) -> tuple[int, ...]:
        pending = self._pending_frees
        if not pending:
            return ()
        frees = tuple(pending)
        pending.clear()
        # NOTE: ids may be reused at once: workers kill `frees` before running the command.
        self._free_regs.extend(frees)
        return frees

    def _broadcast(self, action: DiscoAction, *payload: Any, reg: bool = True) -> int:
        self._check_usable()
        frees = self._take_frees()
        reg_id = self._alloc() if reg else 0
        self._send((int(action), frees, reg_id) + payload, None)
        return reg_id

    def _flush_frees(self) -> None:
        # frees normally ride along; a burst of them gets a KILL_REG of its own
        if len(self._pending_frees) >= 64:
            self._send((int(A.KILL_REG), self._take_frees(), 0), None)

    def _check_worker(self, worker_id: int) -> int:
        if isinstance(worker_id, bool) or not isinstance(worker_id, (int, np.integer)) or \
                not 0 <= worker_id < self._num_workers:
            raise DiscoError(f"bad worker id {worker_id!r}: this session has {self._num_workers} "
                             f"worker(s), ids 0..{self._num_workers - 1}")
        return int(worker_id)

    def _check_reg(self, reg_id: int) -> int:
        live = (isinstance(reg_id, (int, np.integer)) and 0 < reg_id < self._next_reg
                and reg_id not in self._free_regs and reg_id not in self._pending_frees)
        if not live:
            raise DiscoError(f"bad register id {reg_id!r}: registers in use are 1.."
                             f"{self._next_reg - 1} minus freed ones (register 0 is reserved)")
        return int(reg_id)

    def _pack_args(self, args: tuple) -> tuple[tuple, tuple[int, ...]]:
        """call_packed arguments as they travel, and the positions that hold register ids."""
        packed = list(args)
        regpos: tuple[int, ...] = ()
        for i, value in enumerate(args):
            if type(value) in _PLAIN:
                continue
            if isinstance(value, DRef):
                if value.session is not self:
                    raise DiscoError(f"call_packed argument {i} ({value!r}) belongs to another "
                                     "session")
                packed[i] = value.reg_id
                regpos += (i,)
            else:
                packed[i] = check_arg(value, i)
        return tuple(packed), regpos

    def _as(self, cls: type, ref: DRef) -> Any:
        """Re-type a fresh DRef (e.g. DRef -> DModule) without freeing its register."""
        out = cls(ref.reg_id, self)
        ref.session = None  # type: ignore[assignment]
        return out

    def _method(self, name: str) -> DPackedFunc:
        func = self._methods.get(name)
        if func is None:
            func = self.get_global_func(name)
            self._methods[name] = func
        return func

    # ---- blocking: replies, errors, timeouts ---------------------------------------------------

    def _wait(self, worker_id: int, token: int, what: str, timeout: float | None,
              raise_errors: bool = True) -> Any:
        """Wait for the reply carrying token; raise worker errors, deaths and timeouts."""
        limit = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        reply = self._stash.pop(token, None)
        if reply is not None:
            return self._finish(reply, what, raise_errors)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._broken = (f"worker {worker_id} did not answer {what} within {limit:g} s "
                                "(stuck in a function or a collective waiting for a peer)")
                raise DiscoError(self._broken)
            try:
                reply = self._get_reply(worker_id, min(left, 0.25))
                if reply is None:
                    self._check_alive()
            except DiscoError as e:  # a worker died
                self._broken = str(e)
                raise
            if reply is None:
                continue
            if reply[0] is None:
                self._errors.append(reply[2])
            elif reply[0] == token:
                return self._finish(reply, what, raise_errors)

    def _finish(self, reply: tuple, what: str, raise_errors: bool) -> Any:
        if not reply[1]:
            self._errors.append(reply[2])
        if raise_errors:
            self._raise_errors(what)
        return reply[2]

    def _raise_errors(self, what: str) -> None:
        for wid in self._ready_workers():
            while True:
                reply = self._get_reply(wid, 0.0)
                if reply is None:
                    break
                if reply[0] is None:
                    self._errors.append(reply[2])
                else:
                    self._stash[reply[0]] = reply
        if self._errors:
            errors, self._errors = self._errors, []
            more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
            shown = "".join("\n" + e for e in errors[1:4])
            if len(errors) > 4:
                shown += f"\n... {len(errors) - 4} more not shown"
            raise DiscoError(f"{what}: {errors[0]}{more}{shown}")

    def _sync(self, worker_id: int, what: str, timeout: float | None) -> None:
        self._check_usable()
        self._flush_frees()
        if worker_id == 0 and self._inline0:
            self._sync_inline(what)
            return
        token = next(self._tokens)
        self._send((int(A.SYNC_WORKER), (), 0, token), worker_id)
        self._wait(worker_id, token, what, timeout)

    def _sync_inline(self, what: str) -> None:
        """sync_worker_0 with worker-0 inline: it has run every command sent already, so only
        errors (its own, and any the other workers sent) and deaths are left to report."""
        try:
            self._check_alive()
        except DiscoError as e:
            self._broken = str(e)
            raise
        self._raise_errors(what)

    # ---- public API ----------------------------------------------------------------------------

    def get_global_func(self, name: str) -> DPackedFunc:
        """A global function on every worker (a missing one fails at the next blocking call)."""
        if not isinstance(name, str):
            raise DiscoError(f"get_global_func: name must be a str, got {type(name).__name__}")
        return DPackedFunc(self._broadcast(A.GET_GLOBAL_FUNC, name), self)

    def call_packed(self, func: DRef, *args: Any) -> DRef:
        """Run func(*args) on every worker; DRef arguments become each worker's register value.

        Asynchronous: errors surface at the next blocking call. With inline_worker0=True
        worker-0's share has already run when this returns; the others' share has not.
        """
        if not isinstance(func, DRef) or func.session is not self:
            raise DiscoError(f"call_packed: func must be a DRef of this session, got {func!r}")
        # NOTE: the hot path of streamed calls: no per-call work beyond what the command needs.
        regpos: tuple[int, ...] = ()
        if args:
            args, regpos = self._pack_args(args)
        if self._closed or self._broken is not None:
            self._check_usable()
        frees = self._take_frees() if self._pending_frees else ()
        reg_id = self._free_regs.pop() if self._free_regs else self._alloc()
        self._send((_CALL, frees, reg_id, func.reg_id, args, regpos), None)
        return DRef(reg_id, self)

    def sync_worker_0(self, timeout: float | None = None) -> None:
        """Wait until worker-0 has run every command sent so far; raises workers' errors."""
        self._sync(0, "sync_worker_0", timeout)

    def sync_worker(self, worker_id: int, timeout: float | None = None) -> None:
        """Wait until one worker has run every command sent so far."""
        self._sync(self._check_worker(worker_id), f"sync_worker({worker_id})", timeout)

    def sync_all(self, timeout: float | None = None) -> None:
        """Wait until every worker has run every command sent so far."""
        self._check_usable()
        self._flush_frees()
        tokens = [next(self._tokens) for _ in range(self._num_workers)]
        for wid, token in enumerate(tokens):
            self._send((int(A.SYNC_WORKER), (), 0, token), wid)
        for wid, token in enumerate(tokens):
            self._wait(wid, token, "sync_all", timeout, raise_errors=False)
        self._raise_errors("sync_all")

    def empty(self, shape: Sequence[int], dtype: Any, device: Device | None = None,
              worker0_only: bool = False, in_group: bool = True) -> DRef:
        """An uninitialised tensor on every worker (only group leaders with worker0_only)."""
        return self._method("runtime.disco.empty")(tuple(shape), np.dtype(dtype).name, device,
                                                   bool(worker0_only), bool(in_group))

    def copy_to_worker_0(self, host_array: Any, remote_array: DRef | None = None) -> DRef:
        """Copy a host array into a tensor on worker-0 (allocated when remote_array is None)."""
        host = _host_array(host_array, "copy_to_worker_0")
        if remote_array is None:
            remote_array = self.empty(host.shape, host.dtype, worker0_only=True)
        self._check_usable()
        if host.nbytes <= (1 << 16) and not self._inline0:
            # small: snapshot and stay asynchronous
            self._send((int(A.COPY_TO_WORKER0), (), remote_array.reg_id, host.copy(), None), 0)
        else:
            # large, or worker-0 inline: it copies straight from the caller's array; wait
            token = next(self._tokens)
            self._send((int(A.COPY_TO_WORKER0), (), remote_array.reg_id, host, token), 0)
            self._wait(0, token, "copy_to_worker_0", None)
        return remote_array

    def copy_from_worker_0(self, host_array: np.ndarray, remote_array: DRef,
                           timeout: float | None = None) -> None:
        """Copy worker-0's tensor into host_array (a writable numpy array of the same layout)."""
        if not isinstance(host_array, np.ndarray) or not host_array.flags.writeable:
            raise DiscoError("copy_from_worker_0: host_array must be a writable numpy.ndarray, "
                             f"got {type(host_array).__name__}")
        self._check_usable()
        token = next(self._tokens)
        self._send((int(A.COPY_FROM_WORKER0), (), remote_array.reg_id, host_array, token), 0)
        self._wait(0, token, "copy_from_worker_0", timeout)

    def debug_get_from_remote(self, reg_id: int, worker_id: int,
                              timeout: float | None = None) -> Any:
        """A register's value on one worker (TVM's SessionObj::DebugGetFromRemote)."""
        self._check_usable()
        worker_id = self._check_worker(worker_id)
        reg_id = self._check_reg(reg_id)
        self._flush_frees()
        token = next(self._tokens)
        self._send((int(A.DEBUG_GET_FROM_REMOTE), (), reg_id, token), worker_id)
        return self._wait(worker_id, token, f"debug_get_from_remote(worker {worker_id})",
                          timeout)

    def debug_set_register(self, reg_id: int, value: Any, worker_id: int) -> None:
        """Set a register on one worker (TVM's SessionObj::DebugSetRegister)."""
        self._check_usable()
        worker_id = self._check_worker(worker_id)
        reg_id = self._check_reg(reg_id)
        if isinstance(value, DRef):
            raise DiscoError("debug_set_register: value must be a host value, not a DRef")
        array = host_array(value)
        value = array.copy() if array is not None else value
        self._send((int(A.DEBUG_SET_REGISTER), (), reg_id, self._pack(value, worker_id)), worker_id)

    def _pack(self, value: Any, worker_id: int) -> Any:
        """Prepare a DEBUG_SET_REGISTER value for the worker's channel (identity in-process)."""
        return value

    def init_ccl(self, ccl: str, *device_ids: int) -> None:
        """Start the data plane: "cpu" (shared memory), "mpi" (MPISession) or "nccl" (GPUs)."""
        if ccl not in CCLS:
            raise DiscoError(f"unknown ccl {ccl!r}; expected one of: {', '.join(CCLS)}")
        ids = tuple(int(d) for d in device_ids)
        if ids and len(ids) != self._num_workers:
            raise DiscoError(f"init_ccl({ccl!r}): got {len(ids)} device id(s) {ids}, expected "
                             f"one per worker ({self._num_workers})")
        self._check_ccl(ccl)
        extra: tuple[int, ...] = ()
        if ccl == "nccl":
            from .nccl import unique_ids
            extra = unique_ids(1 + self.num_groups)
        self._method("runtime.disco.init_ccl")(ccl, ids, extra)
        self.sync_all()

    def _check_ccl(self, ccl: str) -> None:
        if ccl == "mpi":
            raise DiscoError(f"ccl 'mpi' needs MPISession (run under mpiexec); "
                             f"{type(self).__name__} uses 'cpu' (or 'nccl' on GPUs)")

    def _collective(self, name: str, src: DRef, dst: DRef, *extra: Any) -> None:
        """Run the builtin collective runtime.disco.<name>(src, dst, *extra) on every worker.

        NOTE: the command is built here directly and its result goes to register 0 (reserved,
        never handed out), so a streamed collective costs no argument scan and no DRef that
        is freed again; 1 KB allreduces are dominated by this per-command cost.
        """
        for what, ref in (("src", src), ("dst", dst)):
            if not isinstance(ref, DRef) or ref.session is not self:
                raise DiscoError(f"{name}: {what} must be a DRef of this session (a register "
                                 f"made by empty() or returned by a call), got {ref!r}")
        func = self._method(f"runtime.disco.{name}")
        if self._closed or self._broken is not None:
            self._check_usable()
        frees = self._take_frees() if self._pending_frees else ()
        self._send((_CALL, frees, 0, func.reg_id, (src.reg_id, dst.reg_id) + extra, (0, 1)),
                   None)

    def allreduce(self, src: DRef, dst: DRef, op: str = "sum", in_group: bool = True) -> DRef:
        """dst = op over every worker's src (op: sum, prod, min, max, avg); returns dst."""
        check_reduce_op(op)
        self._collective("allreduce", src, dst, op, bool(in_group))
        return dst

    def allgather(self, src: DRef, dst: DRef, in_group: bool = True) -> DRef:
        """dst = every worker's src stacked along axis 0, in worker order; returns dst."""
        self._collective("allgather", src, dst, bool(in_group))
        return dst

    def broadcast_from_worker0(self, src: DRef, dst: DRef, in_group: bool = True) -> DRef:
        """dst on every worker = src of worker-0 (of the group leader with in_group)."""
        self._collective("broadcast_from_worker0", src, dst, bool(in_group))
        return dst

    def scatter_from_worker0(self, from_array: DRef, to_array: DRef,
                             in_group: bool = True) -> None:
        """Worker i receives chunk i (along axis 0) of worker-0's from_array."""
        self._collective("scatter_from_worker0", from_array, to_array, bool(in_group))

    def gather_to_worker0(self, from_array: DRef, to_array: DRef, in_group: bool = True) -> None:
        """Worker-0's to_array = every worker's from_array stacked along axis 0."""
        self._collective("gather_to_worker0", from_array, to_array, bool(in_group))

    def broadcast(self, src: Any, dst: DRef | None = None, in_group: bool = True) -> DRef:
        """Copy a host array to every worker (via worker-0 and broadcast_from_worker0)."""
        host = _host_array(src, "broadcast")
        if dst is None:
            dst = self.empty(host.shape, host.dtype)
        staged = self.copy_to_worker_0(host)
        return self.broadcast_from_worker0(staged, dst, in_group)

    def scatter(self, src: Any, dst: DRef | None = None, in_group: bool = True) -> DRef:
        """Worker i gets src[i] of a host array whose axis 0 has one slot per worker."""
        host = _host_array(src, "scatter")
        size = self._num_workers // self.num_groups if in_group else self._num_workers
        if host.ndim == 0 or host.shape[0] != size:
            raise DiscoError(f"scatter: the host array's axis 0 must have one slot per worker "
                             f"({size}), got shape {tuple(host.shape)}")
        if dst is None:
            dst = self.empty(host.shape[1:], host.dtype)
        staged = self.empty(host.shape, host.dtype, worker0_only=True, in_group=in_group)
        self.copy_to_worker_0(host, staged)
        self.scatter_from_worker0(staged, dst, in_group)
        return dst

    def import_python_module(self, module_name: str) -> None:
        """Import a Python module on every worker (so its register_func calls run there)."""
        self._method("runtime.disco.import_python_module")(module_name)

    def load_module(self, lib_path: str | os.PathLike[str]) -> DModule:
        """Load a kernel library file on every worker (graph_runtime.load_module)."""
        ref = self._method("runtime.disco.load_module")(os.fspath(lib_path))
        return self._as(DModule, ref)

    def create_graph_module(self, graph: GraphSource,
                            lib: DModule | str | os.PathLike[str] | None = None,
                            params: str | os.PathLike[str] | None = None,
                            device: Device | None = None) -> DGraphModule:
        """A GraphModule on every worker: graph JSON text or path, a DModule or lib path."""
        if isinstance(graph, os.PathLike):
            graph = os.fspath(graph)
        if not isinstance(graph, str):
            raise DiscoError("create_graph_module: graph must be JSON text or a path, got "
                             f"{type(graph).__name__}")
        if lib is not None and not isinstance(lib, DRef):
            lib = os.fspath(lib)
        params = None if params is None else os.fspath(params)
        ref = self._method("runtime.disco.create_graph_module")(graph, lib, params, device)
        return self._as(DGraphModule, ref)

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop every worker and wait for them; idempotent. Never leaves a child behind."""
        if self._closed:
            return
        limit = 10.0 if timeout is None else float(timeout)
        try:
            if self._broken is None:
                tokens = [next(self._tokens) for _ in range(self._num_workers)]
                for wid, token in enumerate(tokens):
                    self._send((int(A.SHUTDOWN), (), 0, token), wid)
                for wid, token in enumerate(tokens):
                    self._wait(wid, token, "shutdown", limit)
        except DiscoError:
            pass
        finally:
            self._closed = True
            self._errors.clear()
            self._methods.clear()
            self._terminate()
            _LIVE.discard(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.shutdown(timeout=2.0)
            except Exception:
                pass


def _host_array(value: Any, what: str) -> np.ndarray:
    array = host_array(value)
    if array is None:
        raise DiscoError(f"{what}: expected a numpy.ndarray or NDArray, got "
                         f"{type(value).__name__}")
    return np.asarray(array, order="C")  # not ascontiguousarray: that makes 0-d arrays 1-d


@atexit.register
def _shutdown_all() -> None:
    for session in list(_LIVE):
        try:
            session.shutdown(timeout=2.0)
        except Exception:
            pass


def _forget_after_fork() -> None:
    # A forked child shares the parent's channels: it must never free, command or shut down
    # the parent's workers, so its copies of the sessions count as closed.
    for session in list(_LIVE):
        session._closed = True
    _LIVE.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
