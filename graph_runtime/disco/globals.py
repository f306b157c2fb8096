"""Worker-side globals: the function registry (register_func) and the current worker's context."""
from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..device import Device, cpu
from ..errors import DiscoError

_FUNCS: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()


def register_func(name: str, func: Callable[..., Any] | None = None, *,
                  override: bool = False) -> Any:
    """Register func as a global function workers can fetch by name; without func, a decorator."""

    def add(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            raise DiscoError(f"register_func({name!r}): expected a callable, got "
                             f"{type(f).__name__}")
        with _LOCK:
            if name in _FUNCS and not override and _FUNCS[name] is not f:
                raise DiscoError(f"global function {name!r} is already registered; pass "
                                 "override=True to replace it")
            _FUNCS[name] = f
        return f

    if func is None:
        return add
    return add(func)


def get_global_func(name: str) -> Callable[..., Any]:
    """The registered function called name; DiscoError naming close matches when missing."""
    func = _FUNCS.get(name)
    if func is None:
        close = difflib.get_close_matches(name, list(_FUNCS), n=3)
        hint = f"; did you mean: {', '.join(close)}" if close else ""
        raise DiscoError(f"no global function {name!r} on this worker{hint}; register it with "
                         "graph_runtime.disco.register_func in a module the workers import "
                         "(sess.import_python_module)")
    return func


def list_global_funcs() -> list[str]:
    """Names of every registered global function."""
    return sorted(_FUNCS)


@dataclass
class WorkerContext:
    """What one worker knows about itself; runtime.disco.* functions read it."""

    worker_id: int
    num_workers: int
    num_groups: int = 1
    device: Device = field(default_factory=cpu)
    timeout: float = 120.0
    # ccl name -> factory(ctx, device_ids) building the data plane for this worker
    ccl_factories: dict[str, Callable[..., Any]] = field(default_factory=dict)
    ccl: Any = None

    @property
    def group_size(self) -> int:
        return self.num_workers // self.num_groups

    @property
    def group_id(self) -> int:
        return self.worker_id // self.group_size

    @property
    def local_rank(self) -> int:
        return self.worker_id % self.group_size


_current = threading.local()


def set_current(ctx: WorkerContext | None) -> None:
    """Bind ctx to the calling thread (each worker thread or process has its own)."""
    _current.ctx = ctx


def swap_current(ctx: WorkerContext | None) -> WorkerContext | None:
    """Bind ctx to the calling thread and return the context bound before (inline worker-0)."""
    previous = getattr(_current, "ctx", None)
    _current.ctx = ctx
    return previous


def current() -> WorkerContext:
    """The context of the worker running on this thread."""
    ctx = getattr(_current, "ctx", None)
    if ctx is None:
        raise DiscoError("runtime.disco.* worker functions only work inside a Disco worker "
                         "(call them through sess.call_packed / sess.get_global_func)")
    return ctx


def require_ccl(what: str) -> Any:
    """The worker's data plane, or a clear error when init_ccl has not run."""
    ctx = current()
    if ctx.ccl is None:
        raise DiscoError(f"{what} on worker {ctx.worker_id}: no collective library; call "
                         "sess.init_ccl(\"cpu\") (or \"mpi\" / \"nccl\") first")
    return ctx.ccl
