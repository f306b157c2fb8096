"""Helpers every op family shares: attribute parsing, shape checks, and GPU kernel builders."""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...errors import LibraryError
from ..module import TensorSpec

FLOAT_DTYPES = ("float16", "float32", "float64")
INT_DTYPES = ("int32", "int64")
NUMERIC_DTYPES = FLOAT_DTYPES + INT_DTYPES
# Keys a graph node carries for the executor, never for the op; op attr checks skip them.
NODE_KEYS = frozenset({"func_name", "num_inputs", "num_outputs", "flatten_data", "hash",
                       "device_index", "device_id", "device_type"})
# The chain sets this for its last op so an op like cast can learn the dtype the graph declares.
OUT_DTYPE_KEY = "__out_dtype"
# ... and the number of outputs the graph node declares (batch_norm: 1 or 3).
NUM_OUTPUTS_KEY = "__num_outputs"
# Elementwise expression functions find the dtype of the op's input 0 under this key.
DTYPE_KEY = "__dtype"
_REQUIRED: Any = object()


# -- errors -------------------------------------------------------------------------------------

def op_error(op: str, message: str) -> LibraryError:
    """A LibraryError whose message starts with the op name."""
    return LibraryError(f"{op}: {message}")


def attr_error(op: str, name: str, value: Any, expected: str) -> LibraryError:
    """LibraryError like `transpose: attribute 'axes' = (0, 5): expected axes below rank 3`."""
    return LibraryError(f"{op}: attribute {name!r} = {value!r}: expected {expected}")


# -- attributes ---------------------------------------------------------------------------------

def parse_value(value: Any) -> Any:
    """A JSON value, or the string form graph JSON uses ("2", "[1, 1]", "(1, 1)", "None")."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text in ("None", "none", "null", ""):
        return None
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    try:
        return json.loads(text.replace("(", "[").replace(")", "]").replace(",]", "]"))
    except ValueError:
        return value


def _get(op: str, attrs: Mapping[str, Any], name: str, default: Any) -> Any:
    if name in attrs:
        return parse_value(attrs[name])
    if default is _REQUIRED:
        raise op_error(op, f"missing required attribute {name!r}")
    return default


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def int_attr(op: str, attrs: Mapping[str, Any], name: str, default: Any = _REQUIRED) -> Any:
    """An integer attribute (default returned as is when absent)."""
    value = _get(op, attrs, name, default)
    if value is default and name not in attrs:
        return value
    if not _is_int(value):
        raise attr_error(op, name, value, "an integer")
    return int(value)


def float_attr(op: str, attrs: Mapping[str, Any], name: str, default: Any = _REQUIRED) -> Any:
    """A number attribute, as float."""
    value = _get(op, attrs, name, default)
    if value is default and name not in attrs:
        return value
    if not isinstance(value, (int, float, np.number)) or isinstance(value, bool):
        raise attr_error(op, name, value, "a number")
    return float(value)


def bool_attr(op: str, attrs: Mapping[str, Any], name: str, default: Any = _REQUIRED) -> bool:
    """A boolean attribute; accepts true/false and 0/1 (graph JSON writes "1")."""
    value = _get(op, attrs, name, default)
    if isinstance(value, bool):
        return value
    if _is_int(value) and value in (0, 1):
        return bool(value)
    raise attr_error(op, name, value, "true/false or 0/1")


def str_attr(op: str, attrs: Mapping[str, Any], name: str, default: Any = _REQUIRED,
             choices: Sequence[str] | None = None) -> Any:
    """A string attribute, optionally one of choices."""
    value = attrs.get(name, default)
    if value is _REQUIRED:
        raise op_error(op, f"missing required attribute {name!r}")
    if value is default and name not in attrs:
        return value
    if not isinstance(value, str):
        raise attr_error(op, name, value, "a string")
    if choices is not None and value not in choices:
        raise attr_error(op, name, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def int_tuple(op: str, attrs: Mapping[str, Any], name: str, n: int | None = None,
              default: Any = _REQUIRED) -> Any:
    """A tuple of ints; an int or a 1-list broadcasts to n entries; None/absent gives default."""
    value = _get(op, attrs, name, default)
    if value is default and name not in attrs:
        return value
    if value is None:
        if default is _REQUIRED:
            raise attr_error(op, name, value, "an integer or a list of integers")
        return default
    if _is_int(value):
        value = [value] * (n if n is not None else 1)
    if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
        raise attr_error(op, name, value, "an integer or a list of integers")
    if n is not None and len(value) == 1:
        value = list(value) * n
    if n is not None and len(value) != n:
        raise attr_error(op, name, value, f"{n} integers")
    return tuple(int(v) for v in value)


def normalize_axis(op: str, axis: int, ndim: int, name: str = "axis") -> int:
    """axis in [-ndim, ndim) mapped to [0, ndim)."""
    if not -ndim <= axis < ndim:
        raise attr_error(op, name, axis,
                         f"an axis in [{-ndim}, {ndim}) for an input of rank {ndim}")
    return axis + ndim if axis < 0 else axis


def single_axis(op: str, attrs: Mapping[str, Any], name: str, ndim: int,
                default: Any = _REQUIRED) -> int:
    """One normalized axis (softmax, concatenate, take)."""
    return normalize_axis(op, int_attr(op, attrs, name, default), ndim, name)


def axis_attr(op: str, attrs: Mapping[str, Any], name: str, ndim: int,
              default: Any = None) -> tuple[int, ...] | None:
    """Sorted normalized axes from an int or a list; None (absent or null) stays None."""
    raw = int_tuple(op, attrs, name, None, default)
    if raw is None:
        return None
    axes = tuple(normalize_axis(op, a, ndim, name) for a in raw)
    if len(set(axes)) != len(axes):
        raise attr_error(op, name, list(raw), "distinct axes")
    return tuple(sorted(axes))


def dtype_attr(op: str, attrs: Mapping[str, Any], name: str, default: Any = _REQUIRED) -> Any:
    """A dtype name NumPy knows, in NumPy's spelling ("float" becomes "float64")."""
    value = str_attr(op, attrs, name, default)
    if value is default and name not in attrs:
        return value
    try:
        return str(np.dtype(value))
    except TypeError as e:
        raise attr_error(op, name, value, "a dtype name such as 'float32' or 'int64'") from e


