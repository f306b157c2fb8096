"""graph_runtime: run TVM graph JSON across CPU (NumPy), CUDA (CuPy) and OpenCL (PyOpenCL)."""
from __future__ import annotations

from .device import Device, cpu, cuda, device, opencl
from .errors import (DeviceError, DiscoError, GraphError, GraphRuntimeError, LibraryError,
                     ParamsError, PlanError)

__version__ = "0.1.0"
