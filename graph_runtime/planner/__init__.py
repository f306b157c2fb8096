"""Device planner: VirtualDevice constraints solved over a graph, copies, storage re-planned.

The measured automatic placement (auto_place) is the subpackage auto/.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .constraints import Constraint, Placement, glob_escape, parse_device_constraint
from .plan import plan_graph
from .result import CopyReport, Fallback, PlanResult, PoolReport
from ..graph.storage_plan import PoolStats, StoragePlan, plan_storage
from ..graph.topology import PlanNode, Topology, topology_of
from .virtual_device import VirtualDevice, default, join

__all__ = [
    "AutoPlan", "Constraint", "CopyReport", "CostCache", "Fallback", "Placement", "PlanNode",
    "PlanResult", "PoolReport", "PoolStats", "SampledAutoPlan", "StoragePlan", "Topology",
    "VerifyRow", "VirtualDevice", "auto_place", "auto_place_symbolic", "default", "glob_escape",
    "join", "parse_device_constraint", "plan_graph", "plan_storage", "topology_of",
    "verify_plans",
]

if TYPE_CHECKING:
    from .auto import (AutoPlan, CostCache, SampledAutoPlan, VerifyRow, auto_place,
                       auto_place_symbolic, verify_plans)

_AUTO = {"AutoPlan", "CostCache", "SampledAutoPlan", "VerifyRow", "auto_place",
         "auto_place_symbolic", "verify_plans"}


def __getattr__(name: str) -> Any:
    """auto/'s names, imported on first use: `import graph_runtime` (every graphrun start)
    spent 11-13 ms importing the measured placement that few commands use."""
    if name in _AUTO:
        from . import auto
        return getattr(auto, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
