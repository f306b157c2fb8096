"""Convolution standard ops (conv2d, conv2d_transpose) in NCHW: op definitions and kernels.

CPU conv2d picks a strategy per shape (kernels/cpu/conv_choice.py); CPU conv2d_transpose is
oneDNN's deconvolution or the NumPy kernel here, per shape (kernels/onednn/choice.py onednn_or);
CUDA runs cuDNN (kernels/cuda_cudnn.py, a chain's bias, residual and relu in its call) where it
takes the convolution, else im2col + GEMM here.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ... import settings
from ...backends import get_backend
from ...backends.base import Backend
from ...errors import LibraryError
from ..conv_params import CONV_ATTRS, ConvParams, conv2d_params, conv2d_transpose_params
from ..kernels.cpu.conv_choice import conv2d_cpu
from ..kernels.conv_epilogue import EPILOGUE_DTYPES, Epilogue
from ..kernels.cuda_cudnn import (CudnnConv, CudnnEpilogue, CudnnError, cudnn_epilogue,
                                  cudnn_refusal, replay_seconds, scratch)
from ..kernels.cuda_gemm import matmul_function
from ..kernels.host import array_module, host_kernel, wide_dtype
from ..kernels.opencl.conv import conv2d_cl, conv2d_transpose_cl
from ..kernels.opencl.source import check_cl_dtypes
from ..library import TensorSpec
from ..prepared import PreparedKernel
from ..registry import GpuEpilogue, define_op, kernel

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

log = logging.getLogger(__name__)


def _conv2d_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = conv2d_params(inputs, attrs)
    return [TensorSpec((p.n, p.o, p.oh, p.ow), p.dtype)]


def _conv2d_transpose_infer(inputs: Sequence[TensorSpec],
                            attrs: Mapping[str, Any]) -> list[TensorSpec]:
    p = conv2d_transpose_params(inputs, attrs)
    return [TensorSpec((p.n, p.o, p.oh, p.ow), p.dtype)]


# -- cpu / cuda ---------------------------------------------------------------------------------

def _work_dtype(backend: Backend, dtype: str) -> str:
    """NumPy has no float16 BLAS: the CPU computes float16 convolutions in float32."""
    return wide_dtype(dtype) if backend.name == "cpu" else dtype


def _staged(xp: Any, arr: Any, buf: Any) -> Any:
    """arr itself, or arr copied into buf (a float32 stand-in for float16)."""
    if buf is None:
        return arr
    xp.copyto(buf, arr, casting="unsafe")
    return buf


def _conv2d_host(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = conv2d_params(inputs, attrs)
    xp = array_module(backend)
    matmul = matmul_function(xp)
    work = _work_dtype(backend, p.dtype)
    staged = work != p.dtype
    pt, pl, pb, pr = p.pad
    sh, sw = p.strides
    dh, dw = p.dilation
    direct = p.kh == p.kw == 1 and p.strides == (1, 1) and not any(p.pad)
    # Workspace, allocated once: a zero-bordered copy of the data and the im2col matrix.
    padded = None
    if any(p.pad) or staged:
        padded = xp.zeros((p.n, p.c, p.h + pt + pb, p.w + pl + pr), work)
    col_shape = (p.n, p.groups, p.cg, p.kh, p.kw, p.oh, p.ow)
    col = xp.empty((0,) if direct else col_shape, work)
    w_buf = xp.empty(inputs[1].shape, work) if staged else None
    out_buf = xp.empty(outputs[0].shape, work) if staged else None
    kk = p.cg * p.kh * p.kw
    as_strided = xp.lib.stride_tricks.as_strided

    def run(data: Any, weight: Any, out: Any) -> None:
        if kk == 0:
            # NOTE: no input channels: an empty sum; cuBLAS is not asked to multiply with K = 0.
            out.fill(0)
            return
        src = data
        if padded is not None:
            padded[:, :, pt:pt + p.h, pl:pl + p.w] = data
            src = padded
        if direct:
            cols = src.reshape(p.n, p.groups, kk, p.oh * p.ow)
        else:
            s_n, s_c, s_h, s_w = src.strides
            windows = as_strided(src, shape=col_shape,
                                 strides=(s_n, p.cg * s_c, s_c, dh * s_h, dw * s_w, sh * s_h,
                                          sw * s_w))
            xp.copyto(col, windows)
            cols = col.reshape(p.n, p.groups, kk, p.oh * p.ow)
        w = _staged(xp, weight, w_buf).reshape(p.groups, p.og, kk)
        target = out if out_buf is None else out_buf
        matmul(w, cols, out=target.reshape(p.n, p.groups, p.og, p.oh * p.ow))
        if out_buf is not None:
            xp.copyto(out, out_buf, casting="unsafe")
    return host_kernel(backend, device_id, run)


def _conv2d_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    """float32/float64: a strategy per shape (kernels/cpu/conv_choice.py); float16 stays staged."""
    p = conv2d_params(inputs, attrs)
    if p.dtype not in EPILOGUE_DTYPES:
        return _conv2d_host(backend, device_id, inputs, outputs, attrs)
    return conv2d_cpu(p, Epilogue((), tuple(outputs[0].shape)))


def _conv2d_cpu_fused(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                      attrs: Mapping[str, Any], ops: Sequence[tuple[str, Any]],
                      operands: Sequence[TensorSpec]) -> Callable[..., None]:
    """conv2d with a chain's trailing add/relu/clip applied per output block (conv_epilogue)."""
    p = conv2d_params(inputs, attrs)
    shape = tuple(outputs[0].shape)
    return conv2d_cpu(p, Epilogue.build(ops, [tuple(s.shape) for s in operands], shape))


