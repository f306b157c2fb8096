"""graph_runtime: run TVM graph JSON across CPU (NumPy), CUDA (CuPy) and OpenCL (PyOpenCL)."""
from __future__ import annotations

from . import nd
from ._version import __version__
from ._timing import BenchmarkResult
from .backends import available_backends, list_devices
from .device import Device, cpu, cuda, device, opencl
from .errors import (DeviceError, DiscoError, FrontendError, GraphError, GraphRuntimeError,
                     LibraryError, ParamsError, PlanError)
from .graph.model import Graph, load_graph
from .lib import Module, load_module, standard_module
from .nd import NDArray
from .params import load_param_dict, load_params_file, save_param_dict, save_params_file
from .planner import Placement, plan_graph
from .runtime.graph_module import GraphModule, create
from .runtime.module_base import ModuleBase
from .subgraphs import install as _install_subgraph_builder

_install_subgraph_builder()


__all__ = [
    "BenchmarkResult", "Device", "NDArray", "DeviceError", "DiscoError", "FrontendError", "Graph",
    "GraphError", "GraphModule", "GraphRuntimeError", "LibraryError", "Module", "ModuleBase",
    "ParamsError", "PlanError", "Placement", "available_backends", "cpu", "create", "cuda",
    "device", "list_devices", "load_graph", "load_module", "load_param_dict", "load_params_file",
    "nd", "opencl", "plan_graph", "save_param_dict", "save_params_file", "standard_module",
]
