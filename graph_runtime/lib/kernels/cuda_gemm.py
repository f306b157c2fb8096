"""Matrix products on CUDA through cuBLAS called directly, so a run can be captured as a CUDA graph.

CuPy refuses every cuBLAS call while a stream is being captured (cupy/cupy#6290: its handle's
stream is reset on each call, which it does not allow during capture). cuBLAS itself supports
capture when the handle keeps one stream and a workspace of its own (cuBLAS's "CUDA graphs
support"), so the kernels' products go through this module: one handle per GPU, bound to the
backend's stream, with a fixed workspace, calling cublasGemmStridedBatchedEx on the operands'
own strides (row-major operands as the transposed column-major problem). Products it cannot
express (other dtypes, operands whose rows and columns are both strided) go to cupy.matmul,
which copies them; such a kernel is then not capturable, and capture falls back to plain runs.
"""
from __future__ import annotations

import ctypes
import importlib
import itertools
import threading
from typing import Any, Callable

import numpy as np

from ... import settings

# cuBLAS's and CUDA's enum values (cublas_api.h, library_types.h)
_OP_N, _OP_T = 0, 1
_CUDA_R_32F, _CUDA_R_64F, _CUDA_R_16F = 0, 1, 2
_COMPUTE_32F, _COMPUTE_64F, _COMPUTE_32F_FAST_TF32 = 68, 70, 77
_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20  # what cuBLAS asks for on Hopper (its docs' cublasSetWorkspace)

# dtype -> (cudaDataType, compute type, scalar type of alpha and beta)
_TYPES: dict[np.dtype, tuple[int, int, Any]] = {
    np.dtype(np.float32): (_CUDA_R_32F, _COMPUTE_32F, ctypes.c_float),
    np.dtype(np.float16): (_CUDA_R_16F, _COMPUTE_32F, ctypes.c_float),
    np.dtype(np.float64): (_CUDA_R_64F, _COMPUTE_64F, ctypes.c_double),
}
_INT_MAX = 2**31 - 1


class CublasError(RuntimeError):
    """A cuBLAS call returned a status other than success."""


def loaded_library(soname: str) -> str | None:
    """The path of a library this process has loaded already whose file name starts with
    soname ("libcublas.so"), from /proc/self/maps; None where none is (or no maps file)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if path.rsplit("/", 1)[-1].startswith(soname):
                    return path
    except OSError:
        pass
    return None


def _load_cublas() -> ctypes.CDLL:
    """The libcublas CuPy loaded (found in this process's maps), else the first soname found."""
    importlib.import_module("cupy_backends.cuda.libs.cublas")  # loads libcublas
    loaded = loaded_library("libcublas.so")
    if loaded is not None:
        return ctypes.CDLL(loaded)
    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise CublasError("libcublas could not be found (CuPy's cuBLAS is not loaded)")


class _Handle:
    """One cuBLAS handle on one GPU, its stream and workspace set before each product."""

    def __init__(self, lib: ctypes.CDLL, device_id: int) -> None:
        import cupy
        self.lib = lib
        self.handle = ctypes.c_void_p()
        with cupy.cuda.Device(device_id):
            _check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
            self.workspace = cupy.cuda.alloc(WORKSPACE_BYTES)  # held as long as the handle
        self.stream = -1
        self.lock = threading.Lock()

    def bind(self, stream: int) -> None:
        """Run on stream; cublasSetStream resets the workspace, so it is set again after."""
        if stream != self.stream:
            _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)),
                   "cublasSetStream")
            _check(self.lib.cublasSetWorkspace_v2(self.handle,
                                                  ctypes.c_void_p(self.workspace.ptr),
                                                  ctypes.c_size_t(WORKSPACE_BYTES)),
                   "cublasSetWorkspace")
            self.stream = stream


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasError(f"{what} returned cuBLAS status {status}")


_state: dict[str, Any] = {"lib": None, "handles": {}}
_state_lock = threading.Lock()


def _handle(device_id: int) -> _Handle:
    handles: dict[int, _Handle] = _state["handles"]
    found = handles.get(device_id)
    if found is not None:
        return found
    with _state_lock:
        if _state["lib"] is None:
            lib = _load_cublas()
            lib.cublasGemmStridedBatchedEx.argtypes = [
                ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                ctypes.c_int, ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_int]
            _state["lib"] = lib
        if device_id not in handles:
            handles[device_id] = _Handle(_state["lib"], device_id)
    return handles[device_id]


def _matrix(rows: int, cols: int, row_stride: int, col_stride: int
            ) -> tuple[bool, int] | None:
    """(row_major, leading dimension) of a rows x cols view with these element strides, or
    None where neither rows nor columns are unit-strided (cuBLAS cannot read it in place)."""
    if cols == 1 or col_stride == 1:
        ld = row_stride if rows > 1 else cols
        if ld >= max(cols, 1):
            return True, ld
    if rows == 1 or row_stride == 1:
        ld = col_stride if cols > 1 else rows
        if ld >= max(rows, 1):
            return False, ld
    return None


