"""Measuring costs: the cache, what is measured once, small params' values, switch costs."""
from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest
from auto_support import cl0, cpu0, small_graph
from support import make_graph, null, tvm_op

from graph_runtime.device import Device
from graph_runtime.lib import Module, standard_module
from graph_runtime.lib.library import TensorSpec
from graph_runtime.planner import auto_place
from graph_runtime.planner.auto import measure_costs
from graph_runtime.planner.auto.measure_costs import _Touches


class CountingModule(Module):
    """The standard ops, counting prepare calls: a kernel is measured only after preparing."""

    def __init__(self) -> None:
        super().__init__("counting")
        self.import_module(standard_module())
        self.prepared = 0

    def prepare(self, func_name: str, device: Device, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Any = None, node: str | None = None) -> Any:
        self.prepared += 1
        return super().prepare(func_name, device, inputs, outputs, attrs, node)


@pytest.mark.opencl
def test_a_warm_cache_measures_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "costs.json"
    lib = CountingModule()
    first = auto_place(small_graph(), lib, [cpu0, cl0], budget_s=1.0, cache=str(cache))
    assert lib.prepared > 0 and first.kernels_measured > 0 and first.copies_measured == 2
    doc = json.loads(cache.read_text())
    assert doc["format"] == "graph_runtime.profile_cache" and len(doc["copies"]) == 2
    assert len(doc["sequences"]) == 2  # a whole-graph run per device calibrates it
    assert [(c.device, c.cached) for c in first.calibrations] == [(cpu0, False), (cl0, False)]
    lib.prepared = 0
    second = auto_place(small_graph(), lib, [cpu0, cl0], budget_s=1.0, cache=str(cache))
    assert lib.prepared == 0  # neither kernels timed nor the graph run again
    assert (second.kernels_measured, second.copies_measured) == (0, 0)
    assert [(c.device, c.cached, c.factor) for c in second.calibrations] == [
        (c.device, True, c.factor) for c in first.calibrations]
    assert second.plan.node_devices == first.plan.node_devices


def power_graph() -> Any:
    """y = x ** e, e a scalar param stored as the () entry it is in the graph."""
    return make_graph([null("x"), null("e"), tvm_op("y", "power", [0, 1])], [2],
                      shapes=[[32, 32], [], [32, 32]])


def test_small_params_are_measured_with_their_values(tmp_path: Path) -> None:
    # np.power's speed depends on the exponent (negative bases at 3.0 take a slow path), so
    # each exponent is its own case; a (1,) array for the () entry is accepted as load_params does.
    cache = tmp_path / "costs.json"
    lib = CountingModule()
    first = auto_place(power_graph(), lib, [cpu0], budget_s=1.0, cache=str(cache),
                       params={"e": np.array([3.0], np.float32)})
    assert first.kernels_measured == 1
    again = auto_place(power_graph(), lib, [cpu0], budget_s=1.0, cache=str(cache),
                       params={"e": np.array(3.0, np.float32)})
    assert again.kernels_measured == 0
    other = auto_place(power_graph(), lib, [cpu0], budget_s=1.0, cache=str(cache),
                       params={"e": np.array(0.5, np.float32)})
    assert other.kernels_measured == 1
    unknown = auto_place(power_graph(), lib, [cpu0], budget_s=1.0, cache=str(cache))
    assert unknown.kernels_measured == 1
    keys = list(json.loads(cache.read_text())["kernels"])
    assert len(keys) == 3 and sum("|values=1:" in k for k in keys) == 2


def test_large_params_are_not_part_of_the_key(tmp_path: Path) -> None:
    cache = tmp_path / "costs.json"
    g = make_graph([null("x"), null("w"), tvm_op("y", "multiply", [0, 1])], [2],
                   shapes=(32, 32))
    auto_place(g, standard_module(), [cpu0], budget_s=1.0, cache=str(cache),
               params={"w": np.ones((32, 32), np.float32)})
    keys = list(json.loads(cache.read_text())["kernels"])
    assert len(keys) == 1 and "values=" not in keys[0]


@pytest.mark.opencl
def test_distinct_functions_and_shapes_are_measured_once(tmp_path: Path) -> None:
    # Four relus of one shape: one case per device; a fifth of another shape adds one more.
    nodes = [null("x"), tvm_op("r0", "relu", [0]), tvm_op("r1", "relu", [1]),
             tvm_op("r2", "relu", [2]), tvm_op("r3", "relu", [3])]
    g = make_graph(nodes, [4], shapes=(32, 32))
    result = auto_place(g, standard_module(), [cpu0, cl0], budget_s=1.0)
    assert result.kernels_measured == 2
    assert {n.name for n in result.nodes} == {"r0", "r1", "r2", "r3"}


def test_switch_seconds_is_the_difference_of_medians_never_negative(monkeypatch) -> None:
    # A clock the timed call advances by its own amount: the arithmetic is checked exactly, not
    # how long sleeps took on a loaded machine (they swung past 3 ms here under load).
    clock = types.SimpleNamespace(now=0.0)
    fake_time = types.SimpleNamespace(perf_counter=lambda: clock.now)
    monkeypatch.setattr(measure_costs, "time", fake_time)

    class Recorded(_Touches):
        last: Device | None = None

        def touch(self, dev: Device) -> None:
            self.last = dev

    touches = Recorded()
    samples = iter([0.004, 0.001, 0.009, 0.005, 0.002, 0.003])  # after cpu, opencl, cpu, ...

    def call() -> None:
        clock.now += next(samples)

    # medians: after opencl 0.003 (0.001, 0.005, 0.003), after cpu 0.004 (0.004, 0.009, 0.002)
    assert touches.switch_seconds(call, cpu0, cl0, 3) == 0.0
    samples = iter([0.001, 0.004, 0.002, 0.007, 0.001, 0.005])
    assert touches.switch_seconds(call, cpu0, cl0, 3) == pytest.approx(0.004)
    assert [touches.last] == [cl0]
