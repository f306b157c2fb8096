"""Row loops run on oneDNN's own OpenMP team (libgomp's GOMP_parallel), not the runtime's workers.

In OpenMP mode (onednn/policy.py) oneDNN's threads keep spinning on the other cores for a while
after each primitive. A row kernel that split its rows over the runtime's workers then shared
each core with a spinning thread: in a LLaMA-style decoder at (4, 194), its 9 RMSNorms took
3.2-7.8 ms between the dense products, and 0.74-0.86 ms when the same rows went to the OpenMP
team (docs/measurements.md). Here they go to that team: the threads that spin take the work.

A kernel is a numba cfunc `void(void*)`: every thread of the team calls it with the same block
of int64 (array addresses, sizes, floats as their bits), asks its thread number and the team's
size, and runs its share of the rows. oneDNN's wheel and numba's own OpenMP pool both link the
system's libgomp.so.1, so the team is the one oneDNN's primitives use on the calling thread.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import carray, cfunc, types
from numba.extending import intrinsic

from .. import replay
from ..address import address_of
from .loops_jit import inlined

LIBGOMP = "libgomp.so.1"
_thread_num: Any = types.ExternalFunction("omp_get_thread_num", types.int32())
_team_size: Any = types.ExternalFunction("omp_get_num_threads", types.int32())
# libc's memcpy(dst, src, nbytes), addresses as int64 (its result, dst, unused): a slice
# assignment between two arrays at raw addresses compiled to a loop 3.5-7x slower than NumPy's
# copy (numba cannot tell that they do not overlap)
copy_bytes: Any = types.ExternalFunction("memcpy", types.int64(types.int64, types.int64,
                                                               types.int64))
_parallel: Any = None
_tried = False
_lock = threading.Lock()
_made_lock = threading.Lock()
_float64_bytes = struct.Struct("=d").pack
_int64_bits = struct.Struct("=q").unpack


def _gomp_parallel() -> Any:
    """libgomp's GOMP_parallel(fn, data, num_threads, flags), loaded once; None without it."""
    global _parallel, _tried
    if _tried:  # the common case (every call), without the lock
        return _parallel
    with _lock:
        if not _tried:
            _tried = True
            try:
                llvm.load_library_permanently(LIBGOMP)  # the symbols the cfuncs call
                fn = ctypes.CDLL(LIBGOMP).GOMP_parallel
            except (OSError, RuntimeError, AttributeError):
                return None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
            fn.restype = None
            _parallel = fn
    return _parallel


def gomp_loaded() -> bool:
    """Whether libgomp's entry point loaded (the team can be asked to run a kernel)."""
    return _gomp_parallel() is not None


def available() -> bool:
    """Whether a row loop made now may run on the team: oneDNN runs in OpenMP mode (not the
    runtime's workers, as where a neighbour holds a core) and libgomp's entry point loaded."""
    from ..onednn import binding, policy
    return binding.available() and policy.mode_word() == "openmp" and \
        _gomp_parallel() is not None


def team_arrays(*arrays: Any) -> bool:
    """Whether the arrays a team kernel reads by address are float32 and C-contiguous."""
    return all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def run_on_team(kernel: Any, block: np.ndarray) -> None:
    """Every thread of the calling thread's OpenMP team runs kernel (a cfunc) on block; the team
    has as many threads as oneDNN's primitives get on this thread (use_threads)."""
    if replay.active is not None:
        replay.active.team(kernel.address, block)
    _gomp_parallel()(kernel.address, address_of(block), 0, 0)


def recording_here() -> bool:
    """Whether a replay records the calling thread's calls now (kernels/replay.py) and
    run_here can run: a kernel whose rows would run on this thread anyway then runs its team
    function there alone, a call the replay can make again."""
    return replay.active is not None and replay.active.here() is not None and gomp_loaded()


def run_here(kernel: Any, block: np.ndarray) -> None:
    """kernel run on block by the calling thread alone (a team of one: its rows all its own),
    as a replay of it runs (kernels/replay.py): for work too small to wake the team."""
    if replay.active is not None:
        replay.active.team(kernel.address, block, threads=1)
    _gomp_parallel()(kernel.address, address_of(block), 1, 0)


def run_at(kernel_address: int, block_address: int) -> None:
    """run_on_team with both addresses read before (a kernel called every run on the same
    block: about 2 us less a call than asking the cfunc and the array for them)."""
    _parallel(kernel_address, block_address, 0, 0)


