"""Every GRAPH_RUNTIME_* environment setting: its values, default and meaning, read at use time."""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterator, TypeVar

from .errors import LibraryError


@dataclass(frozen=True)
class Setting:
    """One environment variable: the words it takes (empty: see values_text), default, meaning."""

    name: str
    default: str
    meaning: str
    values: tuple[str, ...] = ()
    values_text: str = ""

    @property
    def choices(self) -> tuple[str, ...]:
        """The values other than auto: what the setting can force."""
        return tuple(v for v in self.values if v != "auto")

    def allowed(self) -> str:
        """The allowed values for people: "auto, on or off", "auto or one of a, b, c"."""
        if self.values_text:
            return self.values_text
        if "auto" in self.values and len(self.values) > 3:
            return "auto or one of " + ", ".join(self.choices)
        return ", ".join(self.values[:-1]) + " or " + self.values[-1]


AUTO_ON_OFF = ("auto", "on", "off")

NUM_THREADS = Setting(
    "GRAPH_RUNTIME_NUM_THREADS", "", "workers per parallel CPU loop",
    values_text="a positive integer")
CONV = Setting(
    "GRAPH_RUNTIME_CONV", "auto",
    "CPU conv2d strategy: auto measures each that applies, a name forces it where it applies "
    "(im2col elsewhere)",
    ("auto", "im2col", "im2col_rows", "im2col_channels", "im2col_serial", "gemm1x1",
     "gemm1x1_split", "depthwise", "depthwise_jit", "winograd", "winograd4", "onednn",
     "onednn_swish"))
OPENCL_CONV = Setting(
    "GRAPH_RUNTIME_OPENCL_CONV", "auto",
    "OpenCL conv2d method: auto measures Winograd against the GEMM method, a name forces it "
    "where it applies (auto elsewhere)",
    ("auto", "direct", "panel", "im2col", "winograd", "winograd4"))
GEMV_PADDING = Setting(
    "GRAPH_RUNTIME_GEMV_PADDING", "auto",
    "batch-1 dense: zero rows up to OpenBLAS's threading threshold (auto: where measured faster; "
    "not offered beside oneDNN on OpenMP threads)",
    AUTO_ON_OFF)
TEAM_GEMV = Setting(
    "GRAPH_RUNTIME_TEAM_GEMV", "auto",
    "dense of at most 8 float32 rows: split over oneDNN's OpenMP team by weight rows, at the "
    "memory's speed (auto: where measured faster, and for a symbolic module's new shapes)",
    AUTO_ON_OFF)
TEAM_GEMV_LAYOUT = Setting(
    "GRAPH_RUNTIME_TEAM_GEMV_LAYOUT", "auto",
    "how team_gemv reads a weight that keeps its values: packed (eight rows interleaved, one "
    "stream a thread) or as given (auto: measured once per machine, packed unless as given is "
    "clearly faster; as given for a module whose storage fits in half the last-level cache)",
    ("auto", "packed", "given"))
VECTOR_WIDTH = Setting(
    "GRAPH_RUNTIME_VECTOR_WIDTH", "auto",
    "vector width of the compiled loops of long rows (softmax, elementwise chains): 512-bit or "
    "LLVM's default 256 on AVX-512 (auto: 512 on CPUs that keep their clock with it: AVX-512 "
    "FP16, AMD Zen 4 on); read once",
    ("auto", "256", "512"))
DENSE_TRANSPOSE = Setting(
    "GRAPH_RUNTIME_DENSE_TRANSPOSE", "auto",
    "batched dense: keep the weight transposed (auto: where measured faster)", AUTO_ON_OFF)
DENSE_SPLIT = Setting(
    "GRAPH_RUNTIME_DENSE_SPLIT", "off",
    "batched dense: split output columns over the CPU workers (auto: where measured faster)",
    AUTO_ON_OFF)
DENSE_TILES = Setting(
    "GRAPH_RUNTIME_DENSE_TILES", "auto",
    "batched dense: output tiles on the CPU workers with OpenBLAS at one thread, the chain's "
    "tail per tile (auto: the tiling measured fastest; off: OpenBLAS's threads)",
    ("auto", "whole", "cols", "rows", "off"))
ATTENTION_SPLIT = Setting(
    "GRAPH_RUNTIME_ATTENTION_SPLIT", "auto",
    "CPU attention: blocks of heads on the CPU workers (auto: where measured faster)",
    AUTO_ON_OFF)
