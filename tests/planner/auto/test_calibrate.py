"""Calibration: a device's kernel costs scaled by its whole-graph run, cached."""
from __future__ import annotations

import math

import numpy as np
from auto_support import cl0

from graph_runtime.errors import GraphError
from graph_runtime.planner.auto.calibrate import FACTOR_RANGE, Calibration, calibrate
from graph_runtime.planner.auto.cost_cache import CostCache
from graph_runtime.planner.auto.cost_problem import CopyTerm, CostProblem


def test_calibration_scales_the_device_by_its_whole_run() -> None:
    """factor = (measured run - its copies) / sum of its kernels, applied to that device only,
    cached by key; a run that fails leaves the costs as measured; wild factors are clamped."""
    def problem() -> CostProblem:
        cost = np.array([[1.0, 4.0], [2.0, 6.0], [math.inf, 0.0]])  # row 2: a pinned output
        return CostProblem(cost, [CopyTerm(1, (2,), np.array([[0.0, 0.5], [0.5, 0.0]]))])

    cache = CostCache()
    runs: list[int] = []

    def run() -> float:
        runs.append(1)
        return 5.5  # kernels 10.0 on device 1, its copies 0.0: factor 0.55

    p = problem()
    found = calibrate(p, 1, [1, 1, 1], 2, "k", cache, run, cl0)
    assert found == Calibration(cl0, 0.55, False) and runs == [1]
    np.testing.assert_allclose(p.node_cost[:2], [[1.0, 2.2], [2.0, 3.3]])
    again = problem()
    assert calibrate(again, 1, [1, 1, 1], 2, "k", cache, run, cl0) == Calibration(cl0, 0.55,
                                                                               True)
    assert runs == [1]

    def fails() -> float:
        raise GraphError("index 7 out of range")
    untouched = problem()
    assert calibrate(untouched, 1, [1, 1, 1], 2, "other", cache, fails, cl0) == Calibration(
        cl0, 1.0, False, "index 7 out of range")
    assert "other" not in cache.sequences  # tried again next time
    np.testing.assert_array_equal(untouched.node_cost, problem().node_cost)
    wild = problem()
    found = calibrate(wild, 1, [1, 1, 1], 2, "wild", cache, lambda: 1000.0, cl0)
    assert found is not None and found.factor == FACTOR_RANGE[1]
