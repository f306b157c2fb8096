"""The one binding to oneDNN's 3.x C API: loading, version check, handles, errors, threads.

ctypes, not cffi or a compiled extension: the 3.x API is opaque handles (memory descriptors,
primitive descriptors, primitives, memories) and plain C enums and structs, which ctypes calls
with no compiler or build step at install; the library itself comes from PyPI's
`onednn-cpu-gomp` wheel (libdnnl.so.3 under the environment's lib/) or, by setting, a system one.
The enum values and signatures (abi.py) were read from oneDNN 3.2's C headers; only 3.2 was
tested, so any other version is refused with the reason. Kernels call this module (and read
abi.py's constants), never the raw foreign functions.

GRAPH_RUNTIME_ONEDNN (settings.ONEDNN): auto (default: offer oneDNN kernels where the library
loads; the tuning service picks per shape), on (use them wherever they apply; a missing library
is an error), off. GRAPH_RUNTIME_ONEDNN_LIB: a path to libdnnl.so.3 (else the environment's lib/,
then the system's).
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Any, Callable, NamedTuple, Sequence

from .... import settings
from ....errors import LibraryError
from .. import replay
from .abi import (
    RESTYPES,
    SIGNATURES,
    Dims,
    ExecArg,
    ENGINE_CPU,
    F32,
    FORMAT_BLOCKED,
    ISA_AVX2_VNNI_BIT,
    ISA_AVX512_CORE_BIT,
    ISA_AVX512_VNNI_BIT,
    ARG_SCRATCHPAD,
    QUERY_IMPL_INFO_STR,
    QUERY_SCRATCHPAD_MD,
    SCRATCHPAD_MODE_USER,
    STATUS_NAMES,
    STREAM_DEFAULT,
    TAG_ANY,
    TAG_PLAIN,
    QUERY_FORMAT_KIND,
    QUERY_INNER_BLKS,
    QUERY_INNER_IDXS,
    QUERY_INNER_NBLKS,
    QUERY_NDIMS,
    QUERY_PADDED_DIMS,
    QUERY_STRIDES,
)

ONEDNN_ENV = settings.ONEDNN.name
ONEDNN_LIB_ENV = settings.ONEDNN_LIB.name
TESTED = ((3, 2),)  # (major, minor) versions whose enum values and behaviour were checked

class Dnnl:
    """The loaded library: its functions (status checked) and one CPU engine."""

    def __init__(self, cdll: ctypes.CDLL, path: str) -> None:
        self.path = path
        self.raw: dict[str, Any] = {}
        for name, argtypes in SIGNATURES.items():
            fn = getattr(cdll, name)
            fn.argtypes = argtypes
            fn.restype = RESTYPES.get(name, ctypes.c_int)
            self.raw[name] = fn
        v = self.raw["dnnl_version"]().contents
        self.version = (v.major, v.minor, v.patch)
        self.engine = ctypes.c_void_p()
        self.gomp: Any = None
        self.isa: int | None = None  # dnnl_get_effective_cpu_isa, asked once (exact_int8)

    def open(self) -> None:
        """Make the engine, and find the OpenMP runtime the library uses."""
        self.call("dnnl_engine_create", ctypes.byref(self.engine), ENGINE_CPU, 0)
        try:  # the wheel links GNU OpenMP; the same soname gives the copy already loaded
            self.gomp = ctypes.CDLL("libgomp.so.1")
            self.gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
            self.gomp.omp_get_max_threads.restype = ctypes.c_int
        except (OSError, AttributeError):
            self.gomp = None

    def stream(self) -> ctypes.c_void_p:
        """The calling thread's stream: a oneDNN stream is not thread-safe, and the runtime's
        workers execute a conv's bands at once (sharing one serialised them)."""
        stream = getattr(_thread_state, "stream", None)
        if stream is None:
            stream = ctypes.c_void_p()
            self.call("dnnl_stream_create", ctypes.byref(stream), self.engine, STREAM_DEFAULT)
            _thread_state.stream = stream
        return stream

    def call(self, name: str, *args: Any) -> None:
        """Call a status-returning function; LibraryError names the call and the status."""
        status = self.raw[name](*args)
        if status != 0:
            raise LibraryError(f"oneDNN {name} failed: {STATUS_NAMES.get(status, status)}")

    def try_call(self, name: str, *args: Any) -> int:
        """Call a status-returning function and return its status (0 is success)."""
        return int(self.raw[name](*args))

    @property
    def version_text(self) -> str:
        return ".".join(str(v) for v in self.version)


