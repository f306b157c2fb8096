"""Running a graph: placement of entries and copies, the storage pool, the executor, the modules."""
from __future__ import annotations

from .graph_module import GraphModule, create
from .measure import BenchmarkResult, MemoryReport
from .module_base import ModuleBase

__all__ = ["BenchmarkResult", "GraphModule", "MemoryReport", "ModuleBase", "create"]
