"""The glu op on the CPU: act(gate half) * other half of each row in one compiled pass.

The loop is generated as a compiled chain's is (chain_jit.py: the activation's expression as
the chain computes it, erf32/tanh32 for float32, the module and its machine code kept in the
chain cache). Rows are cut into ranges for the runtime's workers when the work pays for the
hand-off (chain_jit.PARALLEL_WORK, the activation and the product weighed as a chain weighs
them).
"""
from __future__ import annotations

from typing import Any, Mapping

from ...library import TensorSpec
from ...prepared import PreparedKernel
from ..threads import num_threads, parallel_rows
from . import chain_jit, jit_setup


def activation_expr(activation: str, attrs: Mapping[str, Any], dtype: str) -> str | None:
    """The activation's expression over {0} as a compiled chain computes it, or None."""
    if dtype not in ("float32", "float64"):
        return None
    return chain_jit.step_expr(activation, attrs, [TensorSpec((), dtype)], dtype)


def glu_source(expr: str, dtype: str) -> str:
    """run(x, out, gate, up, lo, hi): rows [lo, hi) of out = act(x[:, gate:]) * x[:, up:]."""
    ctype = f"np.{dtype}"
    value = expr.format("g", T=ctype)
    return chain_jit.source_header() + f"""
@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)
def run(x, out, gate, up, lo, hi):
    units = out.shape[1]
    for r in range(lo, hi):
        grow = x[r, gate:gate + units]
        urow = x[r, up:up + units]
        orow = out[r]
        for j in range(units):
            g = grow[j]
            orow[j] = {ctype}({ctype}({value}) * urow[j])
"""


class GluKernel(PreparedKernel):
    """run(x, out) for x (..., 2 * units) and out (..., units), both C-contiguous, any shape
    (units read from out at each call)."""

    def __init__(self, activation: str, expr: str, dtype: str, gate_first: bool) -> None:
        jit_setup.start()
        self.gate_first = gate_first
        self.weight = chain_jit.work_weight((activation, "multiply"))
        self._run = chain_jit.load_module(("glu", expr, dtype),
                                          lambda: glu_source(expr, dtype)).run

    def any_shape(self) -> bool:
        return True

    def __call__(self, x: Any, out: Any) -> None:
        units = out.shape[-1]
        rows = out.size // units if units else 0
        x2, o2 = x.reshape(rows, 2 * units), out.reshape(rows, units)
        run = self._run
        gate, up = (0, units) if self.gate_first else (units, 0)
        workers = num_threads() if rows > 1 and rows * units * self.weight >= \
            chain_jit.PARALLEL_WORK else 1
        parallel_rows(rows, workers, lambda lo, hi: run(x2, o2, gate, up, lo, hi))