_loaded: Dnnl | None = None
_reason = ""
_tried = False
_load_lock = threading.Lock()


def onednn_mode() -> str:
    """GRAPH_RUNTIME_ONEDNN as auto, on or off."""
    return settings.word(settings.ONEDNN)


def _candidates() -> list[str]:
    """Where libdnnl.so.3 may be: the setting's path, else the environment's lib/, else ld's."""
    path = settings.onednn_lib()
    if path:
        return [path]
    return [os.path.join(sys.prefix, "lib", "libdnnl.so.3"), "libdnnl.so.3"]


def _load() -> tuple[Dnnl | None, str]:
    if onednn_mode() == "off":
        return None, f"turned off by {ONEDNN_ENV}=off"
    errors = []
    for path in _candidates():
        try:
            cdll = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        try:
            lib = Dnnl(cdll, path)
        except AttributeError as e:
            return None, f"{path} lacks a oneDNN 3.x function ({e})"
        if lib.version[:2] not in TESTED:
            tested = ", ".join(f"{a}.{b}" for a, b in TESTED)
            return None, (f"{path} is oneDNN {lib.version_text}; only {tested} is tested "
                          f"(install onednn-cpu-gomp==2023.2.0 or point {ONEDNN_LIB_ENV} at one)")
        lib.open()
        return lib, ""
    return None, ("libdnnl.so.3 not found (pip install onednn-cpu-gomp, or set "
                  f"{ONEDNN_LIB_ENV}): " + "; ".join(errors))


def _ensure() -> None:
    """Load the library once, unless it is turned off now (then nothing is tried, so that a
    later mode may load it: a call made while off once kept it from loading for good)."""
    global _loaded, _reason, _tried
    if not _tried and onednn_mode() == "off":
        return
    with _load_lock:
        if not _tried:
            _tried = True
            try:
                _loaded, _reason = _load()
            except LibraryError as e:
                _loaded, _reason = None, str(e)


def available() -> bool:
    """True when oneDNN kernels may run here (library loaded, tested version, not turned off)."""
    if onednn_mode() == "off":
        return False
    _ensure()
    return _loaded is not None


def unavailable_reason() -> str:
    """Why oneDNN kernels do not run ('' when they may)."""
    if onednn_mode() == "off":
        return f"turned off by {ONEDNN_ENV}=off"
    _ensure()
    return _reason


def exact_int8() -> bool:
    """Whether oneDNN's int8 products are exact here: its CPU ISA has VNNI (vpdpbusd sums
    u8 x s8 pairs in int32). Without it (AVX2, AVX-512 without VNNI) its kernels multiply with
    vpmaddubsw, whose int16 pair sums saturate: an AMD EPYC without AVX-512 gave conv
    accumulators off by up to 23,324 (uint8 data, int8 weights). False where it is not
    loaded."""
    return bool(_isa() & (ISA_AVX2_VNNI_BIT | ISA_AVX512_VNNI_BIT))


def channel_block() -> int:
    """The channel block of oneDNN's blocked layouts here (nChw16c with AVX-512, nChw8c
    without): a first conv's blocked output holds NHWC's bytes only at this many channels."""
    return 16 if _isa() & ISA_AVX512_CORE_BIT else 8


def _isa() -> int:
    """dnnl_get_effective_cpu_isa (ONEDNN_MAX_CPU_ISA caps it), asked once; 0 where oneDNN is
    not loaded."""
    if not available():
        return 0
    lib = _lib()
    if lib.isa is None:
        lib.isa = int(lib.raw["dnnl_get_effective_cpu_isa"]())
    return lib.isa