def _conv2d_cuda(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    """cuDNN's convolution where it takes this one and is chosen (_cudnn_chosen), else
    im2col + GEMM."""
    if _cudnn_chosen(backend, device_id, inputs, attrs, None):
        try:
            return CudnnConv(conv2d_params(inputs, attrs), device_id)
        except CudnnError:
            pass  # cuDNN found no algorithm for it: im2col computes it as before
    return _conv2d_host(backend, device_id, inputs, outputs, attrs)


def _conv2d_cuda_takes(device_id: int, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
                       ops: Sequence[tuple[str, Any]], operands: Sequence[TensorSpec]) -> int:
    """How many of a chain's trailing ops cuDNN's call applies after this convolution (0
    where it is not chosen for it: the chain's tail then runs as its own kernel)."""
    p = conv2d_params(inputs, attrs)
    count, epilogue = cudnn_epilogue(ops, operands, TensorSpec((p.n, p.o, p.oh, p.ow), p.dtype))
    if epilogue is None:
        return 0
    return count if _cudnn_chosen(get_backend("cuda"), device_id, inputs, attrs, epilogue) else 0


# (device, sizes, epilogue, TF32) -> whether cuDNN measured faster than im2col there
_CUDNN_FASTER: dict[tuple[Any, ...], bool] = {}


def _cudnn_chosen(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                  attrs: Mapping[str, Any], epilogue: CudnnEpilogue | None) -> bool:
    """Whether cuDNN runs this convolution (with the epilogue): it takes it (cudnn_refusal)
    and GRAPH_RUNTIME_CUDA_CUDNN is on, or auto and cuDNN's kernel replays faster than
    im2col + GEMM (followed, where there is an epilogue, by one elementwise pass standing in
    for the chain's fused tail). At batch 1 cuBLAS's product often wins (ResNet-50's
    convolutions on an H200), at batch 32 cuDNN's. Measured once per shape in a process."""
    p = conv2d_params(inputs, attrs)
    if cudnn_refusal(p):
        return False
    if settings.word(settings.CUDA_CUDNN) == "on":
        return True
    fused = None if epilogue is None else (epilogue.bias is not None,
                                           epilogue.residual is not None)
    key = (device_id, p, fused, settings.word(settings.CUDA_TF32))
    if key not in _CUDNN_FASTER:
        _CUDNN_FASTER[key] = _cudnn_replays_faster(backend, device_id, p, inputs, attrs,
                                                   epilogue)
    return _CUDNN_FASTER[key]


def _cudnn_replays_faster(backend: Backend, device_id: int, p: ConvParams,
                          inputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
                          epilogue: CudnnEpilogue | None) -> bool:
    import cupy
    out = TensorSpec((p.n, p.o, p.oh, p.ow), p.dtype)
    with backend.scope(device_id) as stream:
        try:
            cudnn = CudnnConv(p, device_id, epilogue)
        except CudnnError:
            return False
        im2col = _conv2d_host(backend, device_id, inputs, [out], attrs)
        x, w, y = scratch(p)
        operands: list[Any] = [None, None]
        if epilogue is not None:
            if epilogue.bias is not None:
                operands[epilogue.bias] = cupy.zeros((p.o, 1, 1), p.dtype)
            if epilogue.residual is not None:
                operands[epilogue.residual] = cupy.zeros_like(y)
        extra = [a for a in operands if a is not None]
        residual = None if epilogue is None or epilogue.residual is None \
            else operands[epilogue.residual]

        def with_im2col() -> None:
            im2col(x, w, y)
            if residual is not None:
                cupy.add(y, residual, out=y)
            elif epilogue is not None:
                cupy.maximum(y, 0, out=y)
        try:
            mine = replay_seconds(lambda: cudnn(x, w, *extra, y), stream)
            theirs = replay_seconds(with_im2col, stream)
        except Exception as e:  # noqa: BLE001 (a run that cannot be captured: cuDNN, as "on")
            log.info("conv2d %s: cuDNN kept without measuring (%s)", p.key(), e)
            return True
    return mine <= theirs


def _conv2d_cuda_fused(device_id: int, inputs: Sequence[TensorSpec],
                       outputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
                       ops: Sequence[tuple[str, Any]],
                       operands: Sequence[TensorSpec]) -> Callable[..., None]:
    """conv2d with the bias, residual and relu _conv2d_cuda_takes accepted, in one cuDNN call;
    where cuDNN then finds no algorithm, im2col + GEMM and the adds and relu in CuPy."""
    p = conv2d_params(inputs, attrs)
    count, epilogue = cudnn_epilogue(ops, operands, outputs[0])
    if epilogue is None or count != len(ops):
        raise LibraryError(f"conv2d: cuDNN cannot apply the chain ops {[k for k, _ in ops]}")
    backend = get_backend("cuda")
    try:
        with backend.scope(device_id):
            return CudnnConv(p, device_id, epilogue)
    except CudnnError:
        conv = _conv2d_host(backend, device_id, inputs, outputs, attrs)
    import cupy

    def run(data: Any, weight: Any, *rest: Any) -> None:
        out = rest[-1]
        conv(data, weight, out)
        for at in (epilogue.bias, epilogue.residual):
            if at is not None:
                cupy.add(out, rest[at], out=out)
        cupy.maximum(out, 0, out=out)
    return host_kernel(backend, device_id, run)


def _conv2d_transpose_host(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                           outputs: Sequence[TensorSpec],
                           attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = conv2d_transpose_params(inputs, attrs)
    xp = array_module(backend)
    matmul = matmul_function(xp)
    work = _work_dtype(backend, p.dtype)
    staged = work != p.dtype
    pt, pl = p.pad[0], p.pad[1]
    sh, sw = p.strides
    dh, dw = p.dilation
    taps = p.og * p.kh * p.kw
    # The uncropped output every tap scatters into, big enough for the cropped window.
    full_h = max((p.h - 1) * sh + dh * (p.kh - 1) + 1, pt + p.oh)
    full_w = max((p.w - 1) * sw + dw * (p.kw - 1) + 1, pl + p.ow)
    full = xp.empty((p.n, p.o, full_h, full_w), work)
    cols = xp.empty((p.n, p.groups, taps, p.h * p.w), work)
    d_buf = xp.empty(inputs[0].shape, work) if staged else None
    w_buf = xp.empty(inputs[1].shape, work) if staged else None
    span_h = (p.h - 1) * sh + 1
    span_w = (p.w - 1) * sw + 1

    def run(data: Any, weight: Any, out: Any) -> None:
        if p.cg == 0:
            out.fill(0)
            return
        x = _staged(xp, data, d_buf).reshape(p.n, p.groups, p.cg, p.h * p.w)
        w = _staged(xp, weight, w_buf).reshape(p.groups, p.cg, taps).swapaxes(1, 2)
        matmul(w, x, out=cols)
        taps6 = cols.reshape(p.n, p.o, p.kh, p.kw, p.h, p.w)
        full.fill(0)
        for i in range(p.kh):
            for j in range(p.kw):
                y0 = i * dh
                x0 = j * dw
                full[:, :, y0:y0 + span_h:sh, x0:x0 + span_w:sw] += taps6[:, :, i, j]
        xp.copyto(out, full[:, :, pt:pt + p.oh, pl:pl + p.ow], casting="unsafe")
    return host_kernel(backend, device_id, run)


def _conv2d_transpose_cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                          outputs: Sequence[TensorSpec],
                          attrs: Mapping[str, Any]) -> Callable[..., None]:
    """float32: oneDNN's deconvolution where it applies and is chosen; else the NumPy kernel."""
    p = conv2d_transpose_params(inputs, attrs)

    def host() -> Callable[..., None]:
        return _conv2d_transpose_host(backend, device_id, inputs, outputs, attrs)
    if p.dtype != "float32":
        return host()
    shapes = [tuple(s.shape) for s in list(inputs) + list(outputs)]
    return _onednn_or_host(p, Epilogue((), tuple(outputs[0].shape)), host, shapes)


def _conv2d_transpose_cpu_fused(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                                attrs: Mapping[str, Any], ops: Sequence[tuple[str, Any]],
                                operands: Sequence[TensorSpec]) -> Callable[..., None]:
    """conv2d_transpose with a chain's trailing add/activations (chain.py): oneDNN's post-ops,
    or the NumPy kernel followed by the epilogue's passes over the output (conv_epilogue)."""
    p = conv2d_transpose_params(inputs, attrs)
    shape = tuple(outputs[0].shape)
    epilogue = Epilogue.build(ops, [tuple(s.shape) for s in operands], shape)

    def host() -> Callable[..., None]:
        kernel = _conv2d_transpose_host(get_backend("cpu"), 0, inputs, outputs, attrs)
        return _EpilogueAfter(kernel, epilogue)
    if p.dtype != "float32":
        return host()
    shapes = [tuple(s.shape) for s in list(inputs) + list(operands) + list(outputs)]
    return _onednn_or_host(p, epilogue, host, shapes)


class _EpilogueAfter(PreparedKernel):
    """run(data, weight, *operands, out): a kernel writing out, then the epilogue on out."""

    def __init__(self, kernel: Callable[..., None], epilogue: Epilogue) -> None:
        self.kernel = kernel
        self.epilogue = epilogue

    def __call__(self, data: Any, weight: Any, *rest: Any) -> None:
        out = rest[-1]
        self.kernel(data, weight, out)
        self.epilogue.apply(out, 0, out.shape[0], rest[:-1])

    def __repr__(self) -> str:
        return f"EpilogueAfter({getattr(self.kernel, '__name__', self.kernel)!s}, " \
               f"{'+'.join(op.kind for op in self.epilogue.ops)})"


def _onednn_or_host(p: ConvParams, epilogue: Epilogue, host: Callable[[], Callable[..., None]],
                    shapes: Sequence[tuple[int, ...]]) -> Callable[..., None]:
    """A oneDNN deconvolution (kernels/onednn/deconv.py) where it applies and the tuning
    service (or GRAPH_RUNTIME_ONEDNN) picks it for this shape, else host()."""
    from ..kernels.cpu.silu_pass import SiluBand
    from ..kernels.onednn.choice import onednn_or
    from ..kernels.onednn.deconv import OnednnDeconv, deconv_applies

    kinds = ",".join(op.kind for op in epilogue.ops) or "none"
    key = (f"{p.dtype} data {p.n}x{p.c}x{p.h}x{p.w} weight {p.c}x{p.og}x{p.kh}x{p.kw} "
           f"out {p.oh}x{p.ow} strides {_sides(p.strides)} pad {_sides(p.pad)} "
           f"dilation {_sides(p.dilation)} groups {p.groups} epilogue {kinds}")
    return onednn_or("conv2d_transpose", key, deconv_applies(p, epilogue),
                     lambda: OnednnDeconv(p, epilogue, SiluBand), host, shapes)


def _sides(values: tuple[int, ...]) -> str:
    """One number where all sides agree, else all of them (as ConvParams.key writes them)."""
    return str(values[0]) if len(set(values)) == 1 else ",".join(map(str, values))


# -- opencl -------------------------------------------------------------------------------------

def _conv2d_cl(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
               outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = conv2d_params(inputs, attrs)
    check_cl_dtypes("conv2d", backend, device_id, [p.dtype])
    return conv2d_cl(backend, device_id, p)


def _conv2d_transpose_cl(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                         outputs: Sequence[TensorSpec],
                         attrs: Mapping[str, Any]) -> Callable[..., None]:
    p = conv2d_transpose_params(inputs, attrs)
    check_cl_dtypes("conv2d_transpose", backend, device_id, [p.dtype])
    return conv2d_transpose_cl(backend, device_id, p)


_CONV2D = define_op("conv2d", _conv2d_infer, 2, CONV_ATTRS)
_CONV2D.cpu_epilogue = _conv2d_cpu_fused
_CONV2D.cuda_epilogue = GpuEpilogue(_conv2d_cuda_takes, _conv2d_cuda_fused)
_CONV2D_TRANSPOSE = define_op("conv2d_transpose", _conv2d_transpose_infer, 2,
                              CONV_ATTRS + ("output_padding",))
_CONV2D_TRANSPOSE.cpu_epilogue = _conv2d_transpose_cpu_fused
kernel("conv2d", "cpu")(_conv2d_cpu)
kernel("conv2d", "cuda")(_conv2d_cuda)
kernel("conv2d_transpose", "cpu")(_conv2d_transpose_cpu)
kernel("conv2d_transpose", "cuda")(_conv2d_transpose_host)
kernel("conv2d", "opencl")(_conv2d_cl)
kernel("conv2d_transpose", "opencl")(_conv2d_transpose_cl)

__all__ = ["ConvParams", "conv2d_params", "conv2d_transpose_params"]
