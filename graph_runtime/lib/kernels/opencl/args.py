"""Typed OpenCL kernel objects: scalar argument dtypes declared once, so launches stay cheap."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

# Per kernel argument: None for a buffer, else the NumPy dtype of a scalar.
ArgTypes = Sequence[Any]
BUFFER = None
# An array argument as cl_param/cl_pointer declare it: its buffer, then its byte offset.
ARRAY: tuple[Any, ...] = (BUFFER, np.int64)


def typed_kernel(program: Any, entry: str, arg_types: ArgTypes) -> Any:
    """program's kernel `entry` with its scalar argument types declared.

    NOTE: with undeclared types pyopencl inspects every NumPy scalar argument on every launch,
    which costs more than PoCL's own launch (docs/measurements.md); declared, a launch is much
    cheaper and plain Python ints are accepted.
    """
    import pyopencl as cl
    knl = cl.Kernel(program, entry)
    knl.set_scalar_arg_dtypes(list(arg_types))
    return knl


def buf(arr: Any, dummy: Any) -> Any:
    """arr's buffer for a pointer slot; dummy when a zero-size array has none (OpenCL still wants
    a valid buffer object in every slot)."""
    return arr.base_data if arr.base_data is not None else dummy
