"""The graph model: TVM graph JSON read and written losslessly, its schema and semantic checks."""
from __future__ import annotations

from .model import (COPY_OP, NOP_OP, SUPPORTED_DTYPES, Graph, GraphSource, Node, check_graph,
                    load_graph)

__all__ = ["COPY_OP", "NOP_OP", "SUPPORTED_DTYPES", "Graph", "GraphSource", "Node", "check_graph",
           "load_graph"]
