"""Kernel libraries ("libmod"): Module, lib-file loaders, and the standard ops per backend."""
from __future__ import annotations

from .library import Module, TensorSpec
from .loader import load_module, standard_module

__all__ = ["Module", "TensorSpec", "load_module", "standard_module"]
