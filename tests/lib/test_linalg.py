"""dense, matmul, batch_matmul and bias_add on every backend against float64 NumPy references."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec

# Products sum K terms, so absolute errors grow with K: per-dtype tolerances for these ops.
SUM_TOLERANCES = {"float16": {"rtol": 1e-2, "atol": 5e-2}, "float32": {"rtol": 1e-5, "atol": 1e-4},
                  "float64": {"rtol": 1e-10, "atol": 1e-10}}


@pytest.fixture(name="check_op")
def check_sum_op(run_op):
    """check_op with SUM_TOLERANCES (integers compare exactly)."""
    def check(backend_name, func, inputs, reference, attrs=None):
        (got,) = run_op(backend_name, func, inputs, attrs)
        assert got.shape == reference.shape, f"shape {got.shape} != reference {reference.shape}"
        assert got.dtype == inputs[0].dtype
        tol = SUM_TOLERANCES.get(str(got.dtype))
        if tol is None:
            np.testing.assert_array_equal(got, reference)
        else:
            np.testing.assert_allclose(got.astype(np.float64), reference, **tol)
    return check


def _ref_products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-by-column dot products written out with einsum over float64: a [B, M, K], b [B, K, N]."""
    return np.einsum("bmk,bkn->bmn", a.astype(np.float64), b.astype(np.float64))


def _ref_dense(data: np.ndarray, weight: np.ndarray) -> np.ndarray:
    flat = data.reshape(1, int(np.prod(data.shape[:-1])), data.shape[-1])
    out = _ref_products(flat, weight.T[None])[0]
    return out.reshape(data.shape[:-1] + (weight.shape[0],))


# (data shape, weight shape): size-1 dims, zero rows, zero features, ranks 1..3, and sizes that
# cross the OpenCL GEMM's 64-wide tiles.
DENSE_SHAPES = [((3, 5), (4, 5)), ((2, 3, 5), (4, 5)), ((1, 1), (1, 1)), ((0, 5), (4, 5)),
                ((3, 0), (4, 0)), ((7,), (2, 7)), ((70, 130), (33, 130)), ((5, 3), (0, 3))]


@pytest.mark.parametrize("data_shape,weight_shape", DENSE_SHAPES)
def test_dense_float32(backend_name: str, data_shape, weight_shape, check_op,
                       random_array) -> None:
    data = random_array(data_shape, "float32", seed=1)
    weight = random_array(weight_shape, "float32", seed=2)
    check_op(backend_name, "dense", [data, weight], _ref_dense(data, weight))


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_dense_dtypes_and_units(backend_name: str, dtype: str, check_op, random_array) -> None:
    data = random_array((4, 6), dtype, seed=3)
    weight = random_array((5, 6), dtype, seed=4)
    check_op(backend_name, "dense", [data, weight], _ref_dense(data, weight),
             {"units": 5, "out_dtype": dtype})


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul_transposes(backend_name: str, transpose_a: bool, transpose_b: bool, check_op,
                           random_array) -> None:
    m, k, n = 5, 7, 3
    a = random_array((k, m) if transpose_a else (m, k), "float32", seed=5)
    b = random_array((n, k) if transpose_b else (k, n), "float32", seed=6)
    a_mk = a.T if transpose_a else a
    b_kn = b.T if transpose_b else b
    check_op(backend_name, "matmul", [a, b], _ref_products(a_mk[None], b_kn[None])[0],
             {"transpose_a": transpose_a, "transpose_b": transpose_b})


def test_matmul_leading_dims(backend_name: str, check_op, random_array) -> None:
    a = random_array((2, 3, 4), "float64", seed=7)
    b = random_array((4, 6), "float64", seed=8)
    want = _ref_products(a.reshape(1, 6, 4), b[None])[0].reshape(2, 3, 6)
    check_op(backend_name, "matmul", [a, b], want)


# (x shape, y shape, transpose_a, transpose_b): Relay's default transpose_b=True, broadcast batch
# of 1 on either side, and a zero batch.
BATCH_CASES = [((2, 3, 4), (2, 5, 4), False, True), ((2, 4, 3), (2, 4, 5), True, False),
               ((1, 3, 4), (3, 5, 4), False, True), ((3, 3, 4), (1, 4, 5), False, False),
               ((0, 3, 4), (1, 5, 4), False, True), ((1, 1, 1), (1, 1, 1), False, True)]


