"""Checking an automatic plan: run it and each one-device plan, predicted vs measured seconds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..._text import table
from ...lib.library import Module
from ..result import PlanResult
from .place import AutoPlan, plan_on


@dataclass(frozen=True)
class VerifyRow:
    """One plan: its label, predicted and measured seconds per run, and the output difference."""

    plan: str
    predicted: float
    measured: float
    max_abs_diff: float  # largest output difference from the first plan run


def verify_plans(auto: AutoPlan, lib: Module, params: Mapping[str, Any] | None = None,
                 inputs: Mapping[str, Any] | None = None, repeat: int = 5,
                 min_repeat_ms: float = 50.0) -> list[VerifyRow]:
    """Run the auto plan and every possible one-device plan; median seconds of run() for each.

    Inputs not given are drawn at random (seed 0); every plan gets the same values.
    """
    from ...runtime.graph_module import create
    plans: list[tuple[str, float, PlanResult]] = [("auto", auto.predicted, auto.plan)]
    for dev, predicted in auto.alternatives.items():
        if predicted is not None:
            plans.append((f"all on {dev.spec}", predicted, plan_on(auto, dev, lib)))
    params = dict(params or {})
    values = dict(inputs or {})
    rng = np.random.default_rng(0)
    g = auto.graph
    for name, eid in g.input_entries.items():
        if name not in values and name not in params:
            values[name] = rng.standard_normal(g.shape(eid)).astype(g.dtype(eid))
    rows = []
    reference: list[np.ndarray] | None = None
    for label, predicted, result in plans:
        module = create(result.graph, lib, auto.devices)
        if params:
            module.load_params(params)
        module.set_input(values)
        module.run()
        outputs = [module.get_output(i).numpy() for i in range(module.get_num_outputs())]
        if reference is None:
            reference = outputs
        diff = max((float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
                    for a, b in zip(outputs, reference)), default=0.0)
        bench = module.benchmark(repeat=repeat, number=1, min_repeat_ms=min_repeat_ms)
        rows.append(VerifyRow(label, predicted, bench.median, diff))
    return rows


def verify_text(rows: list[VerifyRow]) -> str:
    """Predicted vs measured, side by side."""
    return table(["plan", "predicted ms", "measured ms", "measured/predicted", "max |diff|"],
                 [[r.plan, f"{r.predicted * 1e3:.3f}", f"{r.measured * 1e3:.3f}",
                   f"{r.measured / r.predicted:.2f}" if r.predicted else "-",
                   f"{r.max_abs_diff:.2e}"] for r in rows])
