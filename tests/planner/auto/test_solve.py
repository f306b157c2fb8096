"""The placement solvers (min cut, MILP, alpha-expansion) against brute force."""
from __future__ import annotations

import math

import numpy as np
import pytest
from auto_support import brute_force, random_problem

from graph_runtime.errors import PlanError
from graph_runtime.planner.auto.cost_problem import CopyTerm, CostProblem, SwitchTerm
from graph_runtime.planner.auto.solve import solve_placement


@pytest.mark.parametrize("seed", range(60))
def test_min_cut_equals_brute_force_on_random_two_device_problems(seed: int) -> None:
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, int(rng.integers(2, 9)), 2)
    cut = solve_placement(problem, "min-cut")
    assert cut.objective == brute_force(problem).objective
    assert math.isfinite(cut.objective)


@pytest.mark.parametrize("seed", range(40))
def test_milp_equals_brute_force_with_three_devices(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    problem = random_problem(rng, int(rng.integers(2, 7)), 3)
    assert solve_placement(problem, "milp").objective == brute_force(problem).objective


@pytest.mark.parametrize("seed", range(20))
def test_alpha_expansion_is_legal_and_no_worse_than_any_one_device_plan(seed: int) -> None:
    rng = np.random.default_rng(2000 + seed)
    problem = random_problem(rng, 7, 3)
    found = solve_placement(problem, "alpha-expansion")
    assert all(math.isfinite(problem.node_cost[v, d]) for v, d in enumerate(found.choice))
    singles = [problem.objective([d] * 7) for d in range(3)]
    assert found.objective <= min(singles)
    assert found.objective >= brute_force(problem).objective


def with_switches(rng: np.random.Generator, problem: CostProblem) -> CostProblem:
    """problem plus a random switch term between each pair of consecutive variables."""
    n, k = problem.node_cost.shape
    switches = []
    for v in range(n - 1):
        w = rng.integers(0, 10, (k, k)).astype(float)
        np.fill_diagonal(w, 0.0)
        switches.append(SwitchTerm(v, v + 1, w))
    return CostProblem(problem.node_cost, problem.terms, problem.labels, switches)


@pytest.mark.parametrize("seed", range(20))
def test_every_solver_prices_switch_terms_exactly(seed: int) -> None:
    rng = np.random.default_rng(3000 + seed)
    two = with_switches(rng, random_problem(rng, int(rng.integers(2, 8)), 2))
    assert solve_placement(two, "min-cut").objective == brute_force(two).objective
    three = with_switches(rng, random_problem(rng, int(rng.integers(2, 6)), 3))
    assert solve_placement(three, "milp").objective == brute_force(three).objective
    assert solve_placement(three, "alpha-expansion").objective >= brute_force(three).objective


def test_a_dear_switch_keeps_consecutive_kernels_together() -> None:
    # Node 1 is cheaper on device 1 by 2, but a switch after node 0 costs 3 there.
    cost = np.array([[0.0, math.inf], [2.0, 0.0]])
    switch = SwitchTerm(0, 1, np.array([[0.0, 3.0], [3.0, 0.0]]))
    for method in ("min-cut", "milp", "alpha-expansion"):
        found = solve_placement(CostProblem(cost, [], switches=[switch]), method)
        assert found.choice == (0, 0)
        assert found.objective == 2.0


def test_a_milp_stopped_at_its_time_limit_still_answers_and_says_so() -> None:
    problem = random_problem(np.random.default_rng(7), 400, 3)
    found = solve_placement(problem, "milp", time_limit=1e-3)
    assert found.method.startswith("milp (time limit")
    assert math.isfinite(found.objective)
    assert found.objective <= solve_placement(problem, "alpha-expansion").objective


def test_one_copy_serves_every_reader_on_a_device() -> None:
    # p is forced to device 0, its three readers to device 1: one copy, not three.
    inf = math.inf
    cost = np.array([[0.0, inf], [inf, 0.0], [inf, 0.0], [inf, 0.0]])
    w = np.array([[0.0, 5.0], [7.0, 0.0]])
    problem = CostProblem(cost, [CopyTerm(0, (1, 2, 3), w)])
    for method in ("min-cut", "milp", "alpha-expansion"):
        found = solve_placement(problem, method)
        assert found.choice == (0, 1, 1, 1)
        assert found.objective == 5.0
    assert problem.copies([0, 1, 1, 1]) == [(0, 0, 1)]


def test_shared_copy_can_make_moving_a_reader_worthwhile() -> None:
    # Readers 1 and 2 are cheaper on device 1 by 3 each, a copy costs 5: with a per-edge model
    # each move would cost 5 and neither would move; one shared copy makes moving both pay.
    cost = np.array([[0.0, math.inf], [3.0, 0.0], [3.0, 0.0]])
    problem = CostProblem(cost, [CopyTerm(0, (1, 2), np.array([[0.0, 5.0], [5.0, 0.0]]))])
    found = solve_placement(problem, "min-cut")
    assert found.choice == (0, 1, 1)
    assert found.objective == 5.0


@pytest.mark.parametrize("method", ["min-cut", "milp", "alpha-expansion"])
def test_an_infinite_copy_cost_ties_two_nodes_to_one_device(method: str) -> None:
    # Node 1 (a __nop) must share node 0's device though it would be cheaper elsewhere.
    tie = np.array([[0.0, math.inf], [math.inf, 0.0]])
    cost = np.array([[0.0, 20.0], [9.0, 0.0], [9.0, 0.0]])
    problem = CostProblem(cost, [CopyTerm(0, (1,), tie),
                                 CopyTerm(1, (2,), np.array([[0.0, 1.0], [1.0, 0.0]]))])
    found = solve_placement(problem, method)
    assert found.choice[0] == found.choice[1]
    assert found.choice == (0, 0, 1)
    assert found.objective == brute_force(problem).objective == 10.0


def test_min_cut_breaks_ties_toward_the_first_device() -> None:
    problem = CostProblem(np.array([[1.0, 1.0], [0.0, 0.0]]),
                          [CopyTerm(0, (1,), np.array([[0.0, 2.0], [2.0, 0.0]]))])
    assert solve_placement(problem, "min-cut").choice == (0, 0)


def test_a_node_no_device_may_run_is_a_plan_error() -> None:
    problem = CostProblem(np.array([[math.inf, math.inf]]), [], ["node 0 'a'"])
    with pytest.raises(PlanError, match="node 0 'a': no given device may run it"):
        solve_placement(problem)

