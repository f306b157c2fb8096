"""strided_slice, split, concatenate and pad on every backend against NumPy, incl. errors."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec

X_SHAPE = (2, 3, 4)
# (op, attrs, NumPy reference of x); every dtype-agnostic copy runs for float32 and float16.
UNARY_CASES = [
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
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op,attrs,ref", UNARY_CASES)
def test_slices_and_pads(backend_name, dtype, op, attrs, ref, run_op, random_array,
                         assert_close) -> None:
    x = random_array(X_SHAPE, dtype, seed=1)
    (got,) = run_op(backend_name, op, [x], attrs)
    assert_close(got, ref(x).astype(np.float64), dtype)


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


def test_zero_size_dims(backend_name, run_op) -> None:
    x = np.zeros((2, 0, 3), np.float32)
    for op, attrs, shape in (("pad", {"pad_width": [[0, 0], [1, 1], [0, 0]]}, (2, 2, 3)),
                             ("strided_slice", {"begin": [1], "end": [2]}, (1, 0, 3))):
        (got,) = run_op(backend_name, op, [x], attrs)
        assert got.shape == shape, op
        assert not got.any(), op


@pytest.mark.parametrize("op,attrs,spec,message", [
    ("split", {"indices_or_sections": 4}, (2, 6), "split: attribute 'indices_or_sections' = 4: "
     "expected a positive number of sections dividing the axis size 2"),
    ("strided_slice", {"begin": [0], "end": [1], "strides": [0]}, (4,),
     "strided_slice: attribute 'strides' = \\[0\\]: expected non-zero steps"),
    ("strided_slice", {"begin": [0, 0, 0]}, (4,), "expected at most 1 entries"),
    ("pad", {"pad_width": [[1, 1]]}, (2, 3), r"pad: attribute 'pad_width' = \[\[1, 1\]\]: "
     r"expected 2 pairs \[before, after\]"),
    ("pad", {"pad_width": [[0, 0]], "pad_mode": "edge"}, (2,),
     "pad: attribute 'pad_mode' = 'edge': expected one of 'constant'"),
    ("concatenate", {"axis": 2}, (2, 3), r"concatenate: attribute 'axis' = 2"),
])
def test_errors_name_op_and_value(op, attrs, spec, message, make_function) -> None:
    with pytest.raises(LibraryError, match=message):
        make_function(op).infer([TensorSpec(spec, "float32")], attrs)


def test_multi_input_errors(make_function) -> None:
    with pytest.raises(LibraryError, match=r"concatenate: input 1 has shape \(3, 3\) but input 0 "
                                           r"has \(2, 3\); they may differ only on axis 1"):
        make_function("concatenate").infer([TensorSpec((2, 3), "float32"),
                                            TensorSpec((3, 3), "float32")], {"axis": 1})
