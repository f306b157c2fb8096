"""Products through cuBLAS called directly (lib/kernels/cuda_gemm.py) against NumPy in float64,
over the layouts the kernels hand it: transposed views, broadcast batches, head views with a
stride-0 group, 4-D and 5-D batches, M, N or K of 1; what it does not take goes to cupy.matmul.
GPU tests skip without one."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from graph_runtime.lib.kernels.cuda_gemm import _matrix, _merged_batch, matmul_function


def _case(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


# name -> (a, b) as views of host arrays: each layout once
LAYOUTS: dict[str, Callable[[np.random.Generator, str], tuple[np.ndarray, np.ndarray]]] = {
    "2d": lambda r, d: (_case(r, d, (5, 7)), _case(r, d, (7, 3))),
    "a_transposed": lambda r, d: (_case(r, d, (7, 5)).T, _case(r, d, (7, 3))),
    "b_transposed": lambda r, d: (_case(r, d, (5, 7)), _case(r, d, (3, 7)).T),
    "both_transposed": lambda r, d: (_case(r, d, (4, 7, 5)).swapaxes(1, 2),
                                     _case(r, d, (4, 3, 7)).swapaxes(1, 2)),
    "broadcast_a": lambda r, d: (_case(r, d, (1, 5, 7)), _case(r, d, (6, 7, 3))),
    "broadcast_b": lambda r, d: (_case(r, d, (6, 5, 7)), _case(r, d, (7, 3))),
    "4d": lambda r, d: (_case(r, d, (2, 3, 5, 7)), _case(r, d, (2, 3, 7, 4))),
    "row_of_a_wider_array": lambda r, d: (_case(r, d, (5, 11))[:, 2:9], _case(r, d, (7, 3))),
    "m1": lambda r, d: (_case(r, d, (1, 7)), _case(r, d, (7, 3))),
    "n1": lambda r, d: (_case(r, d, (5, 7)), _case(r, d, (7, 1))),
    "k1": lambda r, d: (_case(r, d, (5, 1)), _case(r, d, (1, 3))),
}


def _heads(rng: np.random.Generator, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Attention's scores: q heads (batch, kv, group, tokens, dim) against k heads broadcast
    over the group (stride 0), both views into (batch, tokens, width) projections."""
    batch, tokens, kv, group, dim = 2, 5, 2, 3, 4
    q = _case(rng, dtype, (batch, tokens, kv * group * dim))
    k = _case(rng, dtype, (batch, tokens, kv * dim))
    qh = q.reshape(batch, tokens, kv, group, dim).transpose(0, 2, 3, 1, 4)
    kh = np.broadcast_to(k.reshape(batch, tokens, kv, 1, dim).transpose(0, 2, 3, 4, 1),
                         (batch, kv, group, dim, tokens))
    return qh, kh


def _on_gpu(host: np.ndarray) -> Any:
    """host's values in a GPU array with host's strides (the same view of a copied base)."""
    import cupy
    base = host.base if host.base is not None else host
    while getattr(base, "base", None) is not None:
        base = base.base
    offset = host.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    gpu_base = cupy.asarray(np.ascontiguousarray(base))
    return cupy.ndarray(host.shape, host.dtype, gpu_base.data + offset, host.strides)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("layout", [*LAYOUTS, "heads"])
