"""Batched GEMM on OpenCL: kernels of our own (picked per device type), or CLBlast (pyclblast)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .... import settings
from ....errors import LibraryError
from .gemm_cpu import packed_gemm
from .gemm_dot import dot_gemm
from .gemm_local import local_gemm

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend

# Our kernel families: "local" (work-group tiles staged in local memory, for GPUs), "packed" and
# "dot" (private register blocks, for CPU devices: gemm_cpu.py, gemm_dot.py),
# "direct" (one work-item per output; gemm_local.py).
VARIANTS = ("local", "packed", "dot", "direct")
# On a CPU device, dense-like products (A (M, K), B (N, K)) with fewer rows than this use the dot
# kernel: packing B costs O(NK) and pays off only over many rows (where the two cross on PoCL:
# docs/measurements.md).
DOT_MAX_M = 64
# On a GPU, thinner than this (rows or K), one work-item per output element beats any tile.
DIRECT_MAX_M = 4
DIRECT_MAX_K = 16
# On a CPU device only a tiny product (M*N*K) runs the direct kernel: one launch instead of
# three; beyond it PoCL's per-work-item cost makes it much slower than packed.
CPU_DIRECT_MAX_MACS = 1 << 15


@dataclass(frozen=True)
class GemmShape:
    """C[b] = op(A[b]) @ op(B[b]) for b < batch; strides and offsets in elements.

    A is logically M x K (stored K x M when trans_a), B logically K x N (stored N x K when
    trans_b), C is M x N with row stride ldc. Operand batch index is b % x_batches, so 1 batch
    broadcasts and (N*G, G) reads a per-group weight for convolution.
    """

    m: int
    n: int
    k: int
    dtype: str
    trans_a: bool = False
    trans_b: bool = False
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    batch: int = 1
    a_batches: int = 1
    b_batches: int = 1
    a_stride: int = 0
    b_stride: int = 0
    c_stride: int = 0

    def with_defaults(self) -> "GemmShape":
        """Fill zero leading dimensions with the packed ones."""
        lda = self.lda or max(self.m if self.trans_a else self.k, 1)
        ldb = self.ldb or max(self.k if self.trans_b else self.n, 1)
        ldc = self.ldc or max(self.n, 1)
        return GemmShape(self.m, self.n, self.k, self.dtype, self.trans_a, self.trans_b, lda, ldb,
                         ldc, self.batch, self.a_batches, self.b_batches, self.a_stride,
                         self.b_stride, self.c_stride)


def clblast_available() -> bool:
    """Whether pyclblast imports (it needs the CLBlast shared library, e.g. libclblast-dev)."""
    try:
        importlib.import_module("pyclblast")
    except ImportError:
        return False
    return True


def is_cpu_device(backend: OpenCLBackend, device_id: int) -> bool:
    """Whether opencl:device_id is a CPU (CL_DEVICE_TYPE_CPU), e.g. PoCL's pthread device."""
    import pyopencl as cl
    return bool(backend.cl_device(device_id).type & cl.device_type.CPU)


def pick_variant(shape: GemmShape, cpu: bool) -> str:
    """The kernel family of VARIANTS that serves shape best on a CPU or a GPU device.

    GPUs get local-memory tiles. A CPU (PoCL) has no real local memory, so barriers only cost;
    there private register blocks on contiguous (packed) panels win (bench/opencl_gemm.py).
    """
    s = shape.with_defaults()
    if cpu:
        if s.trans_b and not s.trans_a and s.m < DOT_MAX_M:
            return "dot"
        return "direct" if s.m * s.n * s.k <= CPU_DIRECT_MAX_MACS else "packed"
    if s.m <= DIRECT_MAX_M or s.k <= DIRECT_MAX_K:
        return "direct"
    return "local"


