"""Module: registration, lookup, and the checks wrapped around user kernels at prepare time."""
from __future__ import annotations

import numpy as np
import pytest
from support import make_graph, null, tvm_op

import graph_runtime as gr
from graph_runtime.errors import LibraryError


def test_a_kernel_returning_its_result_is_an_error_naming_it() -> None:
    lib = gr.Module("user")

    @lib.register("plus_one", device="cpu")
    def plus_one(x: np.ndarray, out: np.ndarray) -> np.ndarray:
        return x + 1  # wrong: out is never written

    m = gr.create(make_graph([null("x"), tvm_op("p", "plus_one", [0])], [1]), lib, gr.cpu())
    with pytest.raises(LibraryError, match=r"kernel 'plus_one' \(node 1 'p'\) \(.*plus_one\) "
                                           r"returned a ndarray instead of None"):
        m.run(x=np.zeros(4, "float32"))


def test_returning_the_output_array_itself_is_fine() -> None:
    lib = gr.Module("user")
    lib.register("relu_out", lambda x, out: np.maximum(x, 0, out=out), device="cpu")
    m = gr.create(make_graph([null("x"), tvm_op("r", "relu_out", [0])], [1]), lib, gr.cpu())
    x = np.array([-1, 2, -3, 4], "float32")
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.maximum(x, 0))


def test_standard_ops_are_not_wrapped() -> None:
    m = gr.create(make_graph([null("x"), tvm_op("r", "relu", [0])], [1]), None, gr.cpu())
    assert not hasattr(m.executor.steps[0].fn, "__wrapped__")
