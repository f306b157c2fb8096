"""The prepared-kernel base: its defaults, and capabilities() answering for plain functions."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from graph_runtime.lib.library import InputVersion
from graph_runtime.lib.prepared import PreparedKernel, capabilities


class Negate(PreparedKernel):
    """A prepared kernel with no capability of its own."""

    def __call__(self, x: Any, out: Any) -> None:
        np.negative(x, out=out)


def _negate(x: Any, out: Any) -> None:
    np.negative(x, out=out)


@pytest.mark.parametrize("fn", [Negate(), _negate], ids=["subclass", "plain function"])
def test_defaults_say_none(fn: Any) -> None:
    kernel = capabilities(fn)
    assert kernel.storage_requests() == {}
    assert kernel.workspace_bytes() == 0
    assert tuple(kernel.cached_inputs()) == ()
    assert kernel.bind_versions({0: InputVersion()}) is None
    assert kernel.uses_workers() is False


def test_capabilities_of_a_kernel_is_the_kernel() -> None:
    kernel = Negate()
    assert capabilities(kernel) is kernel
    out = np.empty(3, "float32")
    kernel(np.arange(3, dtype="float32"), out)
    np.testing.assert_array_equal(out, [0, -1, -2])


def test_a_kernel_must_define_call() -> None:
    class Nothing(PreparedKernel):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Nothing()  # type: ignore[abstract]
