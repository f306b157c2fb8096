"""Disco: an SPMD runtime where a controller drives workers that share one register layout."""
from __future__ import annotations

from . import builtins as _builtins  # noqa: F401  (registers runtime.disco.*)
from .ccl import REDUCE_OPS
from .globals import WorkerContext, get_global_func, list_global_funcs, register_func
from .protocol import DiscoAction
from .session import DGraphModule, DModule, DPackedFunc, DRef, Session
from .threaded import ThreadedSession

__all__ = ["DGraphModule", "DModule", "DPackedFunc", "DRef", "DiscoAction", "MPISession",
           "ProcessSession", "REDUCE_OPS", "Session", "ThreadedSession", "WorkerContext",
           "get_global_func", "list_global_funcs", "register_func"]


def __getattr__(name: str) -> object:
    # ProcessSession and MPISession load on first use (mpi4py is optional).
    if name == "ProcessSession":
        from .process import ProcessSession
        return ProcessSession
    if name == "MPISession":
        from .mpi import MPISession
        return MPISession
    raise AttributeError(f"module 'graph_runtime.disco' has no attribute {name!r}")
