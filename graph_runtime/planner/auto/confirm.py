"""Keeping the default placement unless the solver's plan is clearly faster, both run end to end.

The solver trusts kernel costs measured one by one, and costs measured while the machine was
busy once put the MLP example all on OpenCL at 4.3x its all-CPU time. So the solver's plan and
the default one (every node on the first given device that may hold it) are created and run in
interleaved rounds (_timing.Race) until the difference is clear; the default stays unless the
solver's plan is clearly faster on a quiet machine (by _timing.TAKE_SPEEDUP["plan"]).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ... import _load
from ..._timing import NOISE, Budget, Race, Source, Verdict, min_speedup
from ...device import Device
from ...errors import GraphRuntimeError
from ...lib.library import Module
from ..result import PlanResult
from .calibrate import sampled_module

log = logging.getLogger("graph_runtime")

GAIN = min_speedup("plain", ["plan"])  # what the solver's plan must gain over the default
SAMPLE_S = 0.005  # a sample is as many runs as last this long (a tiny graph's run is µs)


@dataclass(frozen=True)
class PlanTiming:
    """How plans are timed against each other: a timing source per plan (by name, "default" or
    "auto") and the reading of the machine's load (None: _load.open_window)."""

    source: Callable[[str, PlanResult], Source]
    load: Callable[[], _load.Window] | None = None


@dataclass(frozen=True)
class DefaultCheck:
    """The solver's plan against the default one: predicted and measured, and which was kept."""

    default: str  # what the default plan is, e.g. "all on cpu:0"
    predicted: dict[str, float]  # "default", "auto" -> predicted seconds per run
    kept: str  # "auto" or "default"
    verdict: Verdict | None = None  # None: not measured (same plan, or they could not run)
    failed: str = ""  # why the plans could not be run

    @property
    def outcome(self) -> str:
        """"same plan", "not measured", or the verdict's confidence (clear, within noise,
        busy)."""
        if self.verdict is not None:
            return self.verdict.confidence
        return "not measured" if self.failed else "same plan"

    def text(self) -> str:
        """Two lines for the report: the measured times, and what was kept and why."""
        if self.verdict is None and not self.failed:
            return f"the solver's plan is the default ({self.default}): nothing to compare"
        if self.verdict is None:
            return (f"kept the default ({self.default}): the plans could not be run to compare "
                    f"them: {self.failed}")
        v = self.verdict
        seconds = v.seconds
        if self.kept == "auto":
            kept = "kept auto"
        elif v.chosen == "auto":
            kept = "kept the default: auto won while the machine was busy"
        elif v.outcome == NOISE:
            kept = "kept the default: within noise"
        else:
            kept = f"kept the default (auto is not clearly {GAIN:.2f}x as fast)"
        return (f"measured run time (medians of interleaved rounds): default ({self.default}) "
                f"{seconds['default'] * 1e3:.3f} ms, auto {seconds['auto'] * 1e3:.3f} ms\n"
                f"{v.text()}: {kept}")

    def to_json(self) -> dict[str, Any]:
        seconds = self.verdict.seconds if self.verdict is not None else {}
        return {"default": self.default, "kept": self.kept, "outcome": self.outcome,
                "predicted_seconds": dict(self.predicted),
                "measured_seconds": seconds or None,
                "rounds": self.verdict.rounds if self.verdict is not None else 0,
                "busy": self.verdict.busy if self.verdict is not None else "",
                "failed": self.failed}


def default_label(choice: Sequence[int], n: int, devs: Sequence[Device]) -> str:
    """The default plan for people: "all on cpu:0", or where some nodes could not go there."""
    if all(c == 0 for c in choice[:n]):
        return f"all on {devs[0].spec}"
    return f"{devs[0].spec} wherever allowed"


def module_timing(lib: Module, devices: Sequence[Device],
                  params: Mapping[str, Any] | None) -> PlanTiming:
    """Each plan created as a GraphModule with params and sampled inputs (calibrate.py), a
    sample being the mean of as many benchmarked runs as last SAMPLE_S."""
    def source(name: str, plan: PlanResult) -> Source:
        module = sampled_module(plan.graph, lib, devices, params)

        def sample(number: int) -> float:
            with np.errstate(all="ignore"):
                return float(module.benchmark(repeat=1, number=number).mean)
        number = max(1, math.ceil(SAMPLE_S / max(sample(1), 1e-9)))
        return lambda: sample(number)
    return PlanTiming(source)


def check_default(plans: Mapping[str, PlanResult], predicted: dict[str, float], label: str,
                  timing: PlanTiming, budget: Budget) -> DefaultCheck:
    """Race plans["auto"] against plans["default"]; auto is kept only when clearly faster."""
    try:
        sources = {name: timing.source(name, plan) for name, plan in plans.items()}
        verdict = Race("default", GAIN, budget, timing.load)(sources)
    except GraphRuntimeError as e:
        log.info("plan --auto: kept the default (%s): the plans could not run: %s", label, e)
        return DefaultCheck(label, predicted, "default", failed=str(e))
    kept = "auto" if verdict.confident and verdict.chosen == "auto" else "default"
    check = DefaultCheck(label, predicted, kept, verdict)
    log.info("plan --auto: %s", check.text().replace("\n", "; "))
    return check
