"""Reshape-family ops and transpose on every backend against NumPy, incl. Relay's special values."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec

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
    ("expand_dims", {"axis": 1, "num_newaxis": 2}, lambda x: x[:, None, None]),
    ("expand_dims", {"axis": -1}, lambda x: x[..., None]),
    ("squeeze", {}, lambda x: x),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op,attrs,ref", UNARY_CASES)
def test_unary_transforms(backend_name, dtype, op, attrs, ref, run_op, random_array,
                          assert_close) -> None:
    x = random_array(X_SHAPE, dtype, seed=1)
    (got,) = run_op(backend_name, op, [x], attrs)
    assert_close(got, ref(x).astype(np.float64), dtype)


def test_squeeze_and_int_copies(backend_name, run_op, random_array) -> None:
    x = random_array((1, 3, 1, 2), "int64", -9, 9, seed=2)
    for attrs, want in (({}, x.reshape(3, 2)), ({"axis": [0]}, x[0]), ({"axis": -2}, x[:, :, 0])):
        (got,) = run_op(backend_name, "squeeze", [x], attrs)
        np.testing.assert_array_equal(got, want)
    (got,) = run_op(backend_name, "transpose", [x], {"axes": [3, 1, 0, 2]})
    np.testing.assert_array_equal(got, x.transpose(3, 1, 0, 2))


def test_zero_size_dims(backend_name, run_op) -> None:
    x = np.zeros((2, 0, 3), np.float32)
    for op, attrs, shape in (("transpose", {}, (3, 0, 2)),
                             ("reshape", {"newshape": [0, -1, 3]}, (2, 0, 3)),
                             ("reshape", {"newshape": [0, 5], "allowzero": 1}, (0, 5))):
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
    ("expand_dims", {"axis": 4}, (2, 3), r"expand_dims: attribute 'axis' = 4: expected an axis "
     r"in \[-3, 3\)"),
    ("batch_flatten", {}, (), "batch_flatten: input 0 \\(\\) float32 is a scalar"),
])
def test_errors_name_op_and_value(op, attrs, spec, message, make_function) -> None:
    with pytest.raises(LibraryError, match=message):
        make_function(op).infer([TensorSpec(spec, "float32")], attrs)
