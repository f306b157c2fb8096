"""The cost problem's objective: node costs, shared copies and device switches."""
from __future__ import annotations

import numpy as np

from graph_runtime.planner.auto.cost_problem import CopyTerm, CostProblem, SwitchTerm


def test_a_switch_costs_only_when_the_two_kernels_are_apart_and_is_no_copy() -> None:
    cost = np.array([[1.0, 2.0], [4.0, 8.0], [16.0, 32.0]])
    copy = CopyTerm(0, (1, 2), np.array([[0.0, 100.0], [200.0, 0.0]]))
    switch = SwitchTerm(1, 2, np.array([[0.0, 1000.0], [2000.0, 0.0]]))
    problem = CostProblem(cost, [copy], switches=[switch])
    assert problem.objective([0, 0, 0]) == 21.0
    assert problem.objective([0, 1, 1]) == 1.0 + 8.0 + 32.0 + 100.0
    assert problem.objective([0, 0, 1]) == 1.0 + 4.0 + 32.0 + 100.0 + 1000.0
    assert problem.objective([1, 1, 0]) == 2.0 + 8.0 + 16.0 + 200.0 + 2000.0
    assert problem.copies([0, 0, 1]) == [(0, 0, 1)]  # the switch is not listed as a copy
