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
from .. import replay
from .omp_team import (available as team_available, block, recording_here, run_here,
                       run_on_team)


def activation_expr(activation: str, attrs: Mapping[str, Any], dtype: str) -> str | None:
    """The activation's expression over {0} as a compiled chain computes it, or None."""
    if dtype not in ("float32", "float64"):
        return None
    return chain_jit.step_expr(activation, attrs, [TensorSpec((), dtype)], dtype)


def glu_source(expr: str, dtype: str) -> str:
    """run(x, out, gate, up, lo, hi): rows [lo, hi) of out = act(x[:, gate:]) * x[:, up:];
    team(block): the same on oneDNN's OpenMP team, each thread over its share of the rows (the
    block: rows, units, x's and out's addresses, gate, up), compiled at its first use."""
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


from numba import carray
from graph_runtime.lib.kernels.cpu.omp_team import array_at, my_rows, team_kernel


def _team(data):
    b = carray(data, (6,), np.int64)
    rows, units = b[0], b[1]
    lo, hi = my_rows(rows)
    if lo < hi:
        run(array_at(b[2], (rows, 2 * units), {ctype}), array_at(b[3], (rows, units), {ctype}),
            b[4], b[5], lo, hi)


team = team_kernel(_team)
"""


class GluKernel(PreparedKernel):
    """run(x, out) for x (..., 2 * units) and out (..., units), both C-contiguous, any shape
    (units read from out at each call)."""

    def __init__(self, activation: str, expr: str, dtype: str, gate_first: bool) -> None:
        jit_setup.start()
        self.gate_first = gate_first
        self.weight = chain_jit.work_weight((activation, "multiply"))
        module = chain_jit.load_module(("glu", expr, dtype), lambda: glu_source(expr, dtype))
        self._run = module.run
        # in OpenMP mode its rows go to oneDNN's team, as a compiled chain's (chain_jit.py)
        self._team = module.team if team_available() else None

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
        if workers > 1 and self._team is not None:
            run_on_team(self._team(), block(rows, units, x2, o2, gate, up))
            self._vouch(x, out)
            return
        if self._team is not None and recording_here():
            # recorded for a replay (kernels/replay.py): the team's loop on this thread alone
            run_here(self._team(), block(rows, units, x2, o2, gate, up))
            self._vouch(x, out)
            return
        parallel_rows(rows, workers, lambda lo, hi: run(x2, o2, gate, up, lo, hi))

    def _vouch(self, x: Any, out: Any) -> None:
        """A team function's call was the whole work, where x and out were read in place."""
        if replay.active is not None and replay.contiguous((x, out)):
            replay.whole_call(self)
