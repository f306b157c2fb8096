"""Helpers for kernels written once against NumPy's API and run by NumPy (cpu) or CuPy (cuda)."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...backends import run_in_scope
from ...backends.base import Backend
from ..library import TensorSpec


def array_module(backend: Backend) -> Any:
    """numpy for the cpu backend, cupy for cuda (both share NumPy's API)."""
    if backend.name == "cuda":
        import cupy
        return cupy
    return np


def host_kernel(backend: Backend, device_id: int, fn: Callable[..., None]) -> Callable[..., None]:
    """fn as is on cpu; on cuda, fn run with device_id current (cupy launches on that device)."""
    return run_in_scope(backend, device_id, fn)


def host_factory(make: Callable[..., Callable[..., None]]) -> Callable[..., Callable[..., None]]:
    """A kernel factory calling make(xp, backend, device_id, inputs, outputs, attrs) -> run."""
    def factory(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        run = make(array_module(backend), backend, device_id, inputs, outputs, attrs)
        return host_kernel(backend, device_id, run)
    return factory


def wide_dtype(dtype: str) -> str:
    """The dtype float16 work accumulates in (float32, as the GPU kernels do); others as is."""
    return "float32" if dtype == "float16" else dtype
