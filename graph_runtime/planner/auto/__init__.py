"""Measured automatic placement: measured costs, the cost problem, its solvers, the report."""
from __future__ import annotations

from .cost_cache import CostCache
from .place import auto_place
from .report import AutoPlan
from .verify import VerifyRow, verify_plans

__all__ = ["AutoPlan", "CostCache", "VerifyRow", "auto_place", "verify_plans"]