OPENCL_GEMM = Setting(
    "GRAPH_RUNTIME_OPENCL_GEMM", "tiled",
    "OpenCL GEMM: our kernels, CLBlast, or CLBlast where it can serve the shape",
    ("tiled", "clblast", "auto"))
TUNING_CACHE = Setting(
    "GRAPH_RUNTIME_TUNING_CACHE", "",
    "folder of the tuning cache (default $XDG_CACHE_HOME/graph_runtime, else "
    "~/.cache/graph_runtime); off keeps choices in the process only",
    values_text="a folder, or off")
TUNING_BUSY = Setting(
    "GRAPH_RUNTIME_TUNING_BUSY", "retry",
    "a choice measured while other processes kept the CPUs busy: retry (kept in the process, "
    "measured again by the next one), keep (trusted as any other: for machines always busy)",
    ("retry", "keep"))
TUNING_CONFIRM = Setting(
    "GRAPH_RUNTIME_TUNING_CONFIRM", "2",
    "how many measurements in a row, each by its own process, must agree before a tuning "
    "choice other than the default kernel is taken from the tuning cache without measuring "
    "(one outlying sample once pinned a slower kernel for every later process); 1 trusts the "
    "first", values_text="a positive integer")
SHAPE_TUNING = Setting(
    "GRAPH_RUNTIME_SHAPE_TUNING", "class",
    "a module with symbolic dims meeting a new shape in run(): class takes each tuning choice "
    "for the shape's size class (dims over 16 rounded up to a power of two) from this process "
    "or the tuning file, else the default kernel, and measures nothing; measure races the "
    "candidates there and then, as create() does for a static module", ("class", "measure"))
SHAPE_CACHE_BYTES = Setting(
    "GRAPH_RUNTIME_SHAPE_CACHE_BYTES", "1073741824",
    "most bytes (storage pools and workspace, params and the packed copies kernels share of "
    "them not counted; a buffer or kernel several shapes share counted once) a module with "
    "symbolic dims "
    "keeps across the shapes it has run: the least recently used shapes are dropped beyond it "
    "(the shape in use is always kept)", values_text="a non-negative integer")
GC_FREEZE = Setting(
    "GRAPH_RUNTIME_GC_FREEZE", "once",
    "once: when the first module with symbolic dims is made, Python's collector is run and "
    "every object alive then (the libraries' code, the model) is moved out of its reach "
    "(gc.freeze), so the full collections each new shape's objects bring on scan thousands of "
    "objects, not some 150,000 (65 ms each); off leaves the collector alone",
    ("once", "off"))

CACHE_DIR = Setting(
    "GRAPH_RUNTIME_CACHE_DIR", "",
    "folder of generated code (compiled CPU chains and their machine code; default "
    "$XDG_CACHE_HOME/graph_runtime, else ~/.cache/graph_runtime)",
    values_text="a folder")
CHAIN_JIT = Setting(
    "GRAPH_RUNTIME_CHAIN_JIT", "auto",
    "CPU elementwise chains as one compiled pass (off: one NumPy pass per op)", AUTO_ON_OFF)
IMPORT_FUSE = Setting(
    "GRAPH_RUNTIME_IMPORT_FUSE", "on",
    "graphrun import runs its prim-level rewrite passes (GELU, LayerNorm, attention, Q/K/V "
    "packing, the int8 ones: graphrun import --list-passes)", ("on", "off"))
IMPORT_INT8 = Setting(
    "GRAPH_RUNTIME_IMPORT_INT8", "on",
    "graphrun import makes quantized models' integer ops (QDQ patterns, ConvInteger / "
    "MatMulInteger with constant weights, DynamicQuantizeLinear: CPU only; off: dequantize, "
    "compute in float, quantize, on every device)", ("on", "off"))

ONEDNN = Setting(
    "GRAPH_RUNTIME_ONEDNN", "auto",
    "CPU kernels from oneDNN: auto offers them where the library loads (measured per shape), on "
    "uses them wherever they apply (a missing library is an error), off never",
    AUTO_ON_OFF)
ONEDNN_LIB = Setting(
    "GRAPH_RUNTIME_ONEDNN_LIB", "",
    "path of a libdnnl.so.3 to load (default: the environment's lib/, then the system's); only "
    "oneDNN 3.2 is accepted",
    values_text="a file path")
