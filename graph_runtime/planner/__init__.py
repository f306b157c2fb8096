"""Device planner: VirtualDevice constraints solved over a graph, copies, storage re-planned."""
from __future__ import annotations

from .constraints import Constraint, Placement, glob_escape, parse_device_constraint
from .plan import plan_graph
from .result import CopyReport, Fallback, PlanResult, PoolReport
from .storage_plan import PoolStats, StoragePlan, plan_storage
from .topology import PlanNode, Topology, topology_of
from .virtual_device import VirtualDevice, default, join

__all__ = [
    "Constraint", "CopyReport", "Fallback", "Placement", "PlanNode", "PlanResult", "PoolReport",
    "PoolStats", "StoragePlan", "Topology", "VirtualDevice", "default", "glob_escape", "join",
    "parse_device_constraint", "plan_graph", "plan_storage", "topology_of",
]