@pytest.mark.parametrize("x_shape,y_shape,transpose_a,transpose_b", BATCH_CASES)
def test_batch_matmul(backend_name: str, x_shape, y_shape, transpose_a, transpose_b, check_op,
                      random_array) -> None:
    x = random_array(x_shape, "float32", seed=9)
    y = random_array(y_shape, "float32", seed=10)
    x_mk = x.swapaxes(1, 2) if transpose_a else x
    y_kn = y.swapaxes(1, 2) if transpose_b else y
    batch = max(x.shape[0], y.shape[0]) if 0 not in (x.shape[0], y.shape[0]) else 0
    x_b = np.broadcast_to(x_mk, (batch,) + x_mk.shape[1:])
    y_b = np.broadcast_to(y_kn, (batch,) + y_kn.shape[1:])
    attrs = {"transpose_a": transpose_a, "transpose_b": transpose_b}
    if transpose_b:
        attrs.pop("transpose_b")  # exercises the default
    check_op(backend_name, "batch_matmul", [x, y], _ref_products(x_b, y_b), attrs)


def test_batch_matmul_float16(backend_name: str, check_op, random_array) -> None:
    x = random_array((2, 3, 8), "float16", seed=11)
    y = random_array((2, 5, 8), "float16", seed=12)
    check_op(backend_name, "batch_matmul", [x, y], _ref_products(x, y.swapaxes(1, 2)))


@pytest.mark.parametrize("shape,axis,dtype", [((2, 3, 4), None, "float32"),
                                              ((2, 3, 4), -1, "float64"),
                                              ((5, 2), 0, "int32"), ((0, 3), 1, "float16"),
                                              ((1, 1, 1, 1), 2, "float32")])
def test_bias_add(backend_name: str, shape, axis, dtype, check_op, random_array) -> None:
    data = random_array(shape, dtype, seed=13)
    length = shape[1 if axis is None else axis]
    bias = random_array((length,), dtype, seed=14)
    where = (1 if axis is None else axis) % len(shape)
    want = data.astype(np.float64) + bias.astype(np.float64).reshape(
        (length,) + (1,) * (len(shape) - where - 1))
    if dtype == "int32":
        want = want.astype(np.int32)
    attrs = {} if axis is None else {"axis": axis}
    check_op(backend_name, "bias_add", [data, bias], want, attrs)


def test_dense_bias_chain(backend_name: str, check_op, random_array) -> None:
    data = random_array((3, 8), "float32", seed=15)
    weight = random_array((4, 8), "float32", seed=16)
    bias = random_array((4,), "float32", seed=17)
    want = _ref_dense(data, weight) + bias.astype(np.float64)
    check_op(backend_name, [{"op": "dense"}, {"op": "bias_add", "axis": -1}],
             [data, weight, bias], want)


# -- validation at create() time ----------------------------------------------------------------

ERRORS = [
    ("dense", [((3, 5), "float32"), ((4, 6), "float32")], {},
     r"dense: data \(3, 5\) float32 has 5 features .* weight \(4, 6\) float32 has 6"),
    ("dense", [((3, 5), "float32"), ((4, 5), "float32")], {"units": 3},
     r"dense: attribute 'units' = 3: expected 4"),
    ("dense", [((3, 5), "float32"), ((4, 5, 1), "float32")], {}, r"dense: weight has shape"),
    ("dense", [((3, 5), "float32"), ((4, 5), "float64")], {},
     r"dense: input 1 has dtype float64 but input 0 has float32"),
    ("dense", [((3, 5), "int32"), ((4, 5), "int32")], {}, r"dense: input 0 has dtype int32"),
    ("dense", [((3, 5), "float32"), ((4, 5), "float32")], {"out_dtype": "float64"},
     r"dense: attribute 'out_dtype' = 'float64'"),
    ("matmul", [((3, 5), "float32"), ((4, 6), "float32")], {"transpose_b": True},
     r"matmul: input 0 \(3, 5\) float32 gives K = 5 .* K = 6 \(transpose_b=True\)"),
    ("matmul", [((3, 5, 2), "float32"), ((3, 6), "float32")], {"transpose_a": True},
     r"matmul: input 0 \(transpose_a\) has shape \(3, 5, 2\)"),
    ("batch_matmul", [((2, 3, 4), "float32"), ((3, 5, 4), "float32")], {},
     r"batch_matmul: batch sizes differ: x has 2, y has 3"),
    ("batch_matmul", [((2, 3, 4), "float32"), ((2, 5, 4), "float32")], {"transpose_b": False},
     r"batch_matmul: x .* gives K = 4 .* y \(2, 5, 4\) float32 gives K = 5"),
    ("batch_matmul", [((3, 4), "float32"), ((2, 5, 4), "float32")], {},
     r"batch_matmul: x has shape \(3, 4\) \(rank 2\); expected rank 3"),
    ("bias_add", [((2, 3), "float32"), ((2,), "float32")], {},
     r"bias_add: bias \(2,\) float32 has 2 values but data \(2, 3\) float32 has 3 on axis 1"),
    ("bias_add", [((2, 3), "float32"), ((3,), "float32")], {"axis": 2},
     r"bias_add: attribute 'axis' = 2: expected an axis in \[-2, 2\)"),
    ("dense", [((3, 5), "float32"), ((4, 5), "float32")], {"unit": 4},
     r"dense: unknown attribute 'unit'; it accepts: units, out_dtype"),
]


