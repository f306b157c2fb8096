"""Row kernels on CUDA: layer_norm and rms_norm over the last axis, and attention's softmax with
its scale and mask, each one thread block per row in one launch.

Written against NumPy's API, CuPy ran each as 8-12 kernels with reductions and temporaries: on an
H200, BERT-base's 24 layer norms took 6.5 ms of a 27 ms batch-32 run and its attention softmax
most of another 13.6 (bench/cuda_models.py --profile). The kernels are compiled by NVRTC through
cupy.RawKernel once per dtype (CuPy keeps the binaries on disk). They do the reference's
arithmetic in its order: a NaN in a row propagates through max and sum as NumPy's does, and
nan_to_zero clears it after; sums accumulate in double. Launch geometry is fixed per shape, so a
run is capturable in a CUDA graph.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

# Each kernel is made for T (the element type) with ACC = double; NEG_INF is T's -inf.
_COMMON = r"""
typedef TYPE T;
typedef double ACC;
__device__ __forceinline__ ACC nan_max(ACC a, ACC b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ ACC warp_sum(ACC v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ ACC warp_max(ACC v) {
    for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* The block's total, returned to every thread (blockDim.x a multiple of 32, at most 1024). */
__device__ ACC block_sum(ACC v, ACC* shared) {
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? shared[threadIdx.x & 31] : (ACC)0;
    return warp_sum(v);
}
__device__ ACC block_max(ACC v, ACC* shared, ACC lowest) {
    v = warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? shared[threadIdx.x & 31] : lowest;
    return warp_max(v);
}
"""

_LAYER_NORM = r"""
extern "C" __global__ void gr_layer_norm(const T* x, const T* gamma, const T* beta, T* out,
                                         int n, double eps, int center, int scale) {
    __shared__ ACC shared[32];
    const T* xr = x + (long long)blockIdx.x * n;
    T* yr = out + (long long)blockIdx.x * n;
    ACC s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += (ACC)xr[i];
    ACC mean = block_sum(s, shared) / n;
    ACC q = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        ACC d = (ACC)xr[i] - mean;
        q += d * d;
    }
    ACC denom = sqrt(block_sum(q, shared) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        ACC y = ((ACC)xr[i] - mean) / denom;
        if (scale) y *= (ACC)gamma[i];
        if (center) y += (ACC)beta[i];
        yr[i] = (T)y;
    }
}
"""

_RMS_NORM = r"""
extern "C" __global__ void gr_rms_norm(const T* x, const T* gamma, T* out, int n, double eps) {
    __shared__ ACC shared[32];
    const T* xr = x + (long long)blockIdx.x * n;
    T* yr = out + (long long)blockIdx.x * n;
    ACC q = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) q += (ACC)xr[i] * (ACC)xr[i];
    ACC denom = sqrt(block_sum(q, shared) / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = (T)((ACC)xr[i] / denom * (ACC)gamma[i]);
}
"""

# Rows are (batch, head, query) in order; the mask (may be null) is read through its broadcast
# strides in elements (0 along a broadcast axis).
_SOFTMAX = r"""
extern "C" __global__ void gr_attention_softmax(
        T* s, const T* mask, int heads, int q_len, int n, T scale,
        long long mb, long long mh, long long mq, long long mk, int nan_to_zero) {
    __shared__ ACC shared[32];
    const ACC lowest = (ACC)NEG_INF;
    long long row = blockIdx.x;
    T* sr = s + row * n;
    const T* mr = mask;
    if (mask) {
        long long qi = row % q_len, h = (row / q_len) % heads, b = row / ((long long)q_len * heads);
        mr = mask + b * mb + h * mh + qi * mq;
    }
    ACC m = lowest;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        T v = sr[i] * scale;
        if (mask) v = v + mr[i * mk];
        sr[i] = v;
        m = nan_max(m, (ACC)v);
    }
    T top = (T)block_max(m, shared, lowest);
    ACC total = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        T e = exp(sr[i] - top);
        sr[i] = e;
        total += (ACC)e;
    }
    T sum = (T)block_sum(total, shared);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        T p = sr[i] / sum;
        sr[i] = (nan_to_zero && p != p) ? (T)0 : p;
    }
}
"""

_TYPES = {np.dtype(np.float32): ("float", "__int_as_float(0xff800000)"),
          np.dtype(np.float64): ("double", "__longlong_as_double(0xfff0000000000000LL)")}
_MAX_ROWS = 2**31 - 1


def takes(dtype: Any) -> bool:
    """Whether these kernels are made for dtype (float32, float64; float16 stays NumPy-API)."""
    return np.dtype(dtype) in _TYPES


@functools.lru_cache(maxsize=None)
def _kernel(body: str, name: str, dtype: np.dtype) -> Any:
    import cupy
    ctype, neg_inf = _TYPES[dtype]
    source = _COMMON.replace("TYPE", ctype) + body.replace("NEG_INF", neg_inf)
    return cupy.RawKernel(source, name)


def _threads(n: int) -> int:
    """Threads per row: a warp at least, about four elements each, 1024 at most."""
    threads = 32
    while threads < 1024 and threads * 4 < n:
        threads *= 2
    return threads


def broadcast_strides(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int
                      ) -> tuple[int, ...]:
    """Element strides reading an array broadcast to a shape of its rank: 0 along its dims of
    1 (the kernel reads them at index 0 whatever the index), its own elsewhere."""
    return tuple(0 if size == 1 else stride // itemsize for size, stride in zip(shape, strides))


def _contiguous(*arrays: Any) -> bool:
    return all(a.flags.c_contiguous for a in arrays)


class RowNorm:
    """layer_norm (center/scale as given) or rms_norm (gamma) over the last axis of a shape; a
    call returns False, doing nothing, when an array is not laid out as the kernel reads it
    (the caller then runs its NumPy-API version)."""

    def __init__(self, kind: str, shape: tuple[int, ...], dtype: Any, epsilon: float,
                 center: bool = True, scale: bool = True) -> None:
        self.kind, self.n = kind, int(shape[-1])  # shapes that fits() took: rank 1 or more
        self.rows = int(np.prod(shape[:-1], dtype=np.int64))
        self.dtype = np.dtype(dtype)
        self.eps, self.center, self.scale = float(epsilon), center, scale
        self.threads = _threads(self.n)

    @staticmethod
    def fits(shape: tuple[int, ...], axis: int, dtype: Any) -> bool:
        """The last axis, rows a grid can hold, an element type compiled for."""
        return (len(shape) >= 1 and axis == len(shape) - 1 and takes(dtype)
                and 0 < int(np.prod(shape[:-1], dtype=np.int64)) <= _MAX_ROWS
                and 0 < shape[-1] < 2**31)

    def __call__(self, x: Any, gamma: Any, *rest: Any) -> bool:
        out = rest[-1]
        if not _contiguous(x, gamma, out) or gamma.size != self.n:
            return False
        grid, block = (self.rows,), (self.threads,)
        n, eps = np.int32(self.n), np.float64(self.eps)
        if self.kind == "rms_norm":
            _kernel(_RMS_NORM, "gr_rms_norm", self.dtype)(grid, block, (x, gamma, out, n, eps))
            return True
        beta = rest[0]
        if not _contiguous(beta) or beta.size != self.n:
            return False
        _kernel(_LAYER_NORM, "gr_layer_norm", self.dtype)(
            grid, block, (x, gamma, beta, out, n, eps, np.int32(self.center),
                          np.int32(self.scale)))
        return True


class AttentionSoftmax:
    """scores (batch, heads, q_len, k_len), contiguous, in place: times scale, plus the mask
    broadcast, softmax over the last axis, NaN rows zeroed when nan_to_zero."""

    def __init__(self, batch: int, heads: int, q_len: int, k_len: int, dtype: Any,
                 scale: float, nan_to_zero: bool) -> None:
        self.full = (batch, heads, q_len, k_len)
        self.rows = batch * heads * q_len
        self.dtype = np.dtype(dtype)
        self.scale = self.dtype.type(scale)
        self.nan_to_zero = np.int32(nan_to_zero)
        self.threads = _threads(k_len)

    @staticmethod
    def fits(batch: int, heads: int, q_len: int, k_len: int, dtype: Any) -> bool:
        return takes(dtype) and 0 < batch * heads * q_len <= _MAX_ROWS and 0 < k_len < 2**31

    def __call__(self, scores: Any, mask: Any | None) -> bool:
        """mask: 4-D, each dim 1 or the scores' (the op's check), read with stride 0 where 1."""
        if not _contiguous(scores) or (mask is not None and mask.dtype != self.dtype):
            return False
        if mask is None:
            strides: tuple[int, ...] = (0, 0, 0, 0)
            mask_arg: Any = np.uintp(0)
        else:
            strides = broadcast_strides(mask.shape, mask.strides, self.dtype.itemsize)
            mask_arg = mask
        batch, heads, q_len, k_len = self.full
        _kernel(_SOFTMAX, "gr_attention_softmax", self.dtype)(
            (self.rows,), (self.threads,),
            (scores, mask_arg, np.int32(heads), np.int32(q_len), np.int32(k_len), self.scale,
             *(np.int64(s) for s in strides), self.nan_to_zero))
        return True
