"""Elementwise GPU kernels generated from ops' C expressions (one op, or a chain's fused tail)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

import numpy as np

from ...backends.base import Backend
from ..library import TensorSpec
from ..shapes import broadcast_strides, size_of
from .gpu_common import CUDA_TYPES, compute_type, device_array
from .host import host_kernel
from .opencl.source import (ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param, cl_pointer,
                            cl_store, cl_type)

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

# op name -> fn(attrs) -> C expression template over {0}, {1}, ... (input values, already in the
# compute type) and {T} (the compute type). Valid OpenCL C and CUDA C alike. attrs also hold
# DTYPE_KEY: the dtype of the op's input 0. A chain fuses a tail of such ops into one GPU kernel.
ELEMENTWISE_EXPRS: dict[str, Callable[[Mapping[str, Any]], str]] = {}


def elementwise_expr(op_name: str, expr: str | Callable[[Mapping[str, Any]], str]) -> None:
    """Declare an op's C expression so GPU chains can fuse it (a string or fn(attrs) -> str)."""
    if isinstance(expr, str):
        text = expr
        ELEMENTWISE_EXPRS[op_name] = lambda attrs: text
    else:
        ELEMENTWISE_EXPRS[op_name] = expr


Steps = Sequence[tuple[str, Sequence[int], str]]


def gpu_elementwise(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                    output: TensorSpec, steps: Steps, name: str = "gr_elementwise",
                    siblings: Mapping[str, Steps] | None = None) -> Callable[..., None]:
    """One GPU kernel computing output from inputs with NumPy broadcasting.

    Args:
        steps: (template, operand slots, result dtype) per step; slots 0..len(inputs)-1 are the
            inputs, slot len(inputs)+k is step k's result; the last step's result is stored.
            A single op is one step: [(template, [0, 1], out_dtype)].
        name: the kernel's name (a C identifier).
        siblings: OpenCL only: more kernels (name -> steps, same inputs and output) built into
            the same program, so a family of ops shares one slow OpenCL build.
    Returns:
        run(*input_arrays, output_array).
    """
    if backend.name == "opencl":
        return _cl_elementwise(cast("OpenCLBackend", backend), device_id, inputs, output, steps,
                               name, siblings or {})
    return _cuda_elementwise(backend, device_id, inputs, output, steps, name)


def _step_lines(inputs: Sequence[TensorSpec], steps: Steps, kind: str) -> list[str]:
    lines = []
    for k, (template, slots, dtype) in enumerate(steps):
        ctype = compute_type(dtype, kind)
        names = [f"v{s}" for s in slots]
        lines.append(f"{ctype} v{len(inputs) + k} = ({ctype})("
                     + template.format(*names, T=ctype) + ");")
    return lines


def _cl_elementwise_text(name: str, inputs: Sequence[TensorSpec], output: TensorSpec,
                         steps: Steps, broadcast: bool) -> str:
    params = [cl_param("out", output.dtype, const=False)]
    params += [cl_param(f"in{i}", s.dtype) for i, s in enumerate(inputs)]
    body = [cl_pointer("out", output.dtype, const=False)]
    body += [cl_pointer(f"in{i}", s.dtype) for i, s in enumerate(inputs)]
    if broadcast:
        # meta = output shape, then per input its element strides over the output's axes.
        params.append("__global const long* meta_base, long meta_off, int rank")
        body.append(cl_pointer("meta", "int64"))
        body.append("long rest = i;")
        body += [f"long o{i} = 0;" for i in range(len(inputs))]
        body.append("for (int d = rank - 1; d >= 0; --d) {")
        body.append("    long c = rest % meta[d]; rest /= meta[d];")
        body += [f"    o{i} += c * meta[rank * {i + 1} + d];" for i in range(len(inputs))]
        body.append("}")
    for i, s in enumerate(inputs):
        load = cl_load(f"in{i}", s.dtype, f"o{i}" if broadcast else "i")
        body.append(f"{compute_type(s.dtype, 'opencl')} v{i} = {load};")
    body += _step_lines(inputs, steps, "opencl")
    body.append(cl_store("out", output.dtype, "i", f"v{len(inputs) + len(steps) - 1}"))
    return (f"__kernel void {name}({', '.join(params)}, long n) {{\n"
            "    long i = get_global_id(0);\n    if (i >= n) return;\n    "
            + "\n    ".join(body) + "\n}\n")


def _cl_elementwise(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                    output: TensorSpec, steps: Steps, name: str,
                    siblings: Mapping[str, Steps]) -> Callable[..., None]:
    kernels = {**siblings, name: steps}
    dtypes = [s.dtype for s in inputs] + [output.dtype]
    dtypes += [d for family in kernels.values() for _, _, d in family]
    for d in dtypes:
        cl_type(name, d)
    check_cl_dtypes(name, backend, device_id, dtypes)
    rank = len(output.shape)
    n = size_of(output.shape)
    # NOTE: rank and shapes are kernel arguments, not source text, so one compiled kernel serves
    # every shape (OpenCL compiles are slow); with any broadcasting every input goes strided.
    broadcast = any(tuple(s.shape) != tuple(output.shape) for s in inputs)
    source = cl_header(dtypes) + "".join(
        _cl_elementwise_text(k, inputs, output, kernels[k], broadcast) for k in sorted(kernels))
    kernel = ClKernel(backend, device_id, source, name, name)
    extra: tuple[Any, ...] = (n,)
    if broadcast:
        meta_host = list(output.shape)
        for spec in inputs:
            meta_host += broadcast_strides(spec.shape, output.shape)
        meta = device_array(backend, device_id, np.array(meta_host or [0], np.int64))
        extra = (meta, np.int32(rank), n)

    def run(*arrays: Any) -> None:
        kernel.launch(n, None, arrays[-1], *arrays[:-1], *extra)
    return run


_cuda_kernels: dict[tuple[str, str, str], Any] = {}


def cuda_elementwise_kernel(in_params: str, out_params: str, operation: str,
                            name: str) -> Any:
    """A cached cupy.ElementwiseKernel (CuPy compiles once per kernel and dtypes)."""
    key = (in_params, out_params, operation)
    kernel = _cuda_kernels.get(key)
    if kernel is None:
        import cupy
        kernel = cupy.ElementwiseKernel(in_params, out_params, operation, name)
        _cuda_kernels[key] = kernel
    return kernel


def _cuda_elementwise(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                      output: TensorSpec, steps: Sequence[tuple[str, Sequence[int], str]],
                      name: str) -> Callable[..., None]:
    in_params = ", ".join(f"{s.dtype} in{i}" for i, s in enumerate(inputs))
    out_params = f"{output.dtype} out"
    lines = [f"{compute_type(s.dtype, 'cuda')} v{i} = ({compute_type(s.dtype, 'cuda')})in{i};"
             for i, s in enumerate(inputs)]
    lines += _step_lines(inputs, steps, "cuda")
    lines.append(f"out = ({CUDA_TYPES[output.dtype]})(v{len(inputs) + len(steps) - 1});")
    kernel = cuda_elementwise_kernel(in_params, out_params, "\n".join(lines), name)

    def run(*arrays: Any) -> None:
        # NOTE: CuPy broadcasts inputs against the given output; an empty output has no work.
        if arrays[-1].size:
            kernel(*arrays[:-1], arrays[-1])
    return host_kernel(backend, device_id, run)