@pytest.mark.parametrize("op,specs,attrs,message", ERRORS)
def test_errors(op: str, specs, attrs, message: str, make_function) -> None:
    inputs = [TensorSpec(shape, dtype) for shape, dtype in specs]
    with pytest.raises(LibraryError, match=message):
        make_function(op).infer(inputs, attrs)


# -- the OpenCL GEMM itself: both implementations, views at offsets, per-group operands ---------

GEMM_CASES = [  # m, n, k, trans_a, trans_b, batch, a_batches, b_batches
    (5, 7, 3, False, False, 1, 1, 1), (70, 33, 130, True, False, 2, 2, 1),
    (2, 65, 17, False, True, 3, 1, 3), (20, 20, 40, True, True, 4, 2, 4),
    (4, 4, 0, False, False, 1, 1, 1), (1, 70, 37, False, True, 2, 2, 1),
    (25, 34, 37, False, True, 2, 1, 2)]


# Every case on the tiled kernel; CLBlast (its first use compiles for tens of seconds on PoCL)
# on one batched, broadcast, transposed case; auto on a per-group case, where it must fall back
# to the tiled kernel without touching CLBlast.
IMPL_CASES = ([("tiled", c) for c in GEMM_CASES] + [("clblast", GEMM_CASES[2]),
                                                     ("clblast", GEMM_CASES[0]),
                                                     ("auto", GEMM_CASES[3])])


def _check_gemm(case, dtype: str, random_array, make) -> None:
    """Run make(backend, shape) on case's operands, views at odd offsets into one buffer."""
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.kernels.opencl.gemm import GemmShape
    m, n, k, trans_a, trans_b, batch, a_batches, b_batches = case
    backend = get_backend("opencl")
    a = random_array((a_batches,) + ((k, m) if trans_a else (m, k)), dtype, seed=21)
    b = random_array((b_batches,) + ((n, k) if trans_b else (k, n)), dtype, seed=22)
    # Operands are views 256 bytes into one buffer, as the executor's storage pool hands out;
    # b and c also start at odd element offsets, so no vector access may assume alignment.
    size = a.itemsize
    b_at = 256 + a.nbytes + size
    c_at = b_at + b.nbytes + size
    buffer = backend.alloc(0, c_at + batch * m * n * size)
    a_dev = backend.view(buffer, 256, a.shape, a.dtype)
    b_dev = backend.view(buffer, b_at, b.shape, b.dtype)
    c_dev = backend.view(buffer, c_at, (batch, m, n), a.dtype)
    backend.from_host(a, a_dev)
    backend.from_host(b, b_dev)
    shape = GemmShape(m, n, k, dtype, trans_a, trans_b, batch=batch, a_batches=a_batches,
                      b_batches=b_batches, a_stride=m * k, b_stride=k * n, c_stride=m * n)
    make(backend, shape)(a_dev, b_dev, c_dev)
    a_mk = a.swapaxes(1, 2) if trans_a else a
    b_kn = b.swapaxes(1, 2) if trans_b else b
    want = _ref_products(a_mk[np.arange(batch) % a_batches], b_kn[np.arange(batch) % b_batches])
    got = backend.to_host(c_dev).astype(np.float64)
    np.testing.assert_allclose(got, want, **SUM_TOLERANCES[dtype])
    np.testing.assert_array_equal(backend.to_host(a_dev), a)  # operands untouched
    np.testing.assert_array_equal(backend.to_host(b_dev), b)


@pytest.mark.opencl
@pytest.mark.parametrize("impl,case", IMPL_CASES)
def test_opencl_gemm(impl: str, case, opencl_available, random_array) -> None:
    from graph_runtime.lib.kernels.opencl.gemm import clblast_available, make_gemm
    if impl == "clblast" and not clblast_available():
        pytest.skip("pyclblast is not installed")
    _check_gemm(case, "float32", random_array,
                lambda backend, shape: make_gemm(backend, 0, shape, impl))


def _variant_cases() -> list[tuple[str, tuple, str]]:
    """Every case on every variant that serves it (dot needs A (M, K), B (N, K)); float16 and
    float64 (8-wide vectors) on the cases that cross blocks."""
    cases = []
    for variant in ("local", "packed", "dot", "direct"):
        for case in GEMM_CASES:
            if variant == "dot" and (case[3] or not case[4]):
                continue
            cases.append((variant, case, "float32"))
        for case in GEMM_CASES[1:] if variant != "dot" else GEMM_CASES[5:]:
            cases.extend([(variant, case, "float16"), (variant, case, "float64")])
    return cases