ONEDNN_THREADS = Setting(
    "GRAPH_RUNTIME_ONEDNN_THREADS", "auto",
    "how oneDNN's kernels use the cores: openmp (its own threads inside each primitive: fastest "
    "on cores nothing else uses), workers (single-threaded primitives over the runtime's "
    "workers, which pull work: robust beside a busy process), auto (openmp unless another "
    "process keeps one of this process's CPUs busy when the first oneDNN kernel is made, then "
    "the workers, one per CPU left; looked at again as modules run, which then make their "
    "kernels in the new mode)",
    ("auto", "openmp", "workers"))
ONEDNN_PIN = Setting(
    "GRAPH_RUNTIME_ONEDNN_PIN", "on",
    "in OpenMP mode, oneDNN's team threads (not the calling thread) each kept on a CPU of their "
    "own: a team thread woken after an idle pause is then never placed on the caller's CPU, "
    "where it waited for a timer tick while the caller spun at the barrier (4-11 ms a run); "
    "skipped where OMP_PROC_BIND, OMP_PLACES or GOMP_CPU_AFFINITY bind the threads (off: "
    "libgomp places them)", ("on", "off"))
REPLAY = Setting(
    "GRAPH_RUNTIME_REPLAY", "on",
    "a module's steps on the CPU whose calls are only oneDNN primitives and OpenMP-team kernels: "
    "their foreign calls recorded at the second run() and replayed after from one compiled "
    "loop, consecutive steps in one call with no Python between them (off: each step called "
    "from Python every run)", ("on", "off"))
CUDA_GRAPHS = Setting(
    "GRAPH_RUNTIME_CUDA_GRAPHS", "on",
    "a module on one GPU: its second run() captured as a CUDA graph and every later run() "
    "replayed from it, one launch instead of one per kernel (off: each kernel launched from "
    "Python every run)", ("on", "off"))
CUDA_TF32 = Setting(
    "GRAPH_RUNTIME_CUDA_TF32", "on",
    "float32 products and convolutions on CUDA multiply on TF32 tensor cores (inputs rounded to "
    "10 mantissa bits, sums kept in float32), as ONNX Runtime's CUDA provider and cuDNN's "
    "convolutions do by default: several times faster at large batch, about 1e-3 relative "
    "error in those products (off: full float32; GPUs before Ampere compute float32 either way)",
    ("on", "off"))
CUDA_CUDNN = Setting(
    "GRAPH_RUNTIME_CUDA_CUDNN", "auto",
    "convolutions on CUDA through cuDNN where it is installed (nvidia-cudnn-cu12/-cu13) and "
    "takes them: its measured-fastest algorithm, a chain's bias, residual and relu in the same "
    "call; auto: where it also measures faster than im2col and a cuBLAS product when the "
    "kernel is made (each replayed as a CUDA graph), on: wherever it takes them, off: never",
    ("auto", "on", "off"))
IN_PLACE = Setting(
    "GRAPH_RUNTIME_IN_PLACE", "on",
    "kernels that can write an output over an input dying there (oneDNN's conv adding its "
    "residual; a static module's reshapes, then skipped) get the input's storage, where the "
    "storage plan allows (off: a copy first)",
    ("on", "off"))

LOOP_MAX_ITERATIONS = Setting(
    "GRAPH_RUNTIME_LOOP_MAX_ITERATIONS", "1048576",
    "most iterations one ONNX Loop node may run (a Loop driven by its condition alone, or "
    "with a huge trip count, stops with an error naming the node instead of running forever)",
    values_text="a positive integer")

SETTINGS = (NUM_THREADS, CONV, OPENCL_CONV, GEMV_PADDING, TEAM_GEMV, TEAM_GEMV_LAYOUT,
            VECTOR_WIDTH,
            DENSE_TRANSPOSE, DENSE_SPLIT,
            DENSE_TILES, ATTENTION_SPLIT, OPENCL_GEMM, TUNING_CACHE, TUNING_BUSY, TUNING_CONFIRM,
            SHAPE_TUNING,
            SHAPE_CACHE_BYTES, GC_FREEZE, CACHE_DIR,
            CHAIN_JIT, IMPORT_FUSE, IMPORT_INT8, ONEDNN, ONEDNN_LIB, ONEDNN_THREADS, ONEDNN_PIN,
            IN_PLACE, REPLAY,
            CUDA_GRAPHS, CUDA_TF32, CUDA_CUDNN,
            LOOP_MAX_ITERATIONS)


