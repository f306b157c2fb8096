"""Data-dependent ops (lib/ops/data_dependent.py) against references written from ONNX's
definitions with Python loops and float64 NumPy; the static kernel refuses another count."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.registry import get_op
from graph_runtime.lib.registry import get_op


def _host(op: str):  # noqa: ANN202 - the op's host function, as the registry holds it
    fn = get_op(op).host
    assert fn is not None
    return fn


def _unique_reference(x: np.ndarray, axis: int | None, sorted_: bool) -> list[np.ndarray]:
    """ONNX Unique by loops: slices along axis as tuples, first occurrence, inverse, counts."""
    data = x.reshape(-1) if axis is None else x
    ax = 0 if axis is None else axis
    keys = [tuple(np.take(data, i, axis=ax).astype(np.float64).reshape(-1).tolist())
            for i in range(data.shape[ax])]
    first: dict[tuple, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    order = sorted(first, key=lambda k: (k if sorted_ else first[k]))
    where = {key: j for j, key in enumerate(order)}
    y = np.take(data, [first[k] for k in order], axis=ax)
    return [y, np.array([first[k] for k in order], np.int64),
            np.array([where[k] for k in keys], np.int64),
            np.array([keys.count(k) for k in order], np.int64)]


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 4), (0, 3)])
def test_nonzero_against_loops(shape: tuple[int, ...]) -> None:
    x = (np.random.default_rng(0).uniform(size=shape) > 0.6).astype(np.float32)
    (got,) = _host("nonzero")([x], {"count": 0})
    flat = x.reshape(-1) if x.ndim == 0 else x
    want = np.array([idx for idx in np.ndindex(flat.shape) if flat[idx] != 0],
                    np.int64).reshape(-1, flat.ndim).T
    assert got.dtype == np.int64 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("sorted_", [True, False])
def test_unique_against_loops(axis: int | None, sorted_: bool) -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 3, (6, 4)).astype(np.float32)
    x[3] = x[1]  # a repeated row for the axis cases
    attrs = {"count": 0, "sorted": int(sorted_)}
    if axis is not None:
        attrs.update(axis=axis, has_axis=1)
    got = _host("unique")([x], attrs)
    for g, w in zip(got, _unique_reference(x, axis, sorted_)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_unique_of_nothing() -> None:
    got = _host("unique")([np.zeros((0,), np.float32)], {"count": 0})
    assert [g.shape for g in got] == [(0,), (0,), (0,), (0,)]


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_compress_against_loops(axis: int | None) -> None:
    x = np.arange(24, dtype=np.float64).reshape(4, 6)
    condition = np.array([True, False, True, True])
    attrs = {"count": 0} if axis is None else {"count": 0, "axis": axis, "has_axis": 1}
    (got,) = _host("compress")([x, condition], attrs)
    if axis is None:
        want = np.array([v for v, c in zip(x.reshape(-1), condition) if c])
    else:
        want = np.stack([np.take(x, i, axis=axis) for i, c in enumerate(condition) if c],
                        axis=axis)
    np.testing.assert_array_equal(got, want)


def test_compress_refuses_a_condition_past_the_axis() -> None:
    with pytest.raises(LibraryError, match="condition selects index 4 of an axis of size 4"):
        _host("compress")([np.zeros((4, 2)), np.array([0, 0, 0, 0, 1], bool)],
                                   {"count": 0, "axis": 0, "has_axis": 1})


def test_nms_keeps_every_selected_box() -> None:
    """ONNX's suppress_by_IOU example: three boxes survive, in score order."""
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, -0.1, 1, 0.9], [0, 10, 1, 11],
                       [0, 10.1, 1, 11.1], [0, 100, 1, 101]]], np.float32)
    scores = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3]]], np.float32)
    (got,) = _host("non_max_suppression_dynamic")(
        [boxes, scores, np.array([3]), np.array([0.5], np.float32),
         np.array([0.0], np.float32)], {"count": 0, "use_score_threshold": 1})
    np.testing.assert_array_equal(got, [[0, 0, 3], [0, 0, 0], [0, 0, 5]])


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_dynamic_reads_k_at_run_time(largest: int) -> None:
    x = np.array([[3, 1, 3, 2], [0, 5, 5, 4]], np.float32)  # ties: the lower index first
    values, indices = _host("topk_dynamic")(
        [x, np.array([3])], {"count": 0, "axis": 1, "largest": largest})
    rows = [sorted(range(4), key=lambda j: (-r[j] if largest else r[j], j))[:3] for r in x]
    np.testing.assert_array_equal(indices, rows)
    np.testing.assert_array_equal(values, np.take_along_axis(x, np.array(rows), 1))
    with pytest.raises(LibraryError, match="expected 0 <= k <= 4"):
        _host("topk_dynamic")([x, np.array([5])], {"count": 0, "axis": 1})


def test_static_kernel_refuses_another_count() -> None:
    """In a graph that states the count, the CPU kernel checks the data gives that many."""
    op = get_op("nonzero")
    spec = TensorSpec((5,), "float32")
    out = op.infer([spec], {"count": 3})
    assert out == [TensorSpec((1, 3), "int64")]
    run = op.kernels["cpu"](None, 0, [spec], out, {"count": 3})
    result = np.empty((1, 3), np.int64)
    run(np.array([1, 0, 2, 0, 3], np.float32), result)
    np.testing.assert_array_equal(result, [[0, 2, 4]])
    with pytest.raises(LibraryError, match=r"output 0 is \(1, 2\) for this data; the graph was "
                                           r"planned for \(1, 3\)"):
        run(np.array([1, 0, 2, 0, 0], np.float32), result)