@pytest.mark.opencl
@pytest.mark.parametrize("variant,case,dtype", _variant_cases())
def test_opencl_gemm_variants(variant: str, case, dtype: str, opencl_available,
                              random_array) -> None:
    """Each of our kernel families, forced, whatever the device type would pick."""
    from graph_runtime.lib.kernels.opencl.gemm import tiled_gemm
    _check_gemm(case, dtype, random_array,
                lambda backend, shape: tiled_gemm(backend, 0, shape, variant=variant))


@pytest.mark.opencl
@pytest.mark.parametrize("vw,mb", [(4, 6), (8, 6), (8, 12)])
@pytest.mark.parametrize("case", [GEMM_CASES[1], GEMM_CASES[3], GEMM_CASES[6]])
def test_opencl_gemm_cpu_blockings(vw: int, mb: int, case, opencl_available,
                                   random_array) -> None:
    """The CPU kernels with the narrower vectors other CPUs (AVX2, SSE) get; dot needs trans_b."""
    from graph_runtime.lib.kernels.opencl.gemm_cpu import Blocking, packed_gemm
    from graph_runtime.lib.kernels.opencl.gemm_dot import dot_gemm
    block = Blocking(vw, mb)
    _check_gemm(case, "float32", random_array,
                lambda backend, shape: packed_gemm(backend, 0, shape.with_defaults(), None, block))
    if case[4] and not case[3]:
        _check_gemm(case, "float64", random_array,
                    lambda backend, shape: dot_gemm(backend, 0, shape.with_defaults(), block))


def test_opencl_gemm_variant_choice() -> None:
    """CPU devices: dot for few-row dense, packed for the rest, direct only when tiny; GPUs:
    local-memory tiles, direct when thin."""
    from graph_runtime.lib.kernels.opencl.gemm import GemmShape, pick_variant
    dense_1 = GemmShape(1, 512, 512, "float32", trans_b=True)
    dense_256 = GemmShape(256, 1024, 1024, "float32", trans_b=True)
    square = GemmShape(128, 128, 128, "float32")
    tiny = GemmShape(3, 5, 7, "float32")
    assert [pick_variant(s, cpu=True) for s in (dense_1, dense_256, square, tiny)] == [
        "dot", "packed", "packed", "direct"]
    assert [pick_variant(s, cpu=False) for s in (dense_1, dense_256, square, tiny)] == [
        "direct", "local", "local", "direct"]


def test_opencl_gemm_variant_errors(opencl_available) -> None:
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.kernels.opencl.gemm import GemmShape, tiled_gemm
    backend = get_backend("opencl")
    with pytest.raises(LibraryError, match=r"gemm: variant 'fast': expected one of local, "):
        tiled_gemm(backend, 0, GemmShape(2, 2, 2, "float32"), variant="fast")
    with pytest.raises(LibraryError, match=r"gemm: the dot variant needs A \(M, K\) and B "
                                           r"\(N, K\) .* got trans_a=False, trans_b=False"):
        tiled_gemm(backend, 0, GemmShape(2, 2, 2, "float32"), variant="dot")


def test_opencl_gemm_unknown_impl(opencl_available) -> None:
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.kernels.opencl.gemm import GemmShape, make_gemm
    with pytest.raises(LibraryError, match=r"gemm: impl 'fast': expected 'tiled', 'clblast'"):
        make_gemm(get_backend("opencl"), 0, GemmShape(2, 2, 2, "float32"), "fast")


def test_each_backend_has_its_own_kernel_factories() -> None:
    """dense, matmul and batch_matmul (and pools, softmax, layer_norm, the unary activations,
    batch_norm) register a factory per backend instead of branching on the backend's name
    inside one. What remains are library quirks inside kernels shared by NumPy and CuPy."""
    import re
    from pathlib import Path

    import graph_runtime.lib.ops as ops
    from graph_runtime.lib.registry import get_op
    branches = sorted(f"{path.name}: {line.strip()}"
                      for path in Path(ops.__file__).parent.glob("*.py")
                      for line in path.read_text(encoding="utf-8").splitlines()
                      if re.search(r"backend\.name ==|\.name == \"", line))
    assert branches == [
        "conv.py: return wide_dtype(dtype) if backend.name == \"cpu\" else dtype",
        "gather.py: check = backend.name == \"cpu\"",
        "reduce.py: if op == \"min\" and backend.name == \"cuda\":"]
    for op in ("dense", "matmul", "batch_matmul", "max_pool2d", "softmax", "layer_norm",
               "gelu", "batch_norm"):
        assert set(get_op(op).kernels) == {"cpu", "cuda", "opencl"}, op  # none left out
