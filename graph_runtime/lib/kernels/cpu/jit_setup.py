"""numba's one-time CPU target set-up, started on a background thread once a kernel that calls
this folder's compiled functions is built.

The first call of any numba function in a process, even one loaded from the disk cache, first
sets numba's CPU target up (`BaseContext.refresh`): it imports numba's implementation
registries and, through numba.np.arraymath's BLAS check, all of scipy.linalg. In a warm
`graphrun run` of BERT-base that took 0.2-0.4 s of a 1 s start, where each later load takes a
few ms. start() does it on a daemon thread holding numba's compiler lock, so that the first
call only waits for what is left of it; started while create() builds such a kernel, it
overlaps what create() does without the GIL (oneDNN's thread-policy sample and primitive
creation). Being Python, it also takes the GIL from create(): BERT-base's create grew by
~0.14 s while its first run's wait shrank by 0.2 s (docs/measurements.md, with what else was
tried). Not at import time: a thread importing while the main thread is inside an import can
deadlock on that lock. A graph without such a kernel never starts it (the thread would take a
core and the GIL from oneDNN and create()). A fork waits for it to end, so that no child
inherits numba's lock or an import lock held by a thread it lacks.

Who calls start(): every builder that returns a kernel calling compiled code at each run
(rows_jit, attention, rotary, chain_jit, the pools, depthwise conv, resize, gather_elements and
the int8 kernels). The conv epilogue's one pass, taken or not by size at run time, leaves the
set-up to its first call. A module with symbolic dims makes its kernels at its first run: its
create() starts the set-up where it has CPU entries (a server's first request, 2 s after
create, took 0.19-0.21 s against 0.39-0.54 s waiting for it; with no gap, the same), even for a
graph of products alone, whose kernels would not need it.
"""
from __future__ import annotations

import logging
import os
import threading
import warnings
from typing import Any

from ..threads import num_threads

log = logging.getLogger(__name__)
# numba's SSA pass reports its own pedantic findings on the loops we generate ("variable ... is
# not in scope ... please report to numba", NumbaIRAssumptionWarning) at each first compile:
# numba's internal check, not a fault of the kernel, and noise on a user's console.
warnings.filterwarnings("ignore", message=r"variable '.*' is not in scope",
                        module=r"numba\.core\.ssa")
_lock = threading.Lock()
_thread: threading.Thread | None = None
_other_sizes = False  # whether a module of this process will run other sizes (load_ahead)


def start() -> None:
    """Start the set-up on its thread, once per process (later calls return at once); not
    where the runtime may use one CPU only, which leaves the thread nothing to overlap."""
    global _thread
    with _lock:
        if _thread is not None or num_threads() < 2:
            return
        # NOTE: imported here, on the caller's thread (numba is loaded already: the caller's
        # kernels are numba's), so that the thread itself starts inside no import.
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target
        _thread = threading.Thread(target=_set_up, args=(global_compiler_lock, cpu_target),
                                   name="graph_runtime numba set-up", daemon=True)
        _thread.start()


def started() -> bool:
    """Whether start() has started the set-up in this process."""
    return _thread is not None


def in_use() -> bool:
    """Whether numba's target is set up, or being set up, in this process (start() ran, or a
    compiled function was called): more compiled code (a replay's loop, kernels/replay.py)
    then costs no set-up of its own."""
    import sys
    return started() or "numba.np.arraymath" in sys.modules


def wait(timeout: float | None = None) -> bool:
    """Wait for the set-up to end (True when it has, or never started)."""
    # NOTE: start()'s lock first: a fork while start() is starting the thread (which cannot be
    # joined before it has started) then waits for it too, instead of going on beside it.
    with _lock:
        thread = _thread
    if thread is None or thread is threading.current_thread():
        return True
    thread.join(timeout)
    return not thread.is_alive()


def expect_other_sizes() -> None:
    """Say that a module whose shapes change (symbolic dims) runs in this process, so kernels
    load ahead the compiled code their other sizes take (load_ahead)."""
    global _other_sizes
    _other_sizes = True


def other_sizes_expected() -> bool:
    """Whether kernels should load other sizes' code ahead (expect_other_sizes was called)."""
    return _other_sizes


def load_ahead(function: Any, *args: Any) -> None:
    """Load function's machine code for these arguments' types now (from numba's disk cache,
    or compiled), where a kernel's size took another path (numba keeps it: a signature it has
    costs only the look-up).

    NOTE: a row kernel runs a large size on oneDNN's team and a small one on this thread, each
    a compiled function of its own. A process running a symbolic module would otherwise load
    the other one in a later request's first run: 4-7 ms each from the disk cache, a LLaMA
    stream's (2, 20) request loading two in a first run of 47-53 ms against 10 warm."""
    if not _other_sizes:
        return
    import numba  # loaded already: function is numba's
    function.compile(tuple(numba.typeof(a) for a in args))


def _set_up(compiler_lock: Any, target: Any) -> None:
    try:
        with compiler_lock:
            target.target_context.refresh()
    except Exception:  # noqa: BLE001  (the first call sets up again and raises what fails)
        log.debug("numba's target set-up on the background thread failed", exc_info=True)


os.register_at_fork(before=wait)
