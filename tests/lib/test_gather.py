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


def test_errors_name_op_and_value(make_function) -> None:
    with pytest.raises(LibraryError, match=r"take: input 1 \(indices\) has dtype float32; "
                                           "supported: int32, int64"):
        make_function("take").infer([TensorSpec((4,), "float32")] * 2)
    with pytest.raises(LibraryError, match=r"take: cannot take from input 0 \(0,\) float32"):
        make_function("take").infer([TensorSpec((0,), "float32"), TensorSpec((2,), "int32")],
                                    {"axis": 0})
