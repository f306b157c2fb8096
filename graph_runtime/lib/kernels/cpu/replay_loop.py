"""The compiled loop that replays recorded foreign calls (kernels/replay.py) with no Python
between them: each row of an int64 (count, 5) table is a team kernel run by libgomp's
GOMP_parallel (its row counter set to 0 first), a oneDNN primitive run by
dnnl_primitive_execute on the calling thread's stream, or a copy of bytes. A team kernel asked
for a team of one runs on the calling thread alone (its rows all its own)."""
from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np
from llvmlite import binding as llvm
from numba import cfunc, types

from ..replay import COLUMNS, COPY, TEAM
from .omp_team import array_at, copy_bytes, gomp_loaded

# pointers passed as int64: the same registers in the x86-64 and AArch64 C conventions
_parallel: Any = types.ExternalFunction("GOMP_parallel", types.void(
    types.int64, types.int64, types.uint32, types.uint32))
_execute: Any = types.ExternalFunction("dnnl_primitive_execute", types.int32(
    types.int64, types.int64, types.int32, types.int64))
_made: list[Any] = []
_lock = threading.Lock()


def _loop(table: int, count: int, stream: int, status: int) -> int:
    ops = array_at(table, (count, COLUMNS), np.int64)
    for i in range(count):
        kind = ops[i, 0]
        if kind == TEAM:
            if ops[i, 3] != 0:
                array_at(ops[i, 3], (1,), np.int64)[0] = 0
            _parallel(ops[i, 1], ops[i, 2], np.uint32(ops[i, 4]), 0)
        elif kind == COPY:
            copy_bytes(ops[i, 1], ops[i, 2], ops[i, 3])
        else:
            code = _execute(ops[i, 1], stream, np.int32(ops[i, 2]), ops[i, 3])
            if code != 0:
                array_at(status, (1,), np.int64)[0] = code
                return i
    return -1


def replay_loop() -> Any:
    """The loop as a ctypes function `int64 loop(table, count, stream, status)`: returns the
    row whose primitive failed (its status written at the address status), or -1. Made at
    its first use (compiled, or loaded from numba's cache), after libgomp and oneDNN's library
    are loaded for linking."""
    if _made:
        return _made[0][0]
    with _lock:
        if not _made:
            from ..onednn import binding
            gomp_loaded()
            llvm.load_library_permanently(binding.library_path())
            signature = types.int64(types.int64, types.int64, types.int64, types.int64)
            try:
                made = cfunc(signature, cache=True)(_loop)
            except RuntimeError:  # no writable cache directory, as omp_team.team_kernel
                made = cfunc(signature)(_loop)
            address = made.address
            assert address is not None
            fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_int64, ctypes.c_int64)(address)
            _made.append((fn, made))  # the cfunc kept: its code lives as long as it does
    return _made[0][0]
