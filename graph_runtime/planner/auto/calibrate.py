"""Calibrating auto placement's kernel costs by one whole-graph run per device.

Kernels are timed alone, launched back to back on the same warm buffers (measure_costs.py), and
a graph runs them differently, in both directions:
- on the CPU a kernel in a graph finds its weights evicted by the nodes before it, its worker
  threads asleep, and pays the executor's step, so the sum under-prices the run;
- on an asynchronous device a run of different kernels overlaps one kernel's host-side enqueue
  with another's execution, so the sum over-prices it (docs/planner.md has the measurements).
So each device that can hold the whole graph runs it once here (a benchmark median), and its
kernel costs are scaled by the run's measured time (less its copies) over the sum of its kernel
times. One factor per device keeps the costs per node (the solver still compares nodes by them)
and makes every one-device prediction the measured run. A factor is cached with the kernel
times, keyed by the graph, its kernels' cache keys and the device.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...device import Device
from ...errors import GraphRuntimeError
from ...graph.model import Graph
from ...lib.library import Module
from .cost_cache import CostCache
from .cost_problem import CostProblem

FACTOR_RANGE = (0.2, 5.0)  # beyond these a run went wrong, not the model


@dataclass(frozen=True)
class Calibration:
    """One device's factor: its whole-graph run (less copies) over the sum of its kernels."""

    device: Device
    factor: float
    cached: bool  # from the cache, no run this time
    failed: str = ""  # why the run could not be made (factor 1.0: costs left as measured)


def sequence_key(g: Graph, kernel_keys: Sequence[str], device_name: str) -> str:
    """The cache key of a device's whole-graph run: graph text, its kernels' keys, device."""
    h = hashlib.sha256(g.to_json().encode())
    for key in sorted(kernel_keys):
        h.update(key.encode())
    return f"{h.hexdigest()[:16]}|{device_name}"


def calibrate(problem: CostProblem, d: int, single: list[int], n_nodes: int, key: str,
              cache: CostCache, run_plan: Callable[[], float], device: Device
              ) -> Calibration | None:
    """Scale device d's kernel costs in problem (in place) by its whole-graph run's factor.

    run_plan runs the one-device plan and returns its median seconds; it is only called when
    the cache lacks the key. None when the device has no kernel costs to scale; a factor of
    1.0 with the error when the graph does not run on sampled inputs (an index out of range).
    """
    costs = problem.node_cost[:n_nodes, d]
    kernels = float(costs[np.isfinite(costs)].sum())
    if kernels <= 0.0:
        return None
    cached = key in cache.sequences
    if not cached:
        copies = problem.objective(single) - kernels
        try:
            measured = run_plan()
        except GraphRuntimeError as e:
            return Calibration(device, 1.0, False, str(e))
        low, high = FACTOR_RANGE
        cache.sequences[key] = max(low, min(high, (measured - copies) / kernels))
        cache.save()
    factor = cache.sequences[key]
    problem.node_cost[:n_nodes, d] = costs * factor
    return Calibration(device, factor, cached)


def whole_run_seconds(planned: Callable[[], Graph], lib: Module, devices: Sequence[Device],
                      params: Mapping[str, Any] | None) -> Callable[[], float]:
    """run_plan for calibrate: plan the graph (only now: a cached factor needs no plan), create
    it with sampled inputs (sampled_module), return its benchmark median."""
    def run() -> float:
        module = sampled_module(planned(), lib, devices, params)
        with np.errstate(all="ignore"):
            return float(module.benchmark(repeat=5, number=1, min_repeat_ms=20.0).median)
    return run


def sampled_module(g: Graph, lib: Module, devices: Sequence[Device],
                   params: Mapping[str, Any] | None) -> Any:
    """g created on devices, fed params and sampled inputs (floats normal, integers and
    booleans zero, valid as indices)."""
    from ...runtime.graph_module import create
    rng = np.random.default_rng(0)
    given = dict(params or {})
    module = create(g, lib, list(devices))
    values = {}
    for name, eid in g.input_entries.items():
        if name in given:
            values[name] = given[name]
            continue
        dtype = np.dtype(g.dtype(eid))
        shape = tuple(g.shape(eid))
        values[name] = (rng.standard_normal(shape).astype(dtype) if dtype.kind == "f"
                        else np.zeros(shape, dtype))
    module.set_input(values)
    return module

