"""What CUDA and OpenCL kernels share: C type names, and small device tables made at prepare."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...backends.base import Backend

# C type names: OpenCL C and CuPy's CUDA C.
CL_TYPES = {"float16": "half", "float32": "float", "float64": "double", "int8": "char",
            "uint8": "uchar", "int16": "short", "int32": "int", "int64": "long",
            "uint32": "uint", "uint64": "ulong", "bool": "uchar"}
CUDA_TYPES = {"float16": "float16", "float32": "float", "float64": "double", "int8": "signed char",
              "uint8": "unsigned char", "int16": "short", "int32": "int", "int64": "long long",
              "uint32": "unsigned int", "uint64": "unsigned long long", "bool": "bool"}


def compute_type(dtype: str, kind: str) -> str:
    """The C type kernels compute in: float for float16, else the storage type."""
    if dtype == "float16":
        return "float"
    return (CL_TYPES if kind == "opencl" else CUDA_TYPES)[dtype]


def device_array(backend: Backend, device_id: int, host: np.ndarray) -> Any:
    """A device copy of a small host array (index tables, shapes), made once at prepare time."""
    host = np.ascontiguousarray(host)
    arr = backend.empty(device_id, host.shape, host.dtype)
    backend.from_host(host, arr)
    return arr


# Copies move bytes, so one kernel per element size serves every dtype.
_COPY_TYPES = {1: "uint8", 2: "int16", 4: "uint32", 8: "uint64"}


def copy_type(dtype: str) -> str:
    """The C type a copy of dtype moves: an integer of the same size (copies move bits)."""
    return _COPY_TYPES[np.dtype(dtype).itemsize]
