"""oneDNN's OpenMP team threads each on a CPU of their own (lib/kernels/cpu/team_pinning.py).

Each case runs on a thread of its own: libgomp gives every calling thread a team of its own,
so a case sees a team no earlier test pinned, and the test's thread affinity is untouched.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable

import numpy as np
import pytest
from support import require_onednn

from graph_runtime.lib.kernels.cpu import team_pinning
from graph_runtime.lib.kernels.onednn import binding
from graph_runtime.settings import (NUM_THREADS, ONEDNN, ONEDNN_PIN, ONEDNN_THREADS,
                                     OPENMP_BINDING)

CPUS = sorted(os.sched_getaffinity(0))


@pytest.fixture
def openmp(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN in OpenMP mode with two threads, no OpenMP binding of the user's; or skip."""
    require_onednn()
    if len(CPUS) < 2:
        pytest.skip(f"the process may use {len(CPUS)} CPU: a team of two is not pinned")
    if not team_pinning.team_tids():
        pytest.skip("libgomp's team or glibc's gettid is not available here")
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    monkeypatch.setenv(ONEDNN.name, "on")
    monkeypatch.setenv(NUM_THREADS.name, "2")
    for name in OPENMP_BINDING:
        monkeypatch.delenv(name, raising=False)


def _on_a_thread(work: Callable[[], Any]) -> Any:
    """work()'s result, run on a new thread (its own OpenMP team); its exception re-raised."""
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = work()
        except BaseException as e:  # re-raised on the test's thread
            out["error"] = e
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _team_affinities() -> tuple[set[int], list[set[int]]]:
    """The calling thread's affinity, and its team threads' (thread numbers 1 and up)."""
    return os.sched_getaffinity(0), [os.sched_getaffinity(tid)
                                     for tid in team_pinning.team_tids()[1:]]


def test_a_dense_in_openmp_mode_pins_its_team_not_the_caller(openmp: None, run_op: Any,
                                                             random_array: Any) -> None:
    x = random_array((64, 300), "float32", seed=1)
    w = random_array((256, 300), "float32", seed=2)

    def work() -> tuple[np.ndarray, set[int], list[set[int]]]:
        (got,) = run_op("cpu", [{"op": "dense"}], [x, w])
        return (got, *_team_affinities())
    got, caller, team = _on_a_thread(work)
    np.testing.assert_allclose(got, x.astype(np.float64) @ w.astype(np.float64).T,
                               rtol=1e-5, atol=1e-4)
    assert caller == set(CPUS)  # threads the caller starts later inherit all the CPUs
    assert len(team) == 1 and len(team[0]) == 1 and team[0] <= set(CPUS)


def test_each_team_thread_gets_a_cpu_of_its_own_never_the_callers(openmp: None) -> None:
    def work() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        binding.use_threads(2)
        # (use_threads pinned the team already; pinning again asks where each runs now)
        return team_pinning.pin_team(2), team_pinning.team_threads()
    pinned, team = _on_a_thread(work)
    assert [tid for tid, _ in pinned] == [tid for tid, _ in team[1:2]]
    cpus = [cpu for _, cpu in pinned]
    assert len(set(cpus)) == len(cpus) and set(cpus) <= set(CPUS)
    assert team[1][1] == pinned[0][1]  # it runs where it was pinned


def test_pinning_off_leaves_the_team_where_libgomp_puts_it(openmp: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ONEDNN_PIN.name, "off")

    def work() -> tuple[list[tuple[int, int]], list[set[int]]]:
        binding.use_threads(2)
        return team_pinning.pin_team(2), _team_affinities()[1]
    pinned, team = _on_a_thread(work)
    assert pinned == []
    assert team == [set(CPUS)]


@pytest.mark.parametrize("name,value", [("OMP_PROC_BIND", "false"), ("OMP_PLACES", "cores"),
                                        ("GOMP_CPU_AFFINITY", "0-1")])
def test_a_users_openmp_binding_is_kept(openmp: None, monkeypatch: pytest.MonkeyPatch,
                                        name: str, value: str) -> None:
    """(libgomp read the variable when it loaded, before this test: only our choice is asked)"""
    monkeypatch.setenv(name, value)
    assert not team_pinning.wanted()
    assert _on_a_thread(lambda: team_pinning.pin_team(2)) == []


def test_a_team_larger_than_the_cpus_is_not_pinned(openmp: None) -> None:
    assert team_pinning.pin_team(len(CPUS) + 1) == []
    assert team_pinning.pin_team(1) == []


def test_the_round_trip_between_two_team_cpus_is_measured(openmp: None) -> None:
    """(cpu/team_round_trip.py) the counter went both ways every round: a time, not a hang"""
    from graph_runtime.lib.kernels.cpu import team_round_trip

    def work() -> tuple[list[float | None], set[int], set[int]]:
        binding.use_threads(2)
        before = os.sched_getaffinity(0)
        probes = [team_round_trip.round_trip_ns(rounds) for rounds in (2_000, 1, 2_000, 2_000)]
        return probes, before, os.sched_getaffinity(0)
    probes, before, after = _on_a_thread(work)
    # (a batch whose thread lost its CPU to another process for the whole spin limit says None)
    assert any(p is not None for p in probes) and all(p is None or p > 0 for p in probes)
    assert before == after  # the caller kept off the team thread's CPU only while it probed
    assert team_round_trip.round_trip_text().startswith("CPU round trip")


def test_no_round_trip_without_a_team(monkeypatch: pytest.MonkeyPatch) -> None:
    from graph_runtime.lib.kernels.cpu import team_round_trip
    monkeypatch.setenv(ONEDNN.name, "off")
    assert team_round_trip.round_trip_ns() is None
    assert "not measured" in team_round_trip.round_trip_text()
