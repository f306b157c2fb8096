"""Linear-algebra standard ops (dense, matmul, batch_matmul, bias_add) as batched GEMMs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

import numpy as np

from ...backends.base import Backend
from ..attrs import attr_error, bool_attr, check_out_dtype, int_attr, normalize_axis, op_error
from ..kernels.cpu.dense_choice import DenseSpec, dense_cpu
from ..kernels.nhwc_features import NhwcFeaturesDot, permuting_pays
from ..kernels.cuda_gemm import matmul_function
from ..kernels.gpu_elementwise import gpu_elementwise
from ..kernels.host import array_module, host_kernel
from ..kernels.opencl.gemm import GemmShape, make_gemm
from ..library import TensorSpec
from ..prepared import PreparedKernel
from ..registry import define_op, kernel
from ..shapes import (FLOAT_DTYPES, NUMERIC_DTYPES, check_dtype, check_num_inputs, check_rank,
                      check_same_dtype, size_of)

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

Factory = Callable[..., Callable[..., None]]


@dataclass(frozen=True)
class Gemm:
    """out[b] (m x n) = op(a[b % a_batches]) @ op(b[b % b_batches]) with packed operands."""

    batch: int
    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    a_batches: int
    b_batches: int
    dtype: str

    def a_shape(self) -> tuple[int, int, int]:
        if self.trans_a:
            return (self.a_batches, self.k, self.m)
        return (self.a_batches, self.m, self.k)

    def b_shape(self) -> tuple[int, int, int]:
        if self.trans_b:
            return (self.b_batches, self.n, self.k)
        return (self.b_batches, self.k, self.n)

    def opencl_shape(self) -> GemmShape:
        return GemmShape(self.m, self.n, self.k, self.dtype, self.trans_a, self.trans_b,
                         batch=self.batch, a_batches=self.a_batches, b_batches=self.b_batches,
                         a_stride=self.m * self.k, b_stride=self.k * self.n,
                         c_stride=self.m * self.n)


def _float_pair(op: str, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> str:
    check_num_inputs(op, inputs, 2)
    dtype = check_same_dtype(op, inputs)
    check_dtype(op, inputs[0], FLOAT_DTYPES)
    check_out_dtype(op, attrs, dtype)
    return dtype


# -- shapes -------------------------------------------------------------------------------------

def dense_gemm(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> tuple[Gemm, tuple]:
    """dense: data [..., K] x weight [units, K] -> [..., units] (TVM's convention)."""
    dtype = _float_pair("dense", inputs, attrs)
    data, weight = inputs
    check_rank("dense", weight, (2,), "weight")
    if len(data.shape) < 1:
        raise op_error("dense", f"data has shape {tuple(data.shape)}; expected rank 1 or more")
    units, k = weight.shape
    if data.shape[-1] != k:
        raise op_error("dense", f"data {data} has {data.shape[-1]} features (last dim) but "
                                f"weight {weight} has {k}; weight is [units, features]")
    want = int_attr("dense", attrs, "units", None)
    if want is not None and want != units:
        raise attr_error("dense", "units", want, f"{units} (weight {weight} has {units} rows)")
    rows = size_of(data.shape[:-1])
    gemm = Gemm(1, rows, units, k, False, True, 1, 1, dtype)
    return gemm, tuple(data.shape[:-1]) + (units,)


def matmul_gemm(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> tuple[Gemm, tuple]:
    """matmul: a [..., M, K] ([K, M] with transpose_a) x b [K, N] ([N, K] with transpose_b)."""
    dtype = _float_pair("matmul", inputs, attrs)
    a, b = inputs
    trans_a = bool_attr("matmul", attrs, "transpose_a", False)
    trans_b = bool_attr("matmul", attrs, "transpose_b", False)
    check_rank("matmul", b, (2,), "input 1")
    if trans_a:
        check_rank("matmul", a, (2,), "input 0 (transpose_a)")
        k, m = a.shape
        lead: tuple = (m,)
    else:
        if len(a.shape) < 1:
            raise op_error("matmul", f"input 0 has shape {tuple(a.shape)}; expected rank >= 1")
        k = a.shape[-1]
        m = size_of(a.shape[:-1])
        lead = tuple(a.shape[:-1])
    kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    if kb != k:
        raise op_error("matmul", f"input 0 {a} gives K = {k} (transpose_a={trans_a}) but "
                                 f"input 1 {b} gives K = {kb} (transpose_b={trans_b})")
    want = int_attr("matmul", attrs, "units", None)
    if want is not None and want != n:
        raise attr_error("matmul", "units", want, f"{n} (the output columns)")
    return Gemm(1, m, n, k, trans_a, trans_b, 1, 1, dtype), lead + (n,)


def batch_matmul_gemm(inputs: Sequence[TensorSpec],
                      attrs: Mapping[str, Any]) -> tuple[Gemm, tuple]:
    """batch_matmul: x [B, M, K] x y [B, N, K] (Relay's default transpose_b=True) -> [B, M, N]."""
    op = "batch_matmul"
    dtype = _float_pair(op, inputs, attrs)
    x, y = inputs
    check_rank(op, x, (3,), "x")
    check_rank(op, y, (3,), "y")
    trans_a = bool_attr(op, attrs, "transpose_a", False)
    trans_b = bool_attr(op, attrs, "transpose_b", True)
    bx, m, k = (x.shape[0], x.shape[2], x.shape[1]) if trans_a else x.shape
    by, n, ky = y.shape if trans_b else (y.shape[0], y.shape[2], y.shape[1])
    if ky != k:
        raise op_error(op, f"x {x} gives K = {k} (transpose_a={trans_a}) but y {y} gives "
                           f"K = {ky} (transpose_b={trans_b})")
    if bx != by and 1 not in (bx, by):
        raise op_error(op, f"batch sizes differ: x has {bx}, y has {by}; one must be 1 or "
                           "they must match")
    batch = by if bx == 1 else bx
    return Gemm(batch, m, n, k, trans_a, trans_b, bx, by, dtype), (batch, m, n)


SHAPES: dict[str, Callable[..., tuple[Gemm, tuple]]] = {
    "dense": dense_gemm, "matmul": matmul_gemm, "batch_matmul": batch_matmul_gemm}


def _gemm_infer(op: str) -> Callable[..., list[TensorSpec]]:
    def infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
        gemm, shape = SHAPES[op](inputs, attrs)
        return [TensorSpec(shape, gemm.dtype)]
    return infer


# -- kernels ------------------------------------------------------------------------------------

def host_gemm(backend: Backend, device_id: int, gemm: Gemm,
              stage_float16: bool = False) -> Callable[[Any, Any, Any], None]:
    """run(a, b, out) with numpy/cupy matmul (BLAS / cuBLAS) on reshaped, transposed views;
    stage_float16: a float16 product computed in float32 buffers (NumPy has no float16 BLAS)."""
    xp = array_module(backend)
    matmul = matmul_function(xp)
    a_shape = gemm.a_shape()
    b_shape = gemm.b_shape()
    c_shape = (gemm.batch, gemm.m, gemm.n)
    staged = None
    if gemm.dtype == "float16" and stage_float16:
        # NOTE: the float32 buffers are made once, here.
        staged = (np.empty(a_shape, np.float32), np.empty(b_shape, np.float32),
                  np.empty(c_shape, np.float32))

    def operands(a: Any, b: Any) -> tuple[Any, Any]:
        a3 = a.reshape(a_shape)
        b3 = b.reshape(b_shape)
        if staged is not None:
            xp.copyto(staged[0], a3)
            xp.copyto(staged[1], b3)
            a3, b3 = staged[0], staged[1]
        return (a3.swapaxes(1, 2) if gemm.trans_a else a3,
                b3.swapaxes(1, 2) if gemm.trans_b else b3)

    def run(a: Any, b: Any, out: Any) -> None:
        if gemm.k == 0:
            # NOTE: an empty sum; cuBLAS is not asked to multiply with K = 0.
            out.fill(0)
            return
        a3, b3 = operands(a, b)
        c3 = out.reshape(c_shape)
        if staged is None:
            matmul(a3, b3, out=c3)
        else:
            matmul(a3, b3, out=staged[2])
            xp.copyto(c3, staged[2], casting="unsafe")
    return host_kernel(backend, device_id, run)


class BlasDot(PreparedKernel):
    """One product as np.dot on 2-D views: BLAS GEMV/GEMM with no batch loop around it.

    NOTE: np.dot reaches OpenBLAS with less per-call work than a 3-D matmul, which counts on
    the MLP's GEMVs (a third of its run time).
    """

    def __init__(self, gemm: Gemm) -> None:
        self.gemm = gemm
        a_shape, b_shape, c_shape = gemm.a_shape()[1:], gemm.b_shape()[1:], (gemm.m, gemm.n)
        trans_a, trans_b, dot = gemm.trans_a, gemm.trans_b, np.dot

        def run(a: Any, b: Any, out: Any) -> None:
            a2 = a if a.shape == a_shape else a.reshape(a_shape)
            b2 = b if b.shape == b_shape else b.reshape(b_shape)
            c2 = out if out.shape == c_shape else out.reshape(c_shape)
            dot(a2.T if trans_a else a2, b2.T if trans_b else b2, out=c2)
        self.run = run

    def __call__(self, a: Any, b: Any, out: Any) -> None:
        self.run(a, b, out)

    def reading_nhwc(self, position: int, shape: tuple[int, ...]) -> PreparedKernel | None:
        """The product reading its features (position 0, an (M, C, H, W) tensor flattened)
        from their NHWC bytes, on a permuted copy of the weight where that pays
        (kernels/nhwc_features.py)."""
        g = self.gemm
        if (position != 0 or g.trans_a or len(shape) != 4 or shape[0] != g.m
                or shape[1] * shape[2] * shape[3] != g.k
                or not permuting_pays(g.m, g.n, g.k, np.dtype(g.dtype).itemsize)):
            return None
        return NhwcFeaturesDot(g.m, g.n, g.k, g.trans_b, g.dtype,
                               (shape[1], shape[2], shape[3]))


def cpu_gemm(backend: Backend, device_id: int, gemm: Gemm) -> Callable[[Any, Any, Any], None]:
    """run(a, b, out) for gemm with NumPy's BLAS: np.dot on 2-D views for one product, float16
    through float32 buffers."""
    if gemm.dtype != "float16" and gemm.batch == 1 and gemm.k > 0:
        return BlasDot(gemm)
    return host_gemm(backend, device_id, gemm, stage_float16=True)


def dense_spec(backend: Backend, device_id: int, gemm: Gemm,
               shapes: Sequence[Sequence[int]]) -> DenseSpec:
    """gemm as dense's candidate set sees it (kernels/cpu/dense_choice.py): shapes are the
    inputs' then the output's, OpenBLAS's call made by cpu_gemm."""
    return DenseSpec(gemm.batch, gemm.m, gemm.n, gemm.k, gemm.trans_a, gemm.trans_b,
                     gemm.a_batches, gemm.b_batches, gemm.dtype,
                     tuple(tuple(int(d) for d in shape) for shape in shapes),
                     lambda: cpu_gemm(backend, device_id, gemm))


# The op's kernels by backend: CPU's one candidate set (OpenBLAS, dense's own strategies,
# oneDNN's matmul), OpenCL's GEMM, cuBLAS through CuPy.
def _gemm_factories(op: str) -> dict[str, Factory]:
    def cpu(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
            outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        gemm, _ = SHAPES[op](inputs, attrs)
        shapes = [s.shape for s in list(inputs) + list(outputs)]
        return dense_cpu(dense_spec(backend, device_id, gemm, shapes))

    def opencl(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
               outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        gemm, _ = SHAPES[op](inputs, attrs)
        return make_gemm(cast("OpenCLBackend", backend), device_id, gemm.opencl_shape())

    def cuda(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        gemm, _ = SHAPES[op](inputs, attrs)
        return host_gemm(backend, device_id, gemm)
    return {"cpu": cpu, "opencl": opencl, "cuda": cuda}


GEMM_ATTRS = {"dense": ("units", "out_dtype"),
              "matmul": ("units", "out_dtype", "transpose_a", "transpose_b"),
              "batch_matmul": ("out_dtype", "transpose_a", "transpose_b")}

for _op, _attrs in GEMM_ATTRS.items():
    define_op(_op, _gemm_infer(_op), 2, _attrs)
    for _kind, _factory in _gemm_factories(_op).items():
        kernel(_op, _kind)(_factory)


# -- bias_add -----------------------------------------------------------------------------------

def _bias_shape(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape bias broadcasts as: its length on axis, 1 on the later axes."""
    check_num_inputs("bias_add", inputs, 2)
    data, bias = inputs
    check_same_dtype("bias_add", inputs)
    check_dtype("bias_add", data, NUMERIC_DTYPES)
    check_rank("bias_add", bias, (1,), "bias")
    if len(data.shape) == 0:
        raise op_error("bias_add", f"data {data} is a scalar; it needs the axis the bias adds to")
    axis = normalize_axis("bias_add", int_attr("bias_add", attrs, "axis", 1), len(data.shape))
    if bias.shape[0] != data.shape[axis]:
        raise op_error("bias_add", f"bias {bias} has {bias.shape[0]} values but data {data} has "
                                   f"{data.shape[axis]} on axis {axis}")
    return (bias.shape[0],) + (1,) * (len(data.shape) - axis - 1)


def _bias_add_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _bias_shape(inputs, attrs)
    return [TensorSpec(tuple(inputs[0].shape), inputs[0].dtype)]


def _bias_add_host(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                   outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    xp = array_module(backend)
    shape = _bias_shape(inputs, attrs)

    def run(data: Any, bias: Any, out: Any) -> None:
        xp.add(data, bias if bias.shape == shape else bias.reshape(shape), out=out)
    return host_kernel(backend, device_id, run)


def _bias_add_cl(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    # numpy counterpart: np.add(data, bias.reshape(shape), out=out)
    shaped = TensorSpec(_bias_shape(inputs, attrs), inputs[1].dtype)
    return gpu_elementwise(backend, device_id, [inputs[0], shaped], outputs[0],
                           [("({0} + {1})", [0, 1], outputs[0].dtype)], "gr_bias_add")


define_op("bias_add", _bias_add_infer, 2, ("axis",), in_place=True)
kernel("bias_add", "cpu")(_bias_add_host)
kernel("bias_add", "cuda")(_bias_add_host)
kernel("bias_add", "opencl")(_bias_add_cl)

__all__ = ["Gemm", "SHAPES", "cpu_gemm", "host_gemm", "check_out_dtype", "np"]