def block(*values: Any) -> np.ndarray:
    """The int64 block a kernel reads: arrays as their data addresses, floats as float64 bits
    (made at each call of a row kernel on the team: 5.7 -> 2.7 us for four arrays and three
    numbers, the addresses through address_of and the bits through struct instead of a NumPy
    scalar's view)."""
    items = []
    if replay.active is not None:
        replay.note_arrays([v for v in values if isinstance(v, np.ndarray)])
    for value in values:
        if isinstance(value, np.ndarray):
            items.append(address_of(value))
        elif isinstance(value, float):
            items.append(float_bits(value))
        else:
            items.append(int(value))
    return np.array(items, np.int64)


def float_bits(value: float) -> int:
    """value as a block holds a float: its float64 bits."""
    return int(_int64_bits(_float64_bytes(value))[0])


@intrinsic
def _pointer(typingctx: Any, address: Any, dtype: Any) -> Any:
    """The int64 address as a pointer to dtype's elements."""
    if not isinstance(address, types.Integer) or not isinstance(dtype, types.NumberClass):
        return None
    result = types.CPointer(dtype.instance_type)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(result))
    return result(address, dtype), codegen


@inlined
def float32_at(address: int, shape: Any) -> Any:
    """The C-contiguous float32 array of shape at the address (a block's entry)."""
    return carray(_pointer(address, np.float32), shape)  # type: ignore[call-arg]


@inlined
def array_at(address: int, shape: Any, dtype: Any) -> Any:
    """The C-contiguous array of dtype (a NumPy number class) and shape at the address."""
    return carray(_pointer(address, dtype), shape)  # type: ignore[call-arg]


@intrinsic
def _fetch_add(typingctx: Any, address: Any, count: Any) -> Any:
    """The int64 at address, count added to it atomically (the value before)."""
    if not isinstance(address, types.Integer) or not isinstance(count, types.Integer):
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        pointer = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.atomic_rmw("add", pointer, builder.sext(args[1], ir.IntType(64))
                                  if args[1].type.width < 64 else args[1], "monotonic")
    return types.int64(address, count), codegen


@inlined
def claim_rows(counter: int, count: int) -> int:
    """The first of the next count rows no team thread has taken (counter: the address of an
    int64 set to 0 before the team starts): a thread that runs late, its core shared with
    another process, takes fewer rows instead of keeping the others waiting at the end."""
    return _fetch_add(counter, count)  # type: ignore[call-arg]


@inlined
def my_rows(rows: int) -> tuple[int, int]:
    """[lo, hi): the calling team thread's share of rows (near-equal, contiguous)."""
    t, n = _thread_num(), _team_size()
    return rows * t // n, rows * (t + 1) // n


def team_kernel(fn: Any = None, *, reassociate: bool = False) -> Any:
    """fn as a `void(void*)` cfunc, made at its first use (compiled, or loaded from numba's
    cache): at import it would set numba's target up on the importing thread (jit_setup.py).
    reassociate: its sums may be reordered (summed in vector lanes, as loops_jit.lane_dot) and
    each product fused with its sum."""
    if fn is None:
        return lambda f: team_kernel(f, reassociate=reassociate)
    # contract: a product and its sum as one fused multiply-add (fewer operations a value)
    options: dict[str, Any] = {"fastmath": {"reassoc", "contract"}} if reassociate else {}
    made: list[Any] = []

    def get() -> Any:
        if made:  # the common case (every call), without the lock
            return made[0]
        _gomp_parallel()  # the symbols it calls, loaded before it is linked
        with _made_lock:
            if not made:
                try:
                    made.append(cfunc(types.void(types.voidptr), cache=True, **options)(fn))
                except RuntimeError:  # no writable cache directory, as in loops_jit.compiled
                    made.append(cfunc(types.void(types.voidptr), **options)(fn))
            return made[0]
    return get


@team_kernel
def _nothing(data: Any) -> None:
    """A team kernel doing nothing (wake_team's)."""


_NO_BLOCK = np.zeros(1, np.int64)


def wake_team() -> None:
    """Have every thread of the calling thread's OpenMP team run once now, where oneDNN's
    primitives run on that team (a race's sample then finds it as a graph's next oneDNN node
    does: woken a pause before, not asleep since its last sample; _timing.sampler)."""
    if available():
        run_on_team(_nothing(), _NO_BLOCK)
