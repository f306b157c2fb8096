"""Data-movement ops on every backend against NumPy, incl. Relay's special values and errors."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.module import TensorSpec

X_SHAPE = (2, 3, 4)
# (op, attrs, NumPy reference of x); every dtype-agnostic copy runs for float32 and float16.
UNARY_CASES = [
    ("reshape", {"newshape": [0, -1]}, lambda x: x.reshape(2, 12)),
    ("reshape", {"newshape": [-1, 4]}, lambda x: x.reshape(6, 4)),
    ("reshape", {"newshape": [-2]}, lambda x: x),
    ("reshape", {"newshape": [-3, 4]}, lambda x: x.reshape(6, 4)),
    ("reshape", {"newshape": [-4, 1, -1, 0, 4]}, lambda x: x.reshape(1, 2, 3, 4)),
    ("reshape", {"newshape": [2, 0, 0, 1], "allowzero": False}, lambda x: x.reshape(2, 3, 4, 1)),
    ("batch_flatten", {}, lambda x: x.reshape(2, 12)),
    ("flatten", {}, lambda x: x.reshape(2, 12)),
    ("transpose", {}, lambda x: x.transpose()),
    ("transpose", {"axes": [1, -1, 0]}, lambda x: x.transpose(1, 2, 0)),
    ("strided_slice", {"begin": [1, 0, 1], "end": [2, 3, 4], "strides": [1, 2, 2]},
     lambda x: x[1:2, 0:3:2, 1:4:2]),
    ("strided_slice", {"begin": [-1, 10], "end": [-3, -10], "strides": [-1, -1]},
     lambda x: x[-1:-3:-1, 10:-10:-1]),
    ("strided_slice", {"begin": [1], "end": [3], "axes": [2]}, lambda x: x[:, :, 1:3]),
    ("strided_slice", {"begin": [0, 1], "end": [-1, 2], "slice_mode": "size"},
     lambda x: x[0:, 1:3]),
    ("strided_slice", {"begin": [2], "end": [2]}, lambda x: x[2:2]),
    ("pad", {"pad_width": [[1, 0], [0, 2], [1, 1]], "pad_value": 1.5},
     lambda x: np.pad(x, [(1, 0), (0, 2), (1, 1)], constant_values=1.5)),
    ("pad", {"pad_width": [[0, 0], [0, 0], [0, 0]]}, lambda x: x),
    ("expand_dims", {"axis": 1, "num_newaxis": 2}, lambda x: x[:, None, None]),
    ("expand_dims", {"axis": -1}, lambda x: x[..., None]),
    ("squeeze", {}, lambda x: x),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_unary_transforms(backend_name, dtype, run_op, random_array, assert_close) -> None:
    x = random_array(X_SHAPE, dtype, seed=1)
    for op, attrs, ref in UNARY_CASES:
        want = ref(x)
        (got,) = run_op(backend_name, op, [x], attrs)
        assert_close(got, want.astype(np.float64), dtype)


def test_squeeze_and_int_copies(backend_name, run_op, random_array) -> None:
    x = random_array((1, 3, 1, 2), "int64", -9, 9, seed=2)
    for attrs, want in (({}, x.reshape(3, 2)), ({"axis": [0]}, x[0]), ({"axis": -2}, x[:, :, 0])):
        (got,) = run_op(backend_name, "squeeze", [x], attrs)
        np.testing.assert_array_equal(got, want)
    (got,) = run_op(backend_name, "transpose", [x], {"axes": [3, 1, 0, 2]})
    np.testing.assert_array_equal(got, x.transpose(3, 1, 0, 2))


@pytest.mark.parametrize("dtype", ["float32", "int32", "float64"])
def test_concatenate(backend_name, dtype, run_op, random_array) -> None:
    a = random_array((2, 3), dtype, seed=3)
    b = random_array((2, 0), dtype, seed=4)
    c = random_array((2, 5), dtype, seed=5)
    (got,) = run_op(backend_name, "concatenate", [a, b, c], {"axis": -1})
    np.testing.assert_array_equal(got, np.concatenate([a, b, c], axis=1))
    (got,) = run_op(backend_name, "concatenate", [a, a])
    np.testing.assert_array_equal(got, np.concatenate([a, a]))


@pytest.mark.parametrize("sections,axis", [(3, 1), ([1, 4], 1), ([2, 2, 9], -1), (1, 0)])
def test_split(backend_name, sections, axis, run_op, random_array) -> None:
    x = random_array((2, 6), "float32", seed=6)
    got = run_op(backend_name, "split", [x], {"indices_or_sections": sections, "axis": axis})
    want = np.split(x, sections, axis=axis)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


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


def test_zero_size_dims(backend_name, run_op) -> None:
    x = np.zeros((2, 0, 3), np.float32)
    for op, attrs, shape in (("transpose", {}, (3, 0, 2)), ("reshape", {"newshape": [0, -1, 3]},
                                                           (2, 0, 3)),
                             ("reshape", {"newshape": [0, 5], "allowzero": 1}, (0, 5)),
                             ("pad", {"pad_width": [[0, 0], [1, 1], [0, 0]]}, (2, 2, 3)),
                             ("strided_slice", {"begin": [1], "end": [2]}, (1, 0, 3))):
        (got,) = run_op(backend_name, op, [x], attrs)
        assert got.shape == shape, op
        assert not got.any(), op


@pytest.mark.parametrize("op,attrs,spec,message", [
    ("transpose", {"axes": [0, 2]}, (2, 3, 4),
     r"transpose: axes \(0, 2\) has 2 entries but the input has rank 3"),
    ("transpose", {"axes": [0, 0, 1]}, (2, 3, 4),
     r"transpose: attribute 'axes' = \[0, 0, 1\]: expected a permutation of 0..2"),
    ("reshape", {"newshape": [5, -1]}, (2, 3, 4),
     r"reshape: newshape \[5, -1\]: cannot infer -1 for input shape \(2, 3, 4\)"),
    ("reshape", {"newshape": [-1, -1]}, (2, 3, 4), "expected at most one -1"),
    ("reshape", {"newshape": [7]}, (2, 3, 4), r"reshape: newshape \[7\] gives \(7,\) with 7 "
     r"elements but the input \(2, 3, 4\) has 24"),
    ("reshape", {"newshape": [0, 0, 0, 0]}, (2, 3, 4), "refers to input axis 3"),
    ("reshape", {}, (2,), "reshape: missing required attribute 'newshape'"),
    ("squeeze", {"axis": [1]}, (2, 3), r"squeeze: axis 1 of input 0 \(2, 3\) float32 has size 3"),
    ("split", {"indices_or_sections": 4}, (2, 6), "split: attribute 'indices_or_sections' = 4: "
     "expected a positive number of sections dividing the axis size 2"),
    ("strided_slice", {"begin": [0], "end": [1], "strides": [0]}, (4,),
     "strided_slice: attribute 'strides' = \\[0\\]: expected non-zero steps"),
    ("strided_slice", {"begin": [0, 0, 0]}, (4,), "expected at most 1 entries"),
    ("pad", {"pad_width": [[1, 1]]}, (2, 3), r"pad: attribute 'pad_width' = \[\[1, 1\]\]: "
     r"expected 2 pairs \[before, after\]"),
    ("pad", {"pad_width": [[0, 0]], "pad_mode": "edge"}, (2,),
     "pad: attribute 'pad_mode' = 'edge': expected one of 'constant'"),
    ("expand_dims", {"axis": 4}, (2, 3), r"expand_dims: attribute 'axis' = 4: expected an axis "
     r"in \[-3, 3\)"),
    ("concatenate", {"axis": 2}, (2, 3), r"concatenate: attribute 'axis' = 2"),
    ("batch_flatten", {}, (), "batch_flatten: input 0 \\(\\) float32 is a scalar"),
])
def test_errors_name_op_and_value(op, attrs, spec, message, make_function) -> None:
    with pytest.raises(LibraryError, match=message):
        make_function(op).infer([TensorSpec(spec, "float32")], attrs)


def test_multi_input_errors(make_function) -> None:
    with pytest.raises(LibraryError, match=r"concatenate: input 1 has shape \(3, 3\) but input 0 "
                                           r"has \(2, 3\); they may differ only on axis 1"):
        make_function("concatenate").infer([TensorSpec((2, 3), "float32"),
                                            TensorSpec((3, 3), "float32")], {"axis": 1})
    with pytest.raises(LibraryError, match=r"take: input 1 \(indices\) has dtype float32; "
                                           "supported: int32, int64"):
        make_function("take").infer([TensorSpec((4,), "float32")] * 2)
    with pytest.raises(LibraryError, match=r"take: cannot take from input 0 \(0,\) float32"):
        make_function("take").infer([TensorSpec((0,), "float32"), TensorSpec((2,), "int32")],
                                    {"axis": 0})