def check_attrs(op: str, attrs: Mapping[str, Any], allowed: Sequence[str]) -> None:
    """Refuse attribute names the op does not take (node keys and '__' keys pass)."""
    for name in attrs:
        if name in NODE_KEYS or name.startswith("__") or name in allowed:
            continue
        choices = ", ".join(allowed) if allowed else "no attributes"
        raise op_error(op, f"unknown attribute {name!r}; it accepts: {choices}")


# -- inputs -------------------------------------------------------------------------------------

def check_num_inputs(op: str, inputs: Sequence[TensorSpec], n: int) -> None:
    if len(inputs) != n:
        raise op_error(op, f"takes {n} input(s), got {len(inputs)}")


def check_dtype(op: str, spec: TensorSpec, allowed: Sequence[str], what: str = "input 0") -> str:
    """spec.dtype when it is one of allowed; otherwise a LibraryError listing them."""
    if spec.dtype not in allowed:
        raise op_error(op, f"{what} has dtype {spec.dtype}; supported: {', '.join(allowed)}")
    return spec.dtype


def check_same_dtype(op: str, inputs: Sequence[TensorSpec]) -> str:
    """The common dtype of all inputs (Relay does not promote)."""
    first = inputs[0].dtype
    for i, spec in enumerate(inputs[1:], start=1):
        if spec.dtype != first:
            raise op_error(op, f"input {i} has dtype {spec.dtype} but input 0 has {first}; "
                               "insert a cast")
    return first


