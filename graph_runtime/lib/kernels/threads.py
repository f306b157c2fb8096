"""Image-parallel loops for CPU kernels: workers pull images one at a time, BLAS single-threaded.

OpenBLAS splits every GEMM statically over its threads, so on a machine whose cores are shared
one late thread stalls each of a conv's many small per-image GEMMs (batch-32 convs ran several
times slower threaded than with one BLAS thread; docs/measurements.md). Handing out whole images
instead lets a worker that got the CPU take more of them. While any such loop runs, OpenBLAS
runs single-threaded: its openblas_set_num_threads_local turned out to set the process-wide
count in NumPy's OpenBLAS, so loops take it down to 1 together (a count of active loops) and
the last one restores it.

GRAPH_RUNTIME_NUM_THREADS: workers per parallel loop (default: the CPUs this process may use).
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from ... import settings

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_set_local: Any = None
_looked_up = False


def num_threads() -> int:
    """Workers a parallel loop may use: GRAPH_RUNTIME_NUM_THREADS, else the usable CPUs less
    those oneDNN's auto thread policy found another process keeping busy (cpus_left)."""
    forced = settings.num_threads()
    if forced is not None:
        return forced
    return settings.held_value("usable CPUs", _cpus_left)


def cpu_threads() -> int:
    """GRAPH_RUNTIME_NUM_THREADS, else the usable CPUs, busy or not (the thread policy's own
    count of cores)."""
    forced = settings.num_threads()
    if forced is not None:
        return forced
    return settings.held_value("CPUs", _usable_cpus)


def _cpus_left() -> int:
    cpus = cpu_threads()  # GRAPH_RUNTIME_NUM_THREADS is unset here: the usable CPUs, held
    if cpus < 2:
        return cpus
    from .onednn.policy import cpus_left
    return cpus_left(cpus)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _blas_setter() -> Any:
    """OpenBLAS's openblas_set_num_threads_local from NumPy's own OpenBLAS, or None."""
    global _set_local, _looked_up
    if _looked_up:
        return _set_local
    _looked_up = True
    folder = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "*openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)
            fn = lib.openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
        _set_local = fn
        break
    return _set_local


_active = 0  # loops running with OpenBLAS held at one thread
_saved: int | None = None
_blas_lock = threading.Lock()


def single_blas_thread() -> None:
    """Hold OpenBLAS at one thread until the matching restore_blas_threads (nests, any thread)."""
    global _active, _saved
    setter = _blas_setter()
    if setter is None:
        return
    with _blas_lock:
        if _active == 0:
            _saved = int(setter(1))
        _active += 1


def restore_blas_threads() -> None:
    """End one single_blas_thread hold; the last one gives OpenBLAS its thread count back."""
    global _active, _saved
    setter = _blas_setter()
    if setter is None:
        return
    with _blas_lock:
        _active -= 1
        if _active == 0 and _saved is not None:
            setter(_saved)
            _saved = None


class _OneBlasThread:
    """`with ONE_BLAS_THREAD:` holds OpenBLAS at one thread for the block (nests, reusable)."""

    def __enter__(self) -> None:
        single_blas_thread()

    def __exit__(self, *exc: object) -> None:
        restore_blas_threads()


ONE_BLAS_THREAD = _OneBlasThread()


def _get_pool(workers: int) -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < workers:  # a pool too small for this loop
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gr-cpu")
        return _pool


class _Loop:
    """One parallel loop's shared state: the next item, how many finished, the first error."""

    def __init__(self, n: int, work: Callable[[int, int], None]) -> None:
        self.n = n
        self.work = work
        self.next = 0
        self.done = 0
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.finished = threading.Event()

    def drain(self, worker: int) -> None:
        while True:
            with self.lock:
                i = self.next
                if i >= self.n:
                    return
                self.next = i + 1
            try:
                self.work(worker, i)
            except BaseException as e:  # noqa: BLE001 (re-raised by the caller's wait)
                self.error = self.error or e
            finally:
                with self.lock:
                    self.done += 1
                    if self.done == self.n:
                        self.finished.set()

    def wait(self) -> None:
        self.finished.wait()
        if self.error is not None:
            raise self.error


def parallel_images(n: int, workers: int, work: Callable[[int, int], None]) -> None:
    """work(worker, image) for every image in range(n), images handed out one at a time.

    The caller is worker 0 and returns once every item is done: a helper that was not scheduled
    before the caller took the last item is not waited for (it finds nothing left and exits),
    so a busy core costs at most the items it actually took. With workers == 1 (or one image)
    the caller runs everything itself. BLAS stays on one thread throughout, even for one item:
    a threaded OpenBLAS call whose sleeping workers must first get a core takes many times
    longer on a busy machine, and the workers here are how kernels spread over cores.
    """
    with ONE_BLAS_THREAD:
        if workers <= 1 or n <= 1:
            for i in range(n):
                work(0, i)
            return
        loop = _Loop(n, work)
        pool = _get_pool(workers - 1)
        for w in range(1, workers):
            pool.submit(loop.drain, w)
        loop.drain(0)
        loop.wait()  # helpers still inside an item finish it before BLAS gets its threads back


def parallel_rows(rows: int, workers: int, call: Callable[[int, int], None]) -> None:
    """call(lo, hi) over rows [0, rows): about four ranges a worker with parallel_items, or
    one call with one worker."""
    if workers <= 1:
        call(0, rows)
        return
    chunks = min(rows, 4 * workers)
    bounds = [(c * rows // chunks, (c + 1) * rows // chunks) for c in range(chunks)]
    parallel_items(chunks, workers, lambda w, i: call(*bounds[i]))


def parallel_items(n: int, workers: int, work: Callable[[int, int], None]) -> None:
    """parallel_images for work that calls no BLAS: with one worker the caller runs the items
    without parallel_images' hold on OpenBLAS's thread count (a few microseconds per call, as
    much as a small pool's whole loop)."""
    if workers <= 1 or n <= 1:
        for i in range(n):
            work(0, i)
        return
    parallel_images(n, workers, work)


def channel_split(n: int, channels: int, outputs: int, serial_below: int) -> tuple[int, int]:
    """(channel ranges per image, workers) for a loop over (image, channel range) items.

    One worker below serial_below outputs (there the hand-off costs more than a second core
    saves). Otherwise a batch too small to feed every worker by whole images is cut into
    channel ranges, ~3 items per worker, so one that got a core can take more of them.
    """
    workers = max(1, num_threads()) if outputs >= serial_below else 1
    chunks = 1
    if workers > 1 and n < 3 * workers:
        chunks = max(1, min(channels, -(-3 * workers // max(1, n))))
    return chunks, max(1, min(workers, n * chunks))


def chunk_bounds(channels: int, chunks: int, chunk: int) -> tuple[int, int]:
    """Channels [c0, c1) of one of `chunks` near-equal ranges."""
    return chunk * channels // chunks, (chunk + 1) * channels // chunks


def threads_generation() -> int:
    """How many times oneDNN's thread mode changed in this process so far (its auto policy
    looks at the load again when asked, at most every 2 s: onednn/policy.py's recheck).
    Kernels made before keep their mode, so a module whose kernels were made in an older
    generation makes them again."""
    from .onednn.policy import generation
    return generation()