def library() -> Dnnl:
    """The loaded library; LibraryError with the reason when it is not available."""
    _ensure()
    if _loaded is None or onednn_mode() == "off":
        raise LibraryError(f"oneDNN is not available: {unavailable_reason()}")
    return _loaded


def _lib() -> Dnnl:
    """library() for the handles' own calls: a descriptor, memory or primitive is only made
    for a kernel that library() or available() already admitted, so once loaded the setting
    is not read again (it was read 6,800 times in a warm BERT-base start, 20 ms)."""
    return _loaded if _loaded is not None else library()


def describe() -> str:
    """One line for `graphrun devices`: which CPU kernel library runs, and why not oneDNN."""
    if available():
        lib = _lib()
        from .policy import policy
        return (f"oneDNN {lib.version_text} ({lib.path}) where measured faster, NumPy/OpenBLAS "
                f"else; oneDNN threads: {policy().why}")
    return f"NumPy/OpenBLAS/numba (oneDNN not used: {unavailable_reason()})"


# -- threads ------------------------------------------------------------------------------------

_thread_state = threading.local()


# Called with n once a thread's OpenMP team is sized to n > 1 threads: cpu/team_pinning.py
# registers its pinning here (the cpu family builds on this one, never the other way).
_team_sized: list[Callable[[int], Any]] = []


def on_team_sized(hook: Callable[[int], Any]) -> None:
    """Have use_threads call hook(n) whenever it sizes the calling thread's team to n > 1."""
    if hook not in _team_sized:
        _team_sized.append(hook)


def use_threads(n: int) -> None:
    """Give oneDNN n OpenMP threads on the calling thread (OpenMP's count is per thread).

    Set once per thread, before a primitive is made and before it runs: oneDNN partitions work
    for the count at creation, and changing it later cost 6-7 ms on the next call.
    """
    if getattr(_thread_state, "n", None) == n:
        return
    lib = _lib()
    if lib.gomp is not None:
        lib.gomp.omp_set_num_threads(n)
        if n > 1:
            for hook in _team_sized:
                hook(n)
    _thread_state.n = n


def threads_in_use() -> int | None:
    """The OpenMP thread count the calling thread's next team gets: what use_threads last set
    here, else OpenMP's own default (None where libgomp did not load)."""
    n = getattr(_thread_state, "n", None)
    if n is None:
        gomp = _lib().gomp
        n = None if gomp is None else int(gomp.omp_get_max_threads())
    return n


def thread_stream() -> int:
    """The calling thread's oneDNN stream handle (a replay executes on it)."""
    return int(_lib().stream().value or 0)


def aligned_scratch(nbytes: int) -> Any:
    """A scratchpad buffer of nbytes on oneDNN's preferred alignment."""
    from .weights import aligned_buffer
    return aligned_buffer(nbytes)


def library_path() -> str:
    """The path the loaded library came from (a compiled loop links its functions)."""
    return _lib().path


def run_on_worker(primitive: "Primitive") -> None:
    """One work item on a runtime worker (policy.py's workers mode), oneDNN single-threaded
    there."""
    use_threads(1)
    primitive.run()


# -- handles ------------------------------------------------------------------------------------

def _destroy(owner: Any) -> None:
    """Destroy owner's handle once, if it made one (its constructor may have failed first)."""
    destroy = getattr(owner, "_destroy", None)
    handle = getattr(owner, "handle", None)
    if destroy is not None and handle is not None and handle.value:
        owner._destroy = None
        destroy(handle)


def dims_array(values: Sequence[int]) -> Any:
    """A dnnl_dims_t holding values."""
    d = Dims()
    for i, v in enumerate(values):
        d[i] = int(v)
    return d


# The handles below are destroyed by __del__, not weakref.finalize: a finalizer is four more
# objects for the collector to scan (the finalizer, its info, a weak reference, its arguments),
# and a server's kept kernels hold handles by the thousand (10,000 finalizers, a quarter of
# what a full collection scanned in a LLaMA stream: 46-69 ms each). A handle a method copies
# (Primitive.with_args) is not destroyed by the copy.


