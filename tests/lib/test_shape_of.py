"""shape_of (ONNX Shape as data) on every backend: the input's dims as int64, start/end sliced."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import GraphRuntimeError, LibraryError
from graph_runtime.lib.library import TensorSpec


@pytest.mark.parametrize("shape,attrs", [((2, 3, 5), {}), ((2, 3, 5), {"start": 1}),
                                         ((2, 3, 5), {"start": -2, "end": -1}), ((), {}),
                                         ((4, 0), {"end": 1})])
def test_shape_of(backend_name: str, shape, attrs, run_op, random_array) -> None:
    x = random_array(shape, "float32", seed=1)
    (got,) = run_op(backend_name, "shape_of", [x], attrs)
    want = np.array(shape, np.int64)[attrs.get("start", 0):attrs.get("end")]
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_errors(make_function) -> None:
    with pytest.raises(LibraryError, match=r"shape_of: attribute 'start' = 'a': expected an "
                                           r"integer"):
        make_function("shape_of").infer([TensorSpec((2,), "float32")], {"start": "a"})


AT_ATTRS = {"values": ["past", "past+seq", 7, "2*(past+seq)//3"], "shape": [2, 2],
            "dtype": "int64", "at": [["past", 1, 2], ["seq", 0, 1]]}


def test_dim_values_read_from_the_inputs_shapes(backend_name: str, run_op) -> None:
    """dim_values with `at`: its values are expressions over dims its inputs' shapes hold,
    read at each run (the importer's form for a decoder's past and total lengths)."""
    x = np.zeros((1, 3), np.int64)
    kv = np.zeros((1, 2, 5, 4), np.float32)
    (got,) = run_op(backend_name, "dim_values", [x, kv], AT_ATTRS)
    np.testing.assert_array_equal(got, np.array([[5, 8], [7, 5]], np.int64))


def test_one_dim_values_kernel_serves_every_length(make_function) -> None:
    """The prepared kernel takes any shape: called on other arrays it gives their dims' values
    (one kernel across a decoder's steps, kept by the executor's size-class key)."""
    from graph_runtime.device import cpu
    from graph_runtime.lib.prepared import capabilities
    chain = make_function("dim_values")
    specs = [TensorSpec((1, 3), "int64"), TensorSpec((1, 2, 5, 4), "float32")]
    fn = chain.prepare(cpu(), specs, chain.infer(specs, AT_ATTRS), AT_ATTRS)
    assert capabilities(fn).any_shape()
    out = np.zeros((2, 2), np.int64)
    for seq, past in [(1, 9), (4, 0), (1, 40)]:
        fn(np.zeros((1, seq), np.int64), np.zeros((1, 2, past, 4), np.float32), out)
        want = [[past, past + seq], [7, 2 * (past + seq) // 3]]
        np.testing.assert_array_equal(out, np.array(want, np.int64))
    with pytest.raises(GraphRuntimeError, match=r"dim_values: an input of rank 1 where its "
                                                r"dims are read at rank 4"):
        fn(np.zeros((1, 3), np.int64), np.zeros(40, np.float32), out)


@pytest.mark.parametrize("change, message", [
    ({"at": [["past", 2, 2], ["seq", 0, 1]]},
     r"at: 'past' is read from input 2 axis 2, but it has 2 inputs of shapes \[\[1, 3\], "
     r"\[1, 2, 5, 4\]\]"),
    ({"at": [["past", 1, 2]]}, r"value 'past\+seq': reads seq, which `at` does not place"),
    ({"at": [["past", 1]]}, r"at \[\['past', 1\]\]; expected \[name, input, axis\] items"),
    ({"at": None, "values": ["past", 1, 2, 3]},
     r"values .*expected a list of ints .*with `at`, expressions such as")])
def test_dim_values_at_errors_name_the_attr(make_function, change, message) -> None:
    attrs = {k: v for k, v in {**AT_ATTRS, **change}.items() if v is not None}
    with pytest.raises(LibraryError, match=message):
        make_function("dim_values").infer(
            [TensorSpec((1, 3), "int64"), TensorSpec((1, 2, 5, 4), "float32")], attrs)
