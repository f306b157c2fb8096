"""tile and broadcast_to on every backend against np.tile and np.broadcast_to."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec


@pytest.mark.parametrize("shape,reps", [((2, 3), (2, 1)), ((2, 3), (1, 3)),
                                        ((3, 1, 2), (2, 2, 3)), ((4,), (2, 3)),
                                        ((2, 3), (0, 2)), ((), ())])
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_tile(backend_name: str, shape, reps, dtype, run_op, random_array) -> None:
    x = random_array(shape, "float32", seed=1)
    x = (x > 0) if dtype == "bool" else x.astype(dtype)
    (got,) = run_op(backend_name, "tile", [x], {"reps": list(reps)})
    np.testing.assert_array_equal(got, np.tile(x, reps))


@pytest.mark.parametrize("shape,target", [((3, 1), (2, 3, 4)), ((1,), (5,)), ((), (2, 2)),
                                          ((2, 1, 3), (2, 0, 3)), ((4,), (3, 4))])
@pytest.mark.parametrize("dtype", ["float16", "int32"])
def test_broadcast_to(backend_name: str, shape, target, dtype, run_op, random_array) -> None:
    x = random_array(shape, dtype, -9, 9, seed=2)
    (got,) = run_op(backend_name, "broadcast_to", [x], {"shape": list(target)})
    np.testing.assert_array_equal(got, np.broadcast_to(x, target))


def test_errors(make_function) -> None:
    spec = TensorSpec((3, 1), "float32")
    with pytest.raises(LibraryError, match=r"tile: attribute 'reps' = \[2, -1\]: expected "
                                           r"non-negative integers"):
        make_function("tile").infer([spec], {"reps": [2, -1]})
    with pytest.raises(LibraryError, match=r"tile: attribute 'reps' = \[100000, 100000\]: "
                                           r"expected an output of at most 2147483648"):
        make_function("tile").infer([spec], {"reps": [100000, 100000]})
    with pytest.raises(LibraryError, match=r"tile: missing required attribute 'reps'"):
        make_function("tile").infer([spec], {})
    with pytest.raises(LibraryError, match=r"broadcast_to: input 0 \(3, 1\) float32 does not "
                                           r"broadcast to shape \(2, 4\)"):
        make_function("broadcast_to").infer([spec], {"shape": [2, 4]})
    with pytest.raises(LibraryError, match=r"broadcast_to: input 0 \(3, 1\) float32 does not "
                                           r"broadcast to shape \(1,\)"):
        make_function("broadcast_to").infer([spec], {"shape": [1]})
    with pytest.raises(LibraryError, match=r"broadcast_to: attribute 'shape' = \[3, -1\]"):
        make_function("broadcast_to").infer([spec], {"shape": [3, -1]})