class Blocking(NamedTuple):
    """A blocked memory descriptor's layout: its padded dims, the strides of its outer (block)
    dims in elements, and its inner blocks as (dim, size), outermost first (oneDNN's
    "BA16a64b" of a (k, n) weight: ((0, 16), (1, 64)), strides (1024, k / 16 * 1024))."""

    padded: tuple[int, ...]
    strides: tuple[int, ...]
    blocks: tuple[tuple[int, int], ...]


class MemoryDesc:
    """An owned dnnl_memory_desc_t."""

    def __init__(self, handle: ctypes.c_void_p, shape: Sequence[int]) -> None:
        self.handle = handle
        self.shape = tuple(shape)
        self._destroy = _lib().raw["dnnl_memory_desc_destroy"]

    def __del__(self, destroy: Any = _destroy) -> None:  # bound here: globals go at exit
        destroy(self)

    @staticmethod
    def plain(shape: Sequence[int], tag: int | None = None, dtype: int = F32) -> "MemoryDesc":
        """float32 (or dtype), row-major (tag None), or the given format tag (TAG_ANY lets
        oneDNN pick)."""
        lib = _lib()
        h = ctypes.c_void_p()
        fmt = TAG_PLAIN[len(shape)] if tag is None else tag
        lib.call("dnnl_memory_desc_create_with_tag", ctypes.byref(h), len(shape), dims_array(shape),
                 dtype, fmt)
        return MemoryDesc(h, shape)

    @staticmethod
    def strided(shape: Sequence[int], strides: Sequence[int], dtype: int = F32) -> "MemoryDesc":
        """float32 (or dtype) with element strides (a transposed view)."""
        lib = _lib()
        h = ctypes.c_void_p()
        lib.call("dnnl_memory_desc_create_with_strides", ctypes.byref(h), len(shape),
                 dims_array(shape), dtype, dims_array(strides))
        return MemoryDesc(h, shape)

    @staticmethod
    def borrowed(handle: int, shape: Sequence[int]) -> "MemoryDesc":
        """A copy of a descriptor a primitive descriptor owns (query_md)."""
        lib = _lib()
        h = ctypes.c_void_p()
        lib.call("dnnl_memory_desc_clone", ctypes.byref(h), ctypes.c_void_p(handle))
        return MemoryDesc(h, shape)

    def size(self) -> int:
        return int(_lib().raw["dnnl_memory_desc_get_size"](self.handle))

    def blocking(self) -> Blocking | None:
        """How a blocked descriptor lays its elements out (a weight oneDNN chose: format
        `any`), None for another format kind: read by kernels that share the reordered copy."""
        query = _lib().raw["dnnl_memory_desc_query"]
        kind, ndims, nblocks = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        query(self.handle, QUERY_FORMAT_KIND, ctypes.byref(kind))
        if kind.value != FORMAT_BLOCKED:
            return None
        query(self.handle, QUERY_NDIMS, ctypes.byref(ndims))
        query(self.handle, QUERY_INNER_NBLKS, ctypes.byref(nblocks))

        def dims(what: int, count: int) -> tuple[int, ...]:
            values = ctypes.POINTER(ctypes.c_int64)()
            query(self.handle, what, ctypes.byref(values))
            return tuple(values[i] for i in range(count))
        return Blocking(dims(QUERY_PADDED_DIMS, ndims.value), dims(QUERY_STRIDES, ndims.value),
                        tuple(zip(dims(QUERY_INNER_IDXS, nblocks.value),
                                  dims(QUERY_INNER_BLKS, nblocks.value))))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemoryDesc):
            return NotImplemented
        return bool(_lib().raw["dnnl_memory_desc_equal"](self.handle, other.handle))

    __hash__ = None  # type: ignore[assignment]