def test_products_match_numpy(cuda_available: None, layout: str, dtype: str) -> None:
    import cupy
    from graph_runtime.lib.kernels.cuda_gemm import cublas_matmul
    rng = np.random.default_rng(0)
    a, b = _heads(rng, dtype) if layout == "heads" else LAYOUTS[layout](rng, dtype)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    ga, gb = _on_gpu(a), _on_gpu(b)
    np.testing.assert_array_equal(ga.get(), a)  # the views are the same views
    out = cupy.full(want.shape, np.nan, dtype)
    assert cublas_matmul(ga, gb, out)
    tol = 2e-3 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(out.get().astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.cuda
def test_what_cublas_cannot_take_goes_to_cupy(cuda_available: None) -> None:
    """int32, and an operand strided in both rows and columns, are refused by the direct path
    and computed by cupy.matmul through matmul_function."""
    import cupy
    from graph_runtime.lib.kernels.cuda_gemm import cublas_matmul
    matmul = matmul_function(cupy)
    rng = np.random.default_rng(2)
    ints = (rng.integers(-5, 5, (4, 6)).astype(np.int32), rng.integers(-5, 5, (6, 3)).astype(np.int32))
    out = cupy.empty((4, 3), np.int32)
    assert not cublas_matmul(cupy.asarray(ints[0]), cupy.asarray(ints[1]), out)
    np.testing.assert_array_equal(matmul(cupy.asarray(ints[0]), cupy.asarray(ints[1])).get(),
                                  ints[0] @ ints[1])
    a = rng.standard_normal((8, 12)).astype(np.float32)
    b = rng.standard_normal((6, 3)).astype(np.float32)
    ga = cupy.asarray(a)[::2, ::2]  # rows and columns both strided
    out = cupy.empty((4, 3), np.float32)
    assert not cublas_matmul(ga, cupy.asarray(b), out)
    matmul(ga, cupy.asarray(b), out=out)
    np.testing.assert_allclose(out.get(), a[::2, ::2] @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_a_product_captures_and_replays(cuda_available: None) -> None:
    """The reason this module exists: a product recorded in a CUDA graph, replayed on new
    operand values written into the same buffers."""
    import cupy
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.kernels.cuda_gemm import cublas_matmul
    stream = get_backend("cuda").stream(0)
    rng = np.random.default_rng(3)
    with cupy.cuda.Device(0), stream:
        a = cupy.asarray(rng.standard_normal((32, 64)).astype(np.float32))
        b = cupy.asarray(rng.standard_normal((64, 16)).astype(np.float32))
        out = cupy.empty((32, 16), np.float32)
        assert cublas_matmul(a, b, out)  # the handle and its workspace are made outside
        stream.begin_capture()
        try:
            assert cublas_matmul(a, b, out)
        finally:
            graph = stream.end_capture()
        a[...] = cupy.asarray(rng.standard_normal((32, 64)).astype(np.float32))
        graph.launch(stream)
        stream.synchronize()
        np.testing.assert_allclose(out.get(), a.get() @ b.get(), rtol=1e-4, atol=1e-4)


def test_layouts_cublas_reads_in_place() -> None:
    """(row-major, leading dimension) per view; None where neither axis is unit-strided."""
    assert _matrix(5, 7, 7, 1) == (True, 7)
    assert _matrix(5, 7, 11, 1) == (True, 11)  # rows of a wider array
    assert _matrix(5, 7, 1, 5) == (False, 5)  # a transposed view
    assert _matrix(1, 7, 0, 1) == (True, 7)  # one row: its stride is not read
    assert _matrix(5, 7, 2, 2) is None
    assert _matrix(5, 7, 3, 1) is None  # rows overlapping: no leading dimension for it


def test_batches_merge_where_every_operand_allows() -> None:
    """Neighbouring batch dims become one where each operand's strides chain; size-1 dims go."""
    shape, strides = _merged_batch((2, 3), [(3 * 35, 35), (0, 0), (3 * 15, 15)])
    assert shape == (6,) and strides == [(35,), (0,), (15,)]
    shape, strides = _merged_batch((2, 1, 3), [(60, 60, 20), (8, 8, 0), (30, 30, 10)])
    assert shape == (2, 3) and strides == [(60, 20), (8, 0), (30, 10)]
    assert _merged_batch((), [(), (), ()]) == ((1,), [(0,), (0,), (0,)])


def test_the_host_keeps_numpys_matmul() -> None:
    assert matmul_function(np) is np.matmul


@pytest.mark.cuda
def test_tf32_by_default_and_full_float32_when_off(cuda_available: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """GRAPH_RUNTIME_CUDA_TF32 is on unless set (as ONNX Runtime's CUDA provider): float32
    products within TF32's error, and on an Ampere or later GPU visibly not float32's (the
    tensor cores ran); off: within float32's error. Read when the kernel is made."""
    import cupy

    from graph_runtime import settings
    monkeypatch.delenv(settings.CUDA_TF32.name, raising=False)
    assert settings.word(settings.CUDA_TF32) == "on"
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((512, 192)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    scale = float(np.abs(want).max())
    error = {}
    for word in ("on", "off"):
        monkeypatch.setenv(settings.CUDA_TF32.name, word)
        matmul = matmul_function(cupy)
        monkeypatch.setenv(settings.CUDA_TF32.name, "off" if word == "on" else "on")
        got = matmul(cupy.asarray(a), cupy.asarray(b)).get().astype(np.float64)
        error[word] = float(np.abs(got - want).max()) / scale
    assert error["off"] <= 1e-5, error
    assert error["on"] <= 5e-3, error
    if int(cupy.cuda.Device().compute_capability) >= 80:
        assert error["on"] > 1e-5, error
