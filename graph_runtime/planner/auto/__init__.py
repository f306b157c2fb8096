"""Measured automatic placement: measured costs, the cost problem, its solvers, the report."""
from __future__ import annotations

from .cost_cache import CostCache
from .place import auto_place
from .report import AutoPlan
from .symbolic import SampledAutoPlan, auto_place_symbolic
from .verify import VerifyRow, verify_plans

__all__ = ["AutoPlan", "CostCache", "SampledAutoPlan", "VerifyRow", "auto_place",
           "auto_place_symbolic", "verify_plans"]