def _merged_batch(shape: tuple[int, ...], strides: list[tuple[int, ...]]
                  ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Batch dims of size 1 dropped and neighbours merged where every operand's strides allow:
    the fewest loops around the strided-batched call."""
    dims = [(n, [s[i] for s in strides]) for i, n in enumerate(shape) if n != 1]
    merged: list[tuple[int, list[int]]] = []
    for n, st in dims:
        if merged:
            pn, pst = merged[-1]
            if all(p == q * n for p, q in zip(pst, st)):
                merged[-1] = (pn * n, st)
                continue
        merged.append((n, st))
    if not merged:
        return (1,), [(0,) for _ in strides]
    return (tuple(n for n, _ in merged),
            [tuple(st[k] for _, st in merged) for k in range(len(strides))])


def cublas_matmul(a: Any, b: Any, out: Any, tf32: bool = False) -> bool:
    """out = a @ b (NumPy's matmul broadcasting, 2-D or more) through cuBLAS on the current
    stream; False (nothing done) where the dtypes or layouts are not ones it takes. tf32: float32
    products multiply on TF32 tensor cores (GRAPH_RUNTIME_CUDA_TF32)."""
    import cupy
    dtype = out.dtype
    if (a.ndim < 2 or b.ndim < 2 or a.dtype != dtype or b.dtype != dtype
            or dtype not in _TYPES):
        return False
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if b.shape[-2] != k or out.shape[-2:] != (m, n) or min(m, n, k) == 0:
        return False
    if max(m, n, k) > _INT_MAX:
        return False
    batch = out.shape[:-2]
    try:
        av = cupy.broadcast_to(a, batch + (m, k))
        bv = cupy.broadcast_to(b, batch + (k, n))
    except ValueError:
        return False
    size = dtype.itemsize
    st = [tuple(s // size for s in x.strides) for x in (av, bv, out)]
    if any(s % size for x in (av, bv, out) for s in x.strides):
        return False
    a_layout = _matrix(m, k, st[0][-2], st[0][-1])
    b_layout = _matrix(k, n, st[1][-2], st[1][-1])
    c_layout = _matrix(m, n, st[2][-2], st[2][-1])
    if a_layout is None or b_layout is None or c_layout is None or not c_layout[0]:
        return False
    shape, batch_strides = _merged_batch(batch, [s[:-2] for s in st])
    if any(s < 0 for bs in batch_strides for s in bs):
        return False  # reversed views: cupy.matmul copies them
    if batch_strides[2][-1] == 0 and shape[-1] > 1:
        return False  # an output written twice: no product means that
    handle = _handle(out.device.id)
    data_type, compute, scalar = _TYPES[dtype]
    if tf32 and dtype == np.float32:
        compute = _COMPUTE_32F_FAST_TF32
    alpha, beta = scalar(1.0), scalar(0.0)
    # C (m x n, row-major) = A B is C^T (n x m, column-major) = B^T A^T: B goes first.
    trans_b = _OP_N if b_layout[0] else _OP_T
    trans_a = _OP_N if a_layout[0] else _OP_T
    inner, outer = shape[-1], shape[:-1]
    sa, sb, sc = batch_strides[0][-1], batch_strides[1][-1], batch_strides[2][-1]
    stream = cupy.cuda.get_current_stream().ptr
    with handle.lock:
        handle.bind(stream)
        for index in itertools.product(*(range(x) for x in outer)):
            offs = [sum(i * s for i, s in zip(index, bs[:-1])) * size for bs in batch_strides]
            _check(handle.lib.cublasGemmStridedBatchedEx(
                handle.handle, trans_b, trans_a, n, m, k, ctypes.byref(alpha),
                ctypes.c_void_p(bv.data.ptr + offs[1]), data_type, b_layout[1], sb,
                ctypes.c_void_p(av.data.ptr + offs[0]), data_type, a_layout[1], sa,
                ctypes.byref(beta), ctypes.c_void_p(out.data.ptr + offs[2]), data_type,
                c_layout[1], sc, inner, compute, _GEMM_DEFAULT), "cublasGemmStridedBatchedEx")
    return True


def matmul_function(xp: Any) -> Callable[..., Any]:
    """xp.matmul's calling convention (a, b, out=None) for kernels written against NumPy's API:
    NumPy's own on the host, cuBLAS called directly on CUDA (capturable), cupy.matmul where
    cuBLAS cannot take the operands as they lie. GRAPH_RUNTIME_CUDA_TF32 is read here, when
    the kernel is made, so a module keeps the precision it was created with."""
    if xp is np:
        return np.matmul
    tf32 = settings.word(settings.CUDA_TF32) == "on"

    def matmul(a: Any, b: Any, out: Any = None) -> Any:
        if out is None:
            if a.ndim < 2 or b.ndim < 2:
                return xp.matmul(a, b)
            shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2],
                                                                       b.shape[-1])
            out = xp.empty(shape, np.result_type(a.dtype, b.dtype))
        if not cublas_matmul(a, b, out, tf32):
            xp.matmul(a, b, out=out)
        return out
    return matmul
