"""take on every backend against np.take (clip, wrap, fast; int32/int64 indices), and its errors."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec


@pytest.mark.parametrize("mode", ["clip", "wrap", "fast"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_take(backend_name, mode, axis, run_op, random_array) -> None:
    x = random_array((3, 4, 2), "float32", seed=7)
    extent = x.size if axis is None else x.shape[axis]
    raw = np.array([[0, extent - 1], [1, 2], [0, 1]], np.int32)
    idx = raw if mode == "fast" else np.array([[0, -1], [extent + 2, 2], [-extent - 1, 1]],
                                              np.int32)
    (got,) = run_op(backend_name, "take", [x, idx], {"axis": axis, "mode": mode})
    np_mode = "clip" if mode == "fast" else mode
    np.testing.assert_array_equal(got, np.take(x, idx, axis=axis, mode=np_mode))


def test_take_int64_indices_and_zero_size(backend_name, run_op) -> None:
    x = np.arange(10, dtype=np.int32)
    (got,) = run_op(backend_name, "take", [x, np.array([9, 0, 3], np.int64)], {"axis": 0})
    np.testing.assert_array_equal(got, [9, 0, 3])
    (got,) = run_op(backend_name, "take", [x, np.zeros((0,), np.int64)], {"axis": 0})
    assert got.shape == (0,)


@pytest.mark.parametrize("mode,axis", [("wrap", 0), ("clip", 1), ("fast", None)])
def test_a_host_take_takes_any_shape(make_function, mode, axis) -> None:
    """One CPU take serves every shape of its ranks (a decoder's padding-mask gather at each past
    length, kept by a symbolic module): the extent is read per call and the index workspace
    grows to the largest indices met."""
    from graph_runtime.device import cpu
    from graph_runtime.lib.prepared import capabilities
    chain = make_function("take")
    attrs = {"axis": axis, "mode": mode}
    specs = [TensorSpec((4, 3), "float32"), TensorSpec((2, 1), "int64")]
    kernel = chain.prepare(cpu(), specs, chain.infer(specs, attrs), attrs)
    assert capabilities(kernel).any_shape()
    rng = np.random.default_rng(3)
    for rows, count in ((4, 2), (9, 7), (5, 3), (30, 40)):
        x = rng.standard_normal((rows, 3)).astype(np.float32)
        extent = x.size if axis is None else x.shape[axis]
        idx = rng.integers(-2 * extent, 2 * extent, (count, 1)).astype(np.int64)
        want = np.take(x, idx, axis=axis, mode="clip" if mode == "fast" else mode)
        out = np.empty_like(want)
        kernel(x, idx, out)
        np.testing.assert_array_equal(out, want)
    with pytest.raises(LibraryError, match="take: cannot take from input 0 of shape"):
        kernel(np.zeros((0, 3) if axis != 1 else (4, 0), np.float32),
               np.zeros((2, 1), np.int64), np.empty((2, 1, 3) if axis == 0 else (4, 2, 1)
                                                   if axis == 1 else (2, 1), np.float32))


def test_errors_name_op_and_value(make_function) -> None:
    with pytest.raises(LibraryError, match=r"take: input 1 \(indices\) has dtype float32; "
                                           "supported: int32, int64"):
        make_function("take").infer([TensorSpec((4,), "float32")] * 2)
    with pytest.raises(LibraryError, match=r"take: cannot take from input 0 \(0,\) float32"):
        make_function("take").infer([TensorSpec((0,), "float32"), TensorSpec((2,), "int32")],
                                    {"axis": 0})


def ref_gather_elements(x: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    """ONNX GatherElements, element by element."""
    out = np.empty(idx.shape, x.dtype)
    for pos in np.ndindex(*idx.shape):
        src = list(pos)
        src[axis] = int(idx[pos]) % x.shape[axis]
        out[pos] = x[tuple(src)]
    return out


@pytest.mark.parametrize("axis,idx_shape,dtype", [(0, (2, 3, 2), "int64"),
                                                  (1, (3, 5, 2), "int32"),
                                                  (-1, (1, 2, 4), "int64")])
def test_gather_elements(backend_name, axis, idx_shape, dtype, run_op, random_array) -> None:
    x = random_array((3, 4, 2), "float32", seed=8)
    extent = x.shape[axis]
    rng = np.random.default_rng(9)
    idx = rng.integers(-extent, extent, size=idx_shape).astype(dtype)
    (got,) = run_op(backend_name, "gather_elements", [x, idx], {"axis": axis})
    np.testing.assert_array_equal(got, ref_gather_elements(x, idx, axis % 3))


def test_gather_elements_int_data(backend_name, run_op) -> None:
    x = np.arange(6, dtype=np.int64).reshape(2, 3) * 10**12
    idx = np.array([[1, 0, -1], [0, 0, 1]], np.int32)
    (got,) = run_op(backend_name, "gather_elements", [x, idx], {"axis": 0})
    np.testing.assert_array_equal(got, ref_gather_elements(x, idx, 0))


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "bool", "int8", "int64",
                                   "complex64", "complex128", "bfloat16", "float8_e5m2"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_elements_in_one_pass_for_every_item_size(dtype, axis, run_op) -> None:
    """Indices as long as the data off the axis take the CPU's compiled pass (items moved as
    unsigned integers of their size; complex128 has none and keeps NumPy's way): the same
    elements as the reference, bit for bit (ml_dtypes' types too), negative indices counted
    from the end."""
    from graph_runtime.lib.ops.gather import _compiled_gather
    rng = np.random.default_rng(11)
    shape = (3, 5, 4)
    x = (rng.standard_normal(shape) * 50).astype(dtype)
    idx_shape = tuple(7 if d == axis else n for d, n in enumerate(shape))
    for index_dtype in ("int32", "int64"):
        idx = rng.integers(-shape[axis], shape[axis], idx_shape).astype(index_dtype)
        specs = TensorSpec(shape, dtype), TensorSpec(idx_shape, index_dtype)
        assert (_compiled_gather(*specs, axis) is None) == (dtype == "complex128")
        (got,) = run_op("cpu", "gather_elements", [x, idx], {"axis": axis})
        assert got.dtype == x.dtype
        want = ref_gather_elements(x, idx, axis)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bit for bit


def test_gather_elements_errors(run_op, make_function) -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(LibraryError, match=r"gather_elements: index 3 at indices\[0, 1\] is "
                                           r"out of range for axis 1 of data \(2, 3\): "
                                           r"expected \[-3, 2\]"):
        run_op("cpu", "gather_elements", [x, np.array([[0, 3]], np.int64)], {"axis": 1})
    with pytest.raises(LibraryError, match=r"gather_elements: index -4 at indices\[1, 0\]"):
        run_op("cpu", "gather_elements", [x, np.array([[0], [-4]], np.int64)], {"axis": 1})
    f = make_function("gather_elements")
    with pytest.raises(LibraryError, match="gather_elements: indices .* must have the rank"):
        f.infer([TensorSpec((2, 3), "float32"), TensorSpec((2,), "int64")])
    with pytest.raises(LibraryError, match=r"gather_elements: indices \(3, 3\) int64 axis 0 has "
                                           r"3 entries but data \(2, 3\) float32 has only 2"):
        f.infer([TensorSpec((2, 3), "float32"), TensorSpec((3, 3), "int64")], {"axis": 1})
    with pytest.raises(LibraryError, match="gather_elements: attribute 'axis' = 2"):
        f.infer([TensorSpec((2, 3), "float32"), TensorSpec((2, 3), "int64")], {"axis": 2})