class Memory:
    """A dnnl_memory_t whose data handle follows a NumPy array, rebound only when it changes."""

    __slots__ = ("handle", "desc", "_array", "_address", "_set", "_destroy", "__weakref__")

    def __init__(self, desc: MemoryDesc) -> None:
        lib = _lib()
        self.handle = ctypes.c_void_p()
        self.desc = desc
        lib.call("dnnl_memory_create", ctypes.byref(self.handle), desc.handle, lib.engine, None)
        self._array: Any = None
        self._address = 0
        self._set = lib.raw["dnnl_memory_set_data_handle"]
        self._destroy = lib.raw["dnnl_memory_destroy"]

    def __del__(self, destroy: Any = _destroy) -> None:  # bound here: globals go at exit
        destroy(self)

    def bind(self, array: Any) -> None:
        """Point the memory at array's data (a C-contiguous NumPy array), if it moved."""
        if array is self._array:
            return
        self.bind_address(array.ctypes.data)
        self._array = array  # NOTE: held so that its id (and address) cannot be reused

    def bind_address(self, address: int) -> None:
        """Point the memory at a raw address (inside an array the caller keeps alive)."""
        if address == self._address:
            return
        status = self._set(self.handle, address)
        if status != 0:
            raise LibraryError("oneDNN dnnl_memory_set_data_handle failed: "
                               f"{STATUS_NAMES.get(status, status)}")
        self._address = address
        self._array = None


class PrimitiveDesc:
    """An owned dnnl_primitive_desc_t, made by a *_primitive_desc_create call.

    Every one is made with its scratchpad in the user's hands (the create call's last argument,
    its attr: post_ops_attr's, or one with nothing else set): oneDNN's own (library) scratchpad
    is one buffer per creating thread, which a primitive run on another thread (a conv band,
    a product's piece on the runtime's workers) shares with whatever runs there; an AMD EPYC
    without AVX-512 ran grouped convs by GEMM (im2col in the scratchpad) and crashed. The
    scratchpad is then the running thread's own (Primitive.run)."""

    def __init__(self, create: str, *args: Any) -> None:
        lib = _lib()
        self.handle = ctypes.c_void_p()
        if args and args[-1] is None:  # every *_primitive_desc_create takes attr last
            args = args[:-1] + (_user_scratchpad_attr(),)
        lib.call(create, ctypes.byref(self.handle), *args)
        self._destroy = lib.raw["dnnl_primitive_desc_destroy"]
        size = lib.raw["dnnl_memory_desc_get_size"](
            lib.raw["dnnl_primitive_desc_query_md"](self.handle, QUERY_SCRATCHPAD_MD, 0))
        self.scratchpad_bytes = int(size or 0)

    def __del__(self, destroy: Any = _destroy) -> None:  # bound here: globals go at exit
        destroy(self)

    def md(self, query: int, shape: Sequence[int], index: int = 0) -> MemoryDesc:
        """A memory descriptor the primitive chose (src, weights, dst)."""
        h = _lib().raw["dnnl_primitive_desc_query_md"](self.handle, query, index)
        if not h:
            raise LibraryError(f"oneDNN dnnl_primitive_desc_query_md({query}) gave nothing")
        return MemoryDesc.borrowed(h, shape)

    def impl(self) -> str:
        """The implementation oneDNN picked (e.g. brg:avx512_core, jit:avx2, gemm:jit)."""
        out = ctypes.c_char_p()
        _lib().call("dnnl_primitive_desc_query", self.handle, QUERY_IMPL_INFO_STR, 0,
                       ctypes.byref(out))
        return (out.value or b"").decode()