_T = TypeVar("_T")
_held = threading.local()  # .values: what a held() scope has read on this thread


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Inside, each setting (and each held_value) is read once on this thread: preparing one
    dense product read the environment 38 times and the CPU affinity 13 times, 55 of its
    350 us (docs/measurements.md). A module's build holds them; a nested scope shares its
    outer one's values."""
    if getattr(_held, "values", None) is not None:
        yield
        return
    _held.values = {}
    try:
        yield
    finally:
        _held.values = None


@contextlib.contextmanager
def overridden(setting: Setting, value: str | None) -> Iterator[None]:
    """Inside, setting reads value (None: leaves it as it is); the environment is restored
    after. For a command's own process: the environment is the process's."""
    if value is None:
        yield
        return
    old = os.environ.get(setting.name)
    os.environ[setting.name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(setting.name, None)
        else:
            os.environ[setting.name] = old


def held_value(key: Hashable, read: Callable[[], _T]) -> _T:
    """read(), or inside held() the value it gave first there (key: what decides it)."""
    values = getattr(_held, "values", None)
    if values is None:
        return read()
    if key not in values:
        values[key] = read()
    return values[key]  # type: ignore[no-any-return]


def _raw(setting: Setting) -> str:
    return held_value(setting.name, lambda: os.environ.get(setting.name, "").strip())


def _refuse(setting: Setting, found: str) -> LibraryError:
    return LibraryError(f"{setting.name} must be {setting.allowed()}, got {found!r}")


def word(setting: Setting) -> str:
    """The setting's value, one of setting.values (the default when unset or empty)."""
    value = _raw(setting).lower() or setting.default
    if value not in setting.values:
        raise _refuse(setting, value)
    return value


def num_threads() -> int | None:
    """GRAPH_RUNTIME_NUM_THREADS as a positive integer, or None when unset."""
    value = _raw(NUM_THREADS)
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise _refuse(NUM_THREADS, value)
    return int(value)


# the environment variables by which a user binds libgomp's threads to CPUs
OPENMP_BINDING = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")


def openmp_bound_by_user() -> bool:
    """Whether OpenMP's own variables bind its threads (ONEDNN_PIN then keeps out)."""
    return any(os.environ.get(name) for name in OPENMP_BINDING)


def loop_max_iterations() -> int:
    """GRAPH_RUNTIME_LOOP_MAX_ITERATIONS as a positive integer (its default when unset)."""
    return _int_setting(LOOP_MAX_ITERATIONS, 1)


def tuning_confirm() -> int:
    """GRAPH_RUNTIME_TUNING_CONFIRM as a positive integer (its default when unset)."""
    return _int_setting(TUNING_CONFIRM, 1)


def shape_cache_bytes() -> int:
    """GRAPH_RUNTIME_SHAPE_CACHE_BYTES as a non-negative integer (its default when unset)."""
    return _int_setting(SHAPE_CACHE_BYTES, 0)


def _int_setting(setting: Setting, minimum: int) -> int:
    """The setting (its default when unset) as an integer of at least minimum, else refused."""
    value = _raw(setting) or setting.default
    if not value.isdigit() or int(value) < minimum:
        raise _refuse(setting, value)
    return int(value)


def onednn_lib() -> str | None:
    """GRAPH_RUNTIME_ONEDNN_LIB: the libdnnl.so.3 to load, or None to search the usual places."""
    return _raw(ONEDNN_LIB) or None


def tuning_cache_dir() -> Path | None:
    """The folder of the tuning cache, or None when GRAPH_RUNTIME_TUNING_CACHE is off."""
    value = _raw(TUNING_CACHE)
    if value.lower() == "off":
        return None
    if value:
        return Path(value).expanduser()
    return _user_cache()


def cache_dir() -> Path:
    """The folder of generated code: GRAPH_RUNTIME_CACHE_DIR, else the user's cache folder."""
    value = _raw(CACHE_DIR)
    return Path(value).expanduser() if value else _user_cache()


def _user_cache() -> Path:
    home = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(home) if home else Path.home() / ".cache"
    return base / "graph_runtime"
