"""scatter_elements and scatter_nd (cpu) against loop references of ONNX's definitions."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError

REDUCE = {"none": lambda a, b: b, "add": lambda a, b: a + b, "mul": lambda a, b: a * b,
          "max": np.maximum, "min": np.minimum}


def elements_reference(data, indices, updates, axis, reduction):
    out = data.astype(np.float64)
    for pos in np.ndindex(indices.shape):
        target = list(pos)
        target[axis] = indices[pos] % data.shape[axis]
        out[tuple(target)] = REDUCE[reduction](out[tuple(target)], updates[pos])
    return out


def nd_reference(data, indices, updates, reduction):
    out = data.astype(np.float64)
    for pos in np.ndindex(indices.shape[:-1]):
        target = tuple(int(i) % d for i, d in zip(indices[pos], data.shape))
        out[target] = REDUCE[reduction](out[target], updates[pos])
    return out


@pytest.mark.parametrize("reduction", list(REDUCE))
def test_scatter_elements(reduction, run_op, random_array, assert_close) -> None:
    rng = np.random.default_rng(1)
    data = random_array((4, 5, 3), "float32", seed=2)
    for axis in (0, 1, -1):
        shape = (3, 4, 2)
        indices = rng.integers(-data.shape[axis], data.shape[axis], shape).astype(np.int64)
        if reduction == "none":  # duplicates are ordered only for reductions
            indices = np.broadcast_to(np.arange(shape[axis]).reshape(
                [-1 if i == axis % 3 else 1 for i in range(3)]), shape).astype(np.int64) - 1
        updates = random_array(shape, "float32", seed=3)
        (got,) = run_op("cpu", "scatter_elements", [data, indices, updates],
                        {"axis": axis, "reduction": reduction})
        assert_close(got, elements_reference(data, indices, updates, axis % 3, reduction),
                     "float32")


@pytest.mark.parametrize("reduction", list(REDUCE))
def test_scatter_nd(reduction, run_op, random_array, assert_close) -> None:
    data = random_array((4, 3, 5), "float64", seed=4)
    indices = np.array([[[1, 2], [-1, 0]], [[1, 2], [0, -3]]], np.int64)  # a duplicate
    if reduction == "none":
        indices = np.array([[[1, 2], [-1, 0]], [[2, 2], [0, -3]]], np.int64)
    updates = random_array((2, 2, 5), "float64", seed=5)
    (got,) = run_op("cpu", "scatter_nd", [data, indices, updates], {"reduction": reduction})
    assert_close(got, nd_reference(data, indices, updates, reduction), "float64")


def test_scatter_out_of_range_index_is_refused_at_run(run_op) -> None:
    data = np.zeros((3, 2), np.float32)
    with pytest.raises(LibraryError, match="index 3 .*out of range for an axis of 3"):
        run_op("cpu", "scatter_elements", [data, np.array([[3, 0]]), np.ones((1, 2), "float32")],
               {"axis": 0})
    with pytest.raises(LibraryError, match="expected indices"):
        run_op("cpu", "scatter_nd", [data, np.zeros((2, 3), np.int64), np.ones(2, "float32")])
