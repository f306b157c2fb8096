"""The exception types graph_runtime raises; every one is a GraphRuntimeError."""
from __future__ import annotations


class GraphRuntimeError(Exception):
    """Base of every error graph_runtime raises on bad input or a failed device."""


class GraphError(GraphRuntimeError):
    """A graph JSON is malformed or inconsistent (names node, entry, column, expected vs got)."""


class LibraryError(GraphRuntimeError):
    """A kernel library is malformed, or lacks a function for a node's device."""


class DeviceError(GraphRuntimeError):
    """A device is unknown, missing, or its package is not installed (says what to install)."""


class ParamsError(GraphRuntimeError):
    """A params file is corrupt, truncated, or does not match the graph."""


class PlanError(GraphRuntimeError):
    """Device constraints conflict, so no placement exists."""


class DiscoError(GraphRuntimeError):
    """A Disco session or one of its workers failed."""


class FrontendError(GraphRuntimeError):
    """A model cannot be imported (lists every unsupported op with its nodes and the opset)."""
