"""Convolutions on CUDA through cuDNN's C API (ctypes), capturable in a CUDA graph.

Without it a CUDA conv2d is im2col plus a cuBLAS product (ops/conv.py): ResNet-50 at batch 32
ran 1.36x ONNX Runtime's CUDA provider, which calls cuDNN. Here conv2d is
cudnnConvolutionForward, and a conv2d whose chain adds a per-channel bias and/or a residual and
then applies relu is one cudnnConvolutionBiasActivationForward, y = relu(conv(x, w) + z + bias),
the fusion ONNX Runtime's CUDA provider makes. These are cuDNN's descriptor ("legacy") calls,
which cuDNN 9 still ships and ONNX Runtime's CUDA provider calls; they run on the handle's
stream, bound to the backend's, so a run can be captured. Where cuDNN takes a convolution,
ops/conv.py measures it against im2col once per shape (GRAPH_RUNTIME_CUDA_CUDNN=auto): on an
H200, cuBLAS's product won most of ResNet-50's convolutions at batch 1, cuDNN most at 32.

The algorithm is chosen when the kernel is made, by cuDNN's own measurement on scratch arrays
(cudnnFindConvolutionForwardAlgorithmEx, as ONNX Runtime's default exhaustive search does), once
per shape and math mode in a process, never inside a captured run; its workspace is allocated
then and kept. float32 multiplies on TF32 tensor cores when GRAPH_RUNTIME_CUDA_TF32 is on
(cuDNN's default math), else with FMA kernels only; float64 as is. What cuDNN is not asked to do
(unequal top/bottom or left/right padding, float16, an empty size, cuDNN not installed,
GRAPH_RUNTIME_CUDA_CUDNN=off) stays with the im2col kernel: cudnn_refusal says why.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ... import settings
from ...backends import get_backend
from ..conv_params import ConvParams
from ..library import TensorSpec
from ..prepared import PreparedKernel
from .cuda_gemm import loaded_library

# cuDNN's enum values (cudnn_graph.h, cudnn_cnn.h, cudnn_ops.h of cuDNN 9)
_DATA_FLOAT, _DATA_DOUBLE = 0, 1
_NCHW = 0
_CROSS_CORRELATION = 1
_DEFAULT_MATH, _FMA_MATH = 0, 3
_RELU = 1
_PROPAGATE_NAN = 1
ALGORITHMS = ("implicit_gemm", "implicit_precomp_gemm", "gemm", "direct", "fft", "fft_tiling",
              "winograd", "winograd_nonfused")
# The most workspace an algorithm may take (ONNX Runtime lets cuDNN take what it asks for; an
# H200's FFT algorithms ask up to a few hundred MB at ResNet-50's batch 32).
MAX_WORKSPACE_BYTES = 256 << 20
_INT_MAX = 2**31 - 1
# dtype -> (cudnnDataType_t, the scalar type of alpha and beta)
_TYPES: dict[np.dtype, tuple[int, Any]] = {
    np.dtype(np.float32): (_DATA_FLOAT, ctypes.c_float),
    np.dtype(np.float64): (_DATA_DOUBLE, ctypes.c_double),
}
# The sub-libraries cuDNN 9's libcudnn.so.9 opens by name, in dependency order: loaded from the
# folder it was found in first, so an installation off the loader's path (a pip wheel) works.
_PARTS = ("libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9",
          "libcudnn_engines_runtime_compiled.so.9", "libcudnn_heuristic.so.9",
          "libcudnn_ops.so.9", "libcudnn_cnn.so.9", "libcudnn_adv.so.9")


class CudnnError(RuntimeError):
    """cuDNN could not be loaded, or one of its calls returned a status other than success."""


class _AlgoPerf(ctypes.Structure):
    """cudnnConvolutionFwdAlgoPerf_t."""

    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int),
                ("math_type", ctypes.c_int), ("reserved", ctypes.c_int * 3)]


_P, _I = ctypes.c_void_p, ctypes.c_int
_SIGNATURES: dict[str, list[Any]] = {
    "cudnnCreate": [_P],
    "cudnnSetStream": [_P, _P],
    "cudnnCreateTensorDescriptor": [_P],
    "cudnnSetTensor4dDescriptor": [_P, _I, _I, _I, _I, _I, _I],
    "cudnnDestroyTensorDescriptor": [_P],
    "cudnnCreateFilterDescriptor": [_P],
    "cudnnSetFilter4dDescriptor": [_P, _I, _I, _I, _I, _I, _I],
    "cudnnDestroyFilterDescriptor": [_P],
    "cudnnCreateConvolutionDescriptor": [_P],
    "cudnnSetConvolution2dDescriptor": [_P, _I, _I, _I, _I, _I, _I, _I, _I],
    "cudnnSetConvolutionGroupCount": [_P, _I],
    "cudnnSetConvolutionMathType": [_P, _I],
    "cudnnDestroyConvolutionDescriptor": [_P],
    "cudnnGetConvolution2dForwardOutputDim": [_P, _P, _P, _P, _P, _P, _P],
    "cudnnFindConvolutionForwardAlgorithmEx": [_P, _P, _P, _P, _P, _P, _P, _P, _I, _P, _P, _P,
                                               ctypes.c_size_t],
    "cudnnGetConvolutionForwardWorkspaceSize": [_P, _P, _P, _P, _P, _I, _P],
    "cudnnConvolutionForward": [_P, _P, _P, _P, _P, _P, _P, _I, _P, ctypes.c_size_t, _P, _P,
                                _P],
    "cudnnConvolutionBiasActivationForward": [_P, _P, _P, _P, _P, _P, _P, _I, _P,
                                              ctypes.c_size_t, _P, _P, _P, _P, _P, _P, _P, _P],
    "cudnnCreateActivationDescriptor": [_P],
    "cudnnSetActivationDescriptor": [_P, _I, _I, ctypes.c_double],
    "cudnnDestroyActivationDescriptor": [_P],
}


def _library_folders() -> list[str]:
    """Folders of NVIDIA's cuDNN wheels (nvidia-cudnn-cu12 / -cu13) on this Python's path."""
    found = []
    for entry in sys.path:
        for pattern in ("nvidia/cudnn/lib", "nvidia/cu1*/lib"):
            found += glob.glob(os.path.join(entry or ".", pattern))
    return found


def _load() -> ctypes.CDLL:
    """libcudnn.so.9: the one this process loaded already, else a wheel's (its parts first),
    else the loader's search path."""
    loaded = loaded_library("libcudnn.so")
    if loaded is not None:
        return ctypes.CDLL(loaded)
    for folder in _library_folders():
        path = os.path.join(folder, "libcudnn.so.9")
        if not os.path.exists(path):
            continue
        for part in _PARTS:
            if os.path.exists(os.path.join(folder, part)):
                try:
                    ctypes.CDLL(os.path.join(folder, part), mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass  # the shim says which part it misses when a call needs it
        return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    for name in ("libcudnn.so.9", "libcudnn.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise CudnnError("cuDNN 9 is not installed (no libcudnn.so.9 in this process, in NVIDIA's "
                     "wheels on the Python path or on the loader's path): pip install "
                     "nvidia-cudnn-cu12 (CUDA 12) or nvidia-cudnn-cu13 (CUDA 13)")


_state: dict[str, Any] = {"lib": None, "refusal": None, "handles": {}, "choices": {}}
_state_lock = threading.Lock()


def _lib() -> ctypes.CDLL:
    """cuDNN with its calls' argument types set, loaded once (CudnnError where it cannot be)."""
    if _state["lib"] is None:
        with _state_lock:
            if _state["lib"] is None:
                lib = _load()
                for name, argtypes in _SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.argtypes = argtypes
                    fn.restype = ctypes.c_int
                lib.cudnnGetErrorString.argtypes = [ctypes.c_int]
                lib.cudnnGetErrorString.restype = ctypes.c_char_p
                lib.cudnnGetVersion.restype = ctypes.c_size_t
                _state["lib"] = lib
    loaded: ctypes.CDLL = _state["lib"]
    return loaded


def version() -> int:
    """cuDNN's version number (90800 for 9.8.0)."""
    return int(_lib().cudnnGetVersion())


def _check(status: int, what: str) -> None:
    if status != 0:
        text = _lib().cudnnGetErrorString(status)
        raise CudnnError(f"{what} returned cuDNN status {status} "
                         f"({text.decode() if text else 'unknown'})")


class _Handle:
    """One cuDNN handle on one GPU, bound to the stream of the call using it."""

    def __init__(self, device_id: int) -> None:
        import cupy
        self.handle = ctypes.c_void_p()
        with cupy.cuda.Device(device_id):
            _check(_lib().cudnnCreate(ctypes.byref(self.handle)), "cudnnCreate")
        self.stream = -1
        self.lock = threading.Lock()

    def bind(self, stream: int) -> None:
        if stream != self.stream:
            _check(_lib().cudnnSetStream(self.handle, ctypes.c_void_p(stream)), "cudnnSetStream")
            self.stream = stream


def _handle(device_id: int) -> _Handle:
    handles: dict[int, _Handle] = _state["handles"]
    if device_id not in handles:
        with _state_lock:
            if device_id not in handles:
                handles[device_id] = _Handle(device_id)
    return handles[device_id]


def cudnn_refusal(p: ConvParams) -> str:
    """Why cuDNN does not run this convolution here ("" where it does)."""
    if settings.word(settings.CUDA_CUDNN) == "off":
        return "GRAPH_RUNTIME_CUDA_CUDNN=off"
    if np.dtype(p.dtype) not in _TYPES:
        return f"{p.dtype} convolutions stay with im2col"
    pt, pl, pb, pr = p.pad
    if (pt, pl) != (pb, pr):
        return f"padding {list(p.pad)} is not the same on opposite sides"
    if min(p.n, p.c, p.h, p.w, p.o, p.oh, p.ow) <= 0:
        return "an empty size"
    if max(p.n * p.c * p.h * p.w, p.n * p.o * p.oh * p.ow, p.o * p.cg * p.kh * p.kw) > _INT_MAX:
        return "more than 2**31 - 1 elements"
    if _state["refusal"] is None:
        try:
            _lib()
            _state["refusal"] = ""
        except (CudnnError, OSError, AttributeError) as e:
            _state["refusal"] = str(e)
    refusal: str = _state["refusal"]
    return refusal


@dataclass(frozen=True)
class CudnnEpilogue:
    """What one cudnnConvolutionBiasActivationForward applies after the convolution: the
    operand positions of a per-channel bias and of a residual (None: none), then relu."""

    bias: int | None
    residual: int | None


def cudnn_epilogue(ops: Sequence[tuple[str, Any]], operands: Sequence[TensorSpec],
                   out: TensorSpec) -> tuple[int, CudnnEpilogue | None]:
    """How many of a conv2d chain's leading trailing ops (lib/chain.py's epilogue: ("add",
    operand position) or (op, attr)) one cuDNN call applies, and how: an add of a per-channel
    bias and one of a residual of the output's shape, each at most once, in either order, then
    relu; (0, None) where the ops do not start so (cuDNN's other activation, identity, would
    restrict the algorithm to one). float32 only."""
    shape = tuple(out.shape)
    if out.dtype != "float32" or len(shape) != 4:
        return 0, None
    per_channel = ((shape[1], 1, 1), (1, shape[1], 1, 1))
    bias: int | None = None
    residual: int | None = None
    for k, (kind, arg) in enumerate(ops):
        if kind == "relu":
            return k + 1, CudnnEpilogue(bias, residual)
        if kind != "add" or operands[arg].dtype != out.dtype:
            break
        found = tuple(operands[arg].shape)
        if found == shape and residual is None:
            residual = arg
        elif found in per_channel and bias is None:
            bias = arg
        else:
            break
    return 0, None


def _tensor(desc: ctypes.c_void_p, dtype_code: int, shape: tuple[int, int, int, int]) -> None:
    """Make desc a packed NCHW tensor descriptor of shape."""
    _check(_lib().cudnnCreateTensorDescriptor(ctypes.byref(desc)), "cudnnCreateTensorDescriptor")
    _check(_lib().cudnnSetTensor4dDescriptor(desc, _NCHW, dtype_code, *shape),
           f"cudnnSetTensor4dDescriptor {shape}")


def _measured(handle: _Handle, descs: tuple[Any, ...], p: ConvParams, math: int,
              key: tuple[Any, ...]) -> list[tuple[int, int]]:
    """(algorithm, math type) of each algorithm that ran for this convolution within
    MAX_WORKSPACE_BYTES, fastest first, as cuDNN measured them on scratch arrays; measured
    once per key in a process."""
    import cupy
    found: dict[tuple[Any, ...], list[tuple[int, int]]] = _state["choices"]
    if key in found:
        return found[key]
    x_desc, w_desc, conv, y_desc = descs
    x, w, y = scratch(p)
    workspace = cupy.empty(MAX_WORKSPACE_BYTES, np.uint8)
    perf = (_AlgoPerf * len(ALGORITHMS))()
    count = ctypes.c_int()
    with handle.lock:
        handle.bind(cupy.cuda.get_current_stream().ptr)
        _check(_lib().cudnnFindConvolutionForwardAlgorithmEx(
            handle.handle, x_desc, x.data.ptr, w_desc, w.data.ptr, conv, y_desc, y.data.ptr,
            len(ALGORITHMS), ctypes.byref(count), ctypes.cast(perf, ctypes.c_void_p),
            workspace.data.ptr, MAX_WORKSPACE_BYTES),
            f"cudnnFindConvolutionForwardAlgorithmEx ({p.key()})")
    # FMA math asked (TF32 off): kept whatever math the measured kernel reports
    ran = [(int(r.algo), math if math == _FMA_MATH else int(r.math_type))
           for r in perf[:count.value] if r.status == 0 and r.memory <= MAX_WORKSPACE_BYTES]
    found[key] = ran
    return ran


def replay_seconds(run: Callable[[], None], stream: Any, repeat: int = 9) -> float:
    """Median GPU seconds of run() captured once as a CUDA graph on stream and replayed: what
    it costs inside a replayed module, without Python's launch time (which would favour the
    candidate with fewer kernels). Raises where run() cannot be captured."""
    import cupy
    run()  # kernels loaded and workspace made outside the capture
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        stream.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
        try:
            run()
        finally:
            graph = stream.end_capture()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    graph.launch(stream)
    times = []
    for _ in range(repeat):
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return sorted(times)[len(times) // 2]


def scratch(p: ConvParams) -> tuple[Any, Any, Any]:
    """Data, weight and output arrays of p's sizes on the current GPU, the inputs random in
    [-0.5, 0.5): what a kernel is measured on when it is made."""
    import cupy
    rng = cupy.random.default_rng(0)
    dtype = np.dtype(p.dtype)
    return (rng.random((p.n, p.c, p.h, p.w), dtype=dtype) - 0.5,
            rng.random((p.o, p.cg, p.kh, p.kw), dtype=dtype) - 0.5,
            cupy.empty((p.n, p.o, p.oh, p.ow), dtype))


class CudnnConv(PreparedKernel):
    """run(data, weight, *operands, out): one NCHW convolution through cuDNN, with the
    epilogue's bias, residual and relu in the same call where one is given."""

    def __init__(self, p: ConvParams, device_id: int,
                 epilogue: CudnnEpilogue | None = None) -> None:
        import cupy
        lib = _lib()
        self.p = p
        self.epilogue = epilogue
        dtype = np.dtype(p.dtype)
        code, scalar = _TYPES[dtype]
        # float32 with TF32 off: FMA kernels only (cuDNN's default math takes TF32 on Ampere+)
        fma = dtype == np.float32 and settings.word(settings.CUDA_TF32) != "on"
        math = _FMA_MATH if fma else _DEFAULT_MATH
        self._handle = _handle(device_id)
        # the backend's stream on this GPU: every call runs there, as the other kernels do
        # (called outside any scope, cuDNN would take the legacy default stream, which a
        # capture of the backend's stream cannot hold)
        self._backend: Any = get_backend("cuda")
        self._device_id = device_id
        self._x, self._y, self._w, self._conv, self._act, self._bias = (
            ctypes.c_void_p() for _ in range(6))
        # each made below in place: the finalizer frees those made, whatever fails after
        weakref.finalize(self, _destroy, self._x, self._y, self._w, self._conv, self._act,
                         self._bias)
        _tensor(self._x, code, (p.n, p.c, p.h, p.w))
        _tensor(self._y, code, (p.n, p.o, p.oh, p.ow))
        _check(lib.cudnnCreateFilterDescriptor(ctypes.byref(self._w)),
               "cudnnCreateFilterDescriptor")
        _check(lib.cudnnSetFilter4dDescriptor(self._w, code, _NCHW, p.o, p.cg, p.kh, p.kw),
               "cudnnSetFilter4dDescriptor")
        _check(lib.cudnnCreateConvolutionDescriptor(ctypes.byref(self._conv)),
               "cudnnCreateConvolutionDescriptor")
        _check(lib.cudnnSetConvolution2dDescriptor(
            self._conv, p.pad[0], p.pad[1], p.strides[0], p.strides[1], p.dilation[0],
            p.dilation[1], _CROSS_CORRELATION, code), "cudnnSetConvolution2dDescriptor")
        _check(lib.cudnnSetConvolutionGroupCount(self._conv, p.groups),
               "cudnnSetConvolutionGroupCount")
        _check(lib.cudnnSetConvolutionMathType(self._conv, math), "cudnnSetConvolutionMathType")
        dims = [ctypes.c_int() for _ in range(4)]
        _check(lib.cudnnGetConvolution2dForwardOutputDim(
            self._conv, self._x, self._w, *(ctypes.byref(d) for d in dims)),
            "cudnnGetConvolution2dForwardOutputDim")
        if tuple(d.value for d in dims) != (p.n, p.o, p.oh, p.ow):
            raise CudnnError(f"cuDNN computes a {tuple(d.value for d in dims)} output for "
                             f"{p.key()}, not the graph's {(p.n, p.o, p.oh, p.ow)}")
        self._one, self._nothing = scalar(1.0), scalar(0.0)
        self._zero_bias: Any = None
        with self._backend.scope(device_id):
            if epilogue is not None:
                _check(lib.cudnnCreateActivationDescriptor(ctypes.byref(self._act)),
                       "cudnnCreateActivationDescriptor")
                _check(lib.cudnnSetActivationDescriptor(self._act, _RELU, _PROPAGATE_NAN, 0.0),
                       "cudnnSetActivationDescriptor")
                _tensor(self._bias, code, (1, p.o, 1, 1))
                self._zero_bias = cupy.zeros(p.o, dtype)
            candidates = _measured(self._handle, (self._x, self._w, self._conv, self._y), p,
                                   math, (device_id, p, math))
            refused: list[str] = []
            for self.algo, chosen_math in candidates:
                _check(lib.cudnnSetConvolutionMathType(self._conv, chosen_math),
                       "cudnnSetConvolutionMathType")
                size = ctypes.c_size_t()
                _check(lib.cudnnGetConvolutionForwardWorkspaceSize(
                    self._handle.handle, self._x, self._w, self._conv, self._y, self.algo,
                    ctypes.byref(size)), "cudnnGetConvolutionForwardWorkspaceSize")
                self._workspace_bytes = int(size.value)
                # held as long as the kernel: a captured graph keeps its address
                self._workspace = cupy.empty(max(self._workspace_bytes, 1), np.uint8)
                if epilogue is None:
                    break
                try:  # the fused call takes fewer algorithms than cuDNN measured
                    x, w, y = scratch(p)
                    self._launch(x, w, self._zero_bias, y, y, False)
                    break
                except CudnnError as e:
                    refused.append(f"{ALGORITHMS[self.algo]}: {e}")
            else:
                raise CudnnError(f"cuDNN ran no algorithm for the convolution {p.key()}"
                                 + (f" with bias and relu ({'; '.join(refused)})"
                                    if refused else ""))
            if epilogue is not None and epilogue.bias is not None:
                self._zero_bias = None  # the graph's bias is read instead

    def workspace_bytes(self) -> int:
        return self._workspace_bytes + (0 if self._zero_bias is None
                                        else int(self._zero_bias.nbytes))

    def note(self) -> str:
        fused = ""
        if self.epilogue is not None:
            parts = [name for name, at in (("bias", self.epilogue.bias),
                                           ("residual", self.epilogue.residual)) if at is not None]
            fused = " + " + " + ".join(parts + ["relu"])
        return f"cuDNN {ALGORITHMS[self.algo]}{fused}"

    def __call__(self, *arrays: Any) -> None:
        with self._backend.scope(self._device_id):
            self._run(*arrays)

    def _run(self, *arrays: Any) -> None:
        import cupy
        data, weight, out = (cupy.ascontiguousarray(arrays[0]),
                             cupy.ascontiguousarray(arrays[1]), arrays[-1])
        target = out if out.flags.c_contiguous else cupy.empty(out.shape, out.dtype)
        ep = self.epilogue
        if ep is None:
            self._launch(data, weight, None, None, target, False)
        else:
            operands = arrays[2:-1]
            bias = cupy.ascontiguousarray(operands[ep.bias]) if ep.bias is not None \
                else self._zero_bias
            z = target if ep.residual is None \
                else cupy.ascontiguousarray(operands[ep.residual])
            self._launch(data, weight, bias, z, target, ep.residual is not None)
        if target is not out:
            out[...] = target

    def _launch(self, data: Any, weight: Any, bias: Any, z: Any, out: Any,
                residual: bool) -> None:
        """One cuDNN call on the current stream: the convolution alone where bias is None,
        else relu(conv + bias (+ z where residual))."""
        import cupy
        lib, handle = _lib(), self._handle
        workspace = ctypes.c_void_p(self._workspace.data.ptr)
        with handle.lock:
            handle.bind(cupy.cuda.get_current_stream().ptr)
            if bias is None:
                _check(lib.cudnnConvolutionForward(
                    handle.handle, ctypes.byref(self._one), self._x, data.data.ptr, self._w,
                    weight.data.ptr, self._conv, self.algo, workspace, self._workspace_bytes,
                    ctypes.byref(self._nothing), self._y, out.data.ptr),
                    "cudnnConvolutionForward")
                return
            _check(lib.cudnnConvolutionBiasActivationForward(
                handle.handle, ctypes.byref(self._one), self._x, data.data.ptr, self._w,
                weight.data.ptr, self._conv, self.algo, workspace, self._workspace_bytes,
                ctypes.byref(self._one if residual else self._nothing), self._y, z.data.ptr,
                self._bias, bias.data.ptr, self._act, self._y, out.data.ptr),
                "cudnnConvolutionBiasActivationForward")


def _destroy(x: ctypes.c_void_p, y: ctypes.c_void_p, w: ctypes.c_void_p,
             conv: ctypes.c_void_p, act: ctypes.c_void_p, bias: ctypes.c_void_p) -> None:
    """Free a kernel's descriptors (those it made: a null one was never created)."""
    lib = _state["lib"]
    if lib is None:
        return
    for desc, destroy in ((x, lib.cudnnDestroyTensorDescriptor),
                          (y, lib.cudnnDestroyTensorDescriptor),
                          (bias, lib.cudnnDestroyTensorDescriptor),
                          (w, lib.cudnnDestroyFilterDescriptor),
                          (conv, lib.cudnnDestroyConvolutionDescriptor),
                          (act, lib.cudnnDestroyActivationDescriptor)):
        if desc.value:
            destroy(desc)