def check_rank(op: str, spec: TensorSpec, ranks: Sequence[int], what: str = "input 0") -> int:
    if len(spec.shape) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise op_error(op, f"{what} has shape {tuple(spec.shape)} (rank {len(spec.shape)}); "
                           f"expected rank {want}")
    return len(spec.shape)


def broadcast_shape(op: str, *shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy's broadcast of shapes, or a LibraryError naming them."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError as e:
        listed = " and ".join(str(tuple(s)) for s in shapes)
        raise op_error(op, f"cannot broadcast input shapes {listed}") from e


def size_of(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array of shape."""
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides that read a contiguous array of shape as out_shape (0 where broadcast)."""
    pad = len(out_shape) - len(shape)
    own = contiguous_strides(shape)
    return tuple(0 if i < pad or shape[i - pad] == 1 else own[i - pad]
                 for i in range(len(out_shape)))


# -- backends -----------------------------------------------------------------------------------

def array_module(backend: Any) -> Any:
    """numpy for the cpu backend, cupy for cuda (both share NumPy's API)."""
    if backend.name == "cuda":
        import cupy
        return cupy
    return np


def host_kernel(backend: Any, device_id: int, fn: Callable[..., None]) -> Callable[..., None]:
    """fn as is on cpu; on cuda, fn run with device_id current (cupy launches on that device)."""
    if backend.name != "cuda" or not hasattr(backend, "scope"):
        return fn

    def run(*arrays: Any) -> None:
        with backend.scope(device_id):
            fn(*arrays)
    return run


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


def check_cl_dtypes(op: str, backend: Any, device_id: int, dtypes: Sequence[str]) -> None:
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

    def __init__(self, backend: Any, device_id: int, source: str, entry: str, name: str) -> None:
        import pyopencl as cl
        self.queue = backend.queue(device_id)
        program = backend.program(device_id, source, name=name)
        self.kernel = cl.Kernel(program, entry)
        # NOTE: a zero-size array may have no buffer; kernels never read it, but OpenCL
        # wants a valid buffer object in every pointer slot.
        self._dummy = backend.alloc(device_id, 1)

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
                base = a.base_data
                out.append(base if base is not None else self._dummy)
                out.append(np.int64(a.offset))
        return out

    def launch(self, global_size: int, local_size: int | None, *arrays: Any) -> None:
        """Enqueue on global_size work items (rounded up to local_size or 64)."""
        if global_size <= 0:
            return
        step = local_size or 64
        padded = (global_size + step - 1) // step * step
        self.kernel(self.queue, (padded,), (local_size,) if local_size else None,
                    *self.args(arrays))


def device_array(backend: Any, device_id: int, host: np.ndarray) -> Any:
    """A device copy of a small host array (index tables, shapes), made once at prepare time."""
    host = np.ascontiguousarray(host)
    arr = backend.empty(device_id, host.shape, host.dtype)
    backend.from_host(host, arr)
    return arr


# Copies move bytes, so one kernel per element size serves every dtype.
_COPY_TYPES = {1: "uint8", 2: "int16", 4: "uint32", 8: "uint64"}


def cl_strided_copy(backend: Any, device_id: int, dtype: str, shape: Sequence[int],
                    src_strides: Sequence[int], dst_strides: Sequence[int],
                    name: str = "copy") -> Callable[..., None]:
    """copy(src, dst, src_start, dst_start) for every coordinate c of shape:
    dst[dst_start + c . dst_strides] = src[src_start + c . src_strides] (in elements; a stride
    may be 0 or negative).

    One generic OpenCL kernel per element size and rank serves transpose, slices, concatenate,
    split and pad; shape and strides go to the device once, here.
    """
    store = _COPY_TYPES[np.dtype(dtype).itemsize]
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


# -- elementwise expressions (fusable on GPUs) --------------------------------------------------

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


def gpu_elementwise(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
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
        return _cl_elementwise(backend, device_id, inputs, output, steps, name, siblings or {})
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


def _cl_elementwise(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
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


def _cuda_elementwise(backend: Any, device_id: int, inputs: Sequence[TensorSpec],
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
