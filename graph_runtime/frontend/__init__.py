"""Importers that turn models from other frameworks into graph JSON, a lib and params.

Importing this package does not import onnx; from_onnx does, and says how to install it.
"""
from __future__ import annotations

from .importer import ImportResult, from_onnx, import_onnx

__all__ = ["ImportResult", "from_onnx", "import_onnx"]
