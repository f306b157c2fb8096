"""shape_of (ONNX Shape as data) on every backend: the input's dims as int64, start/end sliced."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
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
