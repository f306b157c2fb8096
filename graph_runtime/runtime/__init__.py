"""Running a graph: placement of entries and copies, the storage pool, the executor, GraphModule."""
from __future__ import annotations

from .graph_module import GraphModule, create
from .measure import BenchmarkResult, MemoryReport

__all__ = ["BenchmarkResult", "GraphModule", "MemoryReport", "create"]
