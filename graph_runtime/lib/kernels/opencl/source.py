"""OpenCL C plumbing: typed loads, stores and parameters, ClKernel, the generic strided copy."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ...attrs import op_error
from ...shapes import size_of
from ..gpu_common import CL_TYPES, copy_type, device_array
from .args import buf

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend


def cl_type(op: str, dtype: str) -> str:
    """OpenCL C storage type of dtype, or a LibraryError."""
    if dtype not in CL_TYPES:
        raise op_error(op, f"dtype {dtype} has no OpenCL type; supported: {', '.join(CL_TYPES)}")
    return CL_TYPES[dtype]


def cl_load(ptr: str, dtype: str, index: str) -> str:
    """C expression reading ptr[index] as the compute type (half goes through vload_half)."""
    if dtype == "float16":
        return f"vload_half({index}, {ptr})"
    return f"{ptr}[{index}]"


def cl_store(ptr: str, dtype: str, index: str, value: str) -> str:
    """C statement writing value to ptr[index] (half through vstore_half)."""
    if dtype == "float16":
        return f"vstore_half((float)({value}), {index}, {ptr});"
    return f"{ptr}[{index}] = ({CL_TYPES[dtype]})({value});"


def cl_param(name: str, dtype: str, const: bool = True) -> str:
    """Kernel parameters for one array: its buffer and its byte offset (see cl_pointer)."""
    qual = "const " if const else ""
    return f"__global {qual}{CL_TYPES[dtype]}* {name}_base, long {name}_off"


def cl_pointer(name: str, dtype: str, const: bool = True) -> str:
    """Statement defining `name` as the array's first element from its buffer and byte offset."""
    qual = "const " if const else ""
    ctype = CL_TYPES[dtype]
    return (f"__global {qual}{ctype}* {name} = (__global {qual}{ctype}*)"
            f"((__global {qual}char*){name}_base + {name}_off);")


def cl_header(dtypes: Sequence[str]) -> str:
    """Source prologue: enables fp64 when a double is involved."""
    if "float64" in dtypes:
        return "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    return ""


def check_cl_dtypes(op: str, backend: OpenCLBackend, device_id: int, dtypes: Sequence[str]) -> None:
    """Refuse float64 on an OpenCL device without fp64, naming the device."""
    if "float64" in dtypes:
        dev = backend.cl_device(device_id)
        if "cl_khr_fp64" not in dev.extensions and not dev.double_fp_config:
            raise op_error(op, f"float64 is not supported by opencl:{device_id} "
                               f"({dev.name.strip()})")


class ClKernel:
    """One OpenCL kernel of a program, launched over n work items with array arguments.

    Array arguments expand to (buffer, byte offset), matching cl_param/cl_pointer; Python ints
    become long, floats double, NumPy scalars pass as they are. The kernel object belongs to
    one prepared call (pyopencl kernels hold their args).
    """

    def __init__(self, backend: OpenCLBackend, device_id: int, source: str, entry: str,
                 name: str) -> None:
        import pyopencl as cl
        self.queue = backend.queue(device_id)
        program = backend.program(device_id, source, name=name)
        self.kernel = cl.Kernel(program, entry)
        # NOTE: a zero-size array may have no buffer; kernels never read it, but OpenCL
        # wants a valid buffer object in every pointer slot.
        self._dummy = backend.alloc(device_id, 1)
        self._typed = False

    def args(self, arrays: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        for a in arrays:
            if isinstance(a, np.generic):
                out.append(a)
            elif isinstance(a, int):
                out.append(np.int64(a))
            elif isinstance(a, float):
                out.append(np.float64(a))
            else:
                out.append(buf(a, self._dummy))
                out.append(np.int64(a.offset))
        return out

    def launch(self, global_size: int, local_size: int | None, *arrays: Any) -> None:
        """Enqueue on global_size work items (rounded up to local_size or 64)."""
        if global_size <= 0:
            return
        step = local_size or 64
        padded = (global_size + step - 1) // step * step
        args = self.args(arrays)
        if not self._typed:
            # NOTE: declaring the scalar types once makes pyopencl pack scalars directly; left
            # undeclared it inspects every NumPy scalar on every launch, which costs more than
            # PoCL's own launch (docs/measurements.md). A prepared call always passes the same
            # kinds of arguments, so the first launch fixes them.
            self.kernel.set_scalar_arg_dtypes(
                [a.dtype if isinstance(a, np.generic) else None for a in args])
            self._typed = True
        self.kernel(self.queue, (padded,), (local_size,) if local_size else None, *args)


def cl_strided_copy(backend: OpenCLBackend, device_id: int, dtype: str, shape: Sequence[int],
                    src_strides: Sequence[int], dst_strides: Sequence[int],
                    name: str = "copy") -> Callable[..., None]:
    """copy(src, dst, src_start, dst_start) for every coordinate c of shape:
    dst[dst_start + c . dst_strides] = src[src_start + c . src_strides] (in elements; a stride
    may be 0 or negative).

    One generic OpenCL kernel per element size and rank serves transpose, slices, concatenate,
    split and pad; shape and strides go to the device once, here.
    """
    store = copy_type(dtype)
    rank = len(shape)
    n = size_of(shape)
    source = f"""__kernel void gr_strided_copy({cl_param("dst", store, const=False)},
        {cl_param("src", store)}, {cl_param("meta", "int64")}, int rank, long src0, long dst0,
        long n) {{
    long i = get_global_id(0);
    if (i >= n) return;
    {cl_pointer("dst", store, const=False)}
    {cl_pointer("src", store)}
    {cl_pointer("meta", "int64")}
    long rest = i;
    long s = src0;
    long t = dst0;
    for (int d = rank - 1; d >= 0; --d) {{
        long c = rest % meta[d]; rest /= meta[d];
        s += c * meta[rank + d];
        t += c * meta[2 * rank + d];
    }}
    dst[t] = src[s];
}}
"""
    kernel = ClKernel(backend, device_id, source, "gr_strided_copy", name)
    meta = device_array(backend, device_id,
                        np.array(list(shape) + list(src_strides) + list(dst_strides) or [0],
                                 np.int64))
    rank32 = np.int32(rank)

    def copy(src: Any, dst: Any, src_start: int = 0, dst_start: int = 0) -> None:
        kernel.launch(n, None, dst, src, meta, rank32, src_start, dst_start, n)
    return copy