class Primitive:
    """A primitive with its execute arguments prepared: run() is one foreign call."""

    def __init__(self, pd: PrimitiveDesc, args: Sequence[tuple[int, Memory]]) -> None:
        lib = _lib()
        self.pd = pd
        self.handle = ctypes.c_void_p()
        lib.call("dnnl_primitive_create", ctypes.byref(self.handle), pd.handle)
        self._destroy = lib.raw["dnnl_primitive_destroy"]
        self._owner: Primitive | None = None
        self._bind_args(lib, args)

    def _bind_args(self, lib: Dnnl, args: Sequence[tuple[int, Memory]]) -> None:
        self._scratch: Memory | None = None
        if self.pd.scratchpad_bytes:  # bound to the running thread's buffer at each run
            self._scratch = Memory(self.pd.md(QUERY_SCRATCHPAD_MD, (self.pd.scratchpad_bytes,)))
            args = list(args) + [(ARG_SCRATCHPAD, self._scratch)]
        self.memories = [m for _, m in args]  # kept alive as long as the argument array
        self.args = (ExecArg * len(args))(*[ExecArg(kind, m.handle) for kind, m in args])
        self._execute = lib.raw["dnnl_primitive_execute"]
        self._lib = lib
        self._count = len(args)
        self._address = ctypes.addressof(self.args)

    def with_args(self, args: Sequence[tuple[int, Memory]]) -> Primitive:
        """This primitive executing on other memories, made once: one with run-time dims runs
        memories of any dims (no primitive made per shape)."""
        other = Primitive.__new__(Primitive)
        other.pd = self.pd
        other.handle = self.handle
        other._destroy = None
        other._owner = self  # the handle is destroyed with its owner, never before this
        other._bind_args(self._lib, args)
        return other

    def __del__(self, destroy: Any = _destroy) -> None:  # bound here: globals go at exit
        destroy(self)

    def run(self) -> None:
        """Execute on this thread's stream (blocking: the CPU engine runs in the caller's
        threads), with this thread's scratchpad."""
        if replay.active is not None:
            replay.active.primitive(self)
        if self._scratch is not None:
            self._scratch.bind_address(_thread_scratchpad(self.pd.scratchpad_bytes))
        status = self._execute(self.handle, self._lib.stream(), self._count, self._address)
        if status != 0:
            raise LibraryError(f"oneDNN dnnl_primitive_execute ({self.pd.impl()}) failed: "
                               f"{STATUS_NAMES.get(status, status)}")


_plain_attr: ctypes.c_void_p | None = None


def _user_scratchpad_attr() -> ctypes.c_void_p:
    """An attr with nothing set but the user's scratchpad (made once, kept for the process)."""
    global _plain_attr
    if _plain_attr is None:
        lib = _lib()
        attr = ctypes.c_void_p()
        lib.call("dnnl_primitive_attr_create", ctypes.byref(attr))
        lib.call("dnnl_primitive_attr_set_scratchpad_mode", attr, SCRATCHPAD_MODE_USER)
        _plain_attr = attr
    return _plain_attr


def _thread_scratchpad(nbytes: int) -> int:
    """The address of the calling thread's scratchpad, grown to nbytes (a primitive runs on one
    thread at a time, and a thread runs one primitive at a time)."""
    held = getattr(_thread_state, "scratch", None)  # (buffer, its address): asked every run
    if held is None or held[0].nbytes < nbytes:
        from .weights import aligned_buffer
        buffer = aligned_buffer(nbytes)
        held = _thread_state.scratch = (buffer, buffer.ctypes.data)
    return held[1]


def post_ops_attr(build: Any) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
    """(attr, post_ops) handles: build(lib, post_ops) appends ops; caller frees with free_attr.
    The attr keeps the scratchpad in the user's hands (PrimitiveDesc)."""
    lib = _lib()
    attr = ctypes.c_void_p()
    ops = ctypes.c_void_p()
    lib.call("dnnl_primitive_attr_create", ctypes.byref(attr))
    lib.call("dnnl_primitive_attr_set_scratchpad_mode", attr, SCRATCHPAD_MODE_USER)
    lib.call("dnnl_post_ops_create", ctypes.byref(ops))
    try:
        build(lib, ops)
        lib.call("dnnl_primitive_attr_set_post_ops", attr, ops)
    except BaseException:
        free_attr(attr, ops)
        raise
    return attr, ops


def free_attr(attr: ctypes.c_void_p, ops: ctypes.c_void_p) -> None:
    lib = _lib()
    lib.raw["dnnl_post_ops_destroy"](ops)
    lib.raw["dnnl_primitive_attr_destroy"](attr)


def reorder(src: MemoryDesc, dst: MemoryDesc) -> PrimitiveDesc:
    """A reorder between two layouts of one tensor."""
    lib = _lib()
    return PrimitiveDesc("dnnl_reorder_primitive_desc_create", src.handle, lib.engine,
                         dst.handle, lib.engine, None)