def tiled_gemm(backend: OpenCLBackend, device_id: int, shape: GemmShape,
               tile: tuple[int, int, int, int, int] | None = None,
               variant: str | None = None) -> Callable[[Any, Any, Any], None]:
    """run(a, b, c) computing shape's GEMM with our kernels; arrays may be views.

    Args:
        tile: (TSM, TSN, TSK, WM, WN) for the "local" variant (the default depends on M).
        variant: one of VARIANTS; None picks by device type and shape (pick_variant).
    """
    s = shape.with_defaults()
    if variant is None:
        variant = pick_variant(s, is_cpu_device(backend, device_id))
    if variant not in VARIANTS:
        raise LibraryError(f"gemm: variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    if s.m == 0 or s.n == 0 or s.batch == 0:
        return _nothing
    if variant == "packed":
        return packed_gemm(backend, device_id, s)
    if variant == "dot":
        if s.trans_a or not s.trans_b:
            raise LibraryError(f"gemm: the dot variant needs A (M, K) and B (N, K) (trans_a "
                               f"False, trans_b True), got trans_a={s.trans_a}, "
                               f"trans_b={s.trans_b}")
        return dot_gemm(backend, device_id, s)
    return local_gemm(backend, device_id, s, variant == "direct", tile)


def clblast_gemm(backend: OpenCLBackend, device_id: int,
                 shape: GemmShape) -> Callable[[Any, Any, Any],
                                                                             None]:
    """run(a, b, c) through CLBlast (pyclblast); LibraryError when it cannot serve shape."""
    s = shape.with_defaults()
    try:
        import pyclblast
    except ImportError as e:
        raise LibraryError("gemm: pyclblast is not installed (pip install pyclblast; it needs "
                           "the CLBlast library, e.g. Debian's libclblast-dev)") from e
    if s.dtype not in ("float32", "float64"):
        raise LibraryError(f"gemm: the CLBlast path takes float32 or float64, got {s.dtype}")
    if s.a_batches not in (1, s.batch) or s.b_batches not in (1, s.batch):
        raise LibraryError("gemm: the CLBlast path cannot cycle a per-group operand over batches")
    queue = backend.queue(device_id)
    itemsize = np.dtype(s.dtype).itemsize
    if s.m == 0 or s.n == 0 or s.batch == 0:
        return _nothing
    a_bs = s.a_stride if s.a_batches > 1 else 0
    b_bs = s.b_stride if s.b_batches > 1 else 0
    # NOTE: CLBlast refuses a zero C stride even for one batch.
    c_bs = s.c_stride or s.m * s.ldc

    def run(a: Any, b: Any, c: Any) -> None:
        if s.k == 0:
            # NOTE: CLBlast refuses K == 0; the product is all zeros.
            c.fill(0)
            return
        # NOTE: pyclblast uses each array's buffer but not its offset; pass it in elements.
        offsets = {"a_offset": a.offset // itemsize, "b_offset": b.offset // itemsize,
                   "c_offset": c.offset // itemsize}
        a2 = _as_matrix(a)
        b2 = _as_matrix(b)
        c2 = _as_matrix(c)
        # One routine for every batch count: each CLBlast routine costs a long first compile.
        pyclblast.gemmStridedBatched(queue, s.m, s.n, s.k, s.batch, a2, b2, c2, s.lda, s.ldb,
                                     s.ldc, a_stride=a_bs, b_stride=b_bs, c_stride=c_bs,
                                     a_transp=s.trans_a, b_transp=s.trans_b, **offsets)
    return run


def _nothing(a: Any, b: Any, c: Any) -> None:
    """The GEMM of an empty output."""


def _as_matrix(arr: Any) -> Any:
    return arr.reshape(-1, 1) if arr.ndim != 2 else arr


def chosen_variant(backend: OpenCLBackend, device_id: int, shape: GemmShape,
                   impl: str | None = None) -> str | None:
    """The kernel family of VARIANTS make_gemm would run for shape, or None for CLBlast."""
    impl = _impl(impl)
    if impl == "clblast" or (impl == "auto" and _clblast_serves(shape)):
        return None
    return pick_variant(shape, is_cpu_device(backend, device_id))


def make_gemm(backend: OpenCLBackend, device_id: int, shape: GemmShape,
              impl: str | None = None) -> Callable[[Any, Any, Any], None]:
    """run(a, b, c) for shape.

    Args:
        impl: "tiled" (our kernels), "clblast", or "auto" (CLBlast when importable and able to
            serve shape, else tiled). None reads $GRAPH_RUNTIME_OPENCL_GEMM, default "tiled":
            on PoCL our CPU kernels beat CLBlast by far (bench/opencl_gemm.py), need no
            CLBlast compile on first use, and also serve float16 and per-group weights.
    """
    impl = _impl(impl)
    if impl == "clblast" or (impl == "auto" and _clblast_serves(shape)):
        return clblast_gemm(backend, device_id, shape)
    return tiled_gemm(backend, device_id, shape)


def _impl(impl: str | None) -> str:
    if impl is None:
        return settings.word(settings.OPENCL_GEMM)
    if impl not in settings.OPENCL_GEMM.values:
        raise LibraryError(f"gemm: impl {impl!r}: expected 'tiled', 'clblast' or 'auto'")
    return impl


def _clblast_serves(shape: GemmShape) -> bool:
    """Whether "auto" takes CLBlast: importable and able to serve shape (see clblast_gemm)."""
    return (clblast_available() and shape.dtype in ("float32", "float64")
            and shape.a_batches in (1, shape.batch) and shape.b_batches in (1, shape.batch))
