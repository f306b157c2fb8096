"""Raw-kernel lib functions: OpenCL C / CUDA C source from a lib.json, launched over a size in n.

Arguments are one pointer per graph input, then one per graph output (each pointing at the
array's first element), then, when `"count"` is "int32" or "int64", the element count n of
output 0. `"global_size"` (default "n") is the number of work items: an integer or an integer
expression in n (`+ - * / %`, parentheses; `/` rounds down), e.g. "(n + 255) / 256 * 256".
`"local_size"` is the OpenCL work-group size (null lets the driver choose) or the CUDA block size
(default 256); CUDA launches ceil(global_size / local_size) blocks. Kernels must guard i < n.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

import numpy as np

from ..backends import REGISTRY, get_backend
from ..backends.base import Backend
from ..device import Device
from ..errors import LibraryError
from .kernels.opencl.launch_checks import check_arguments, check_work_group
from .library import Module, TensorSpec
from .shapes import size_of

if TYPE_CHECKING:
    from ..backends.opencl import OpenCLBackend


def add_source_function(lib: Module, name: str, func: Mapping[str, Any], where: str) -> None:
    """Register a `{"kernel": {...}}` function of a lib.json for each device it names."""
    sources = func["kernel"]
    devices = func.get("devices", [k for k in REGISTRY if k in sources])
    for i, kind in enumerate(devices):
        if kind not in sources:
            raise LibraryError(f"{where}.devices[{i}]: {kind!r} has no kernel source; this "
                               f"function has sources for: {', '.join(sources)}")
    for kind in devices:
        spec = sources[kind]
        at = f"{where}.kernel.{kind}"
        global_size = size_expression(spec.get("global_size", "n"), f"{at}.global_size")
        local_size = _local_size(spec.get("local_size"), f"{at}.local_size")
        # Module.register takes an object with prepare() in place of a callable.
        kernel: Any = SourceKernel(name, kind, spec["source"], spec["entry"], global_size,
                                   local_size, spec.get("count"), tuple(spec.get("options", ())))
        lib.register(name, kernel, device=kind)


def _local_size(value: Any, where: str) -> Callable[[int], int] | None:
    return None if value is None else size_expression(value, where)


_SIZE_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a // b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
}


_MAX_EXPRESSION = 200


def size_expression(value: int | str, where: str) -> Callable[[int], int]:
    """fn(n) for an integer or an expression in n; parsed here, never run as code.

    A divisor that is 0 is refused here when it is a constant, else by fn for the n that makes
    it 0, with a LibraryError naming where, the expression, the divisor and n.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return lambda n: value
    if not isinstance(value, str):
        # NOTE: a lib built in Python skips the schema; 64.0 reached len() here.
        raise LibraryError(f"{where}: expected an integer such as 64 or an expression in n such "
                           f"as \"(n + 63) / 64 * 64\", got {type(value).__name__} {value!r}")
    if len(value) > _MAX_EXPRESSION:
        raise LibraryError(f"{where}: size expression of {len(value)} characters; at most "
                           f"{_MAX_EXPRESSION}")
    try:
        tree = ast.parse(value, mode="eval").body
    except SyntaxError as e:
        raise LibraryError(f"{where}: cannot parse size expression {value!r}: {e.msg}") from e
    except (RecursionError, MemoryError, ValueError) as e:
        raise LibraryError(f"{where}: cannot parse size expression {value!r}: "
                           f"{type(e).__name__}") from e

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.BinOp) and type(node.op) in _SIZE_OPS:
            check(node.left)
            check(node.right)
            if type(node.op) in _DIVISIONS and not _uses_n(node.right) \
                    and evaluate(node.right, 0) == 0:
                raise LibraryError(f"{where}: size expression {value!r} divides by "
                                   f"{ast.unparse(node.right)!r}, which is always 0")
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            pass
        elif not (isinstance(node, ast.Name) and node.id == "n"):
            raise LibraryError(f"{where}: size expression {value!r} may use only integers, n, "
                               "+ - * / % and parentheses")

    def evaluate(node: ast.AST, n: int) -> int:
        if isinstance(node, ast.BinOp):
            left = evaluate(node.left, n)
            right = evaluate(node.right, n)
            if right == 0 and type(node.op) in _DIVISIONS:
                raise LibraryError(f"{where}: size expression {value!r} divides by "
                                   f"{ast.unparse(node.right)!r}, which is 0 for n = {n}")
            return _SIZE_OPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, int)  # check() let only ints through
            return node.value
        return n

    check(tree)
    return lambda n: evaluate(tree, n)


_DIVISIONS = (ast.Div, ast.FloorDiv, ast.Mod)


def _uses_n(node: ast.AST) -> bool:
    return any(isinstance(sub, ast.Name) for sub in ast.walk(node))


_MAX_GROUP = 1024


@dataclass(eq=False)
class SourceKernel:
    """A raw OpenCL C / CUDA C kernel from a lib.json, launched over a size computed from n."""

    name: str
    kind: str
    source: str
    entry: str
    global_size: Callable[[int], int]
    local_size: Callable[[int], int] | None
    count: str | None
    options: tuple[str, ...]

    def prepare(self, device: Device, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                attrs: Mapping[str, Any]) -> Callable[..., None]:
        n = size_of(outputs[0].shape) if outputs else 0
        total = self.global_size(n)
        group = self.local_size(n) if self.local_size is not None else None
        if total < 0 or (group is not None and group <= 0):
            raise LibraryError(f"{self.name}: launch shape global {total}, local {group} for "
                               f"n = {n}: sizes must be positive")
        # A kernel guards i < n, so work items beyond the largest buffer (plus one work-group of
        # rounding) do nothing but take time, and 2^31 of them on 8 elements take many seconds.
        largest = max((size_of(t.shape) for t in [*inputs, *outputs]), default=0)
        limit = largest + max(group or 0, _MAX_GROUP)
        if total > limit or (group is not None and group > _MAX_GROUP):
            raise LibraryError(f"{self.name}: launch shape global {total}, local {group} for "
                               f"n = {n}: the global size may exceed the largest buffer "
                               f"({largest} elements) by at most one work-group (local at most "
                               f"{_MAX_GROUP})")
        tail = []
        if self.count is not None:
            info = np.iinfo(self.count)
            if n > info.max:
                raise LibraryError(f"{self.name}: the count n = {n} does not fit count "
                                   f"{self.count!r} (at most {info.max}); use 'int64'")
            tail.append(np.dtype(self.count).type(n))
        backend = get_backend(device)
        if self.kind == "opencl":
            return self._prepare_opencl(cast("OpenCLBackend", backend), device.device_id,
                                        len(inputs) + len(outputs),
                                        total, group, tail)
        return self._prepare_cuda(backend, device.device_id, total, group or 256, tail)

    def _prepare_opencl(self, backend: OpenCLBackend, device_id: int, arrays: int, total: int,
                        group: int | None, tail: list[Any]) -> Callable[..., None]:
        import pyopencl as cl
        options = list(self.options)
        if "-cl-kernel-arg-info" not in options:
            # NOTE: lets check_arguments read the declared argument types (metadata only).
            options.append("-cl-kernel-arg-info")
        program = backend.program(device_id, self.source, options, name=self.name)
        try:
            kernel = cl.Kernel(program, self.entry)
        except cl.Error as e:
            raise LibraryError(f"{self.name}: the OpenCL source has no kernel {self.entry!r} "
                               f"({e})") from e
        want = arrays + len(tail)
        if kernel.num_args != want:
            raise LibraryError(f"{self.name}: kernel {self.entry!r} takes {kernel.num_args} "
                               f"arguments, but the node passes {want} ({arrays} arrays"
                               f"{' and the count n' if tail else ''})")
        dev = backend.cl_device(device_id)
        where = f"{self.name}: kernel {self.entry!r} on opencl:{device_id} ({dev.name.strip()})"
        check_arguments(kernel, where, arrays, tail, self.count)
        if total:
            check_work_group(kernel, dev, where, total, group, options)
        queue = backend.queue(device_id)
        local = (group,) if group is not None else None
        subs: dict[tuple[int, int], Any] = {}

        def buffer(a: Any) -> Any:
            # NOTE: raw kernels take plain pointers, so an array at an offset gets a sub-buffer.
            if a.offset == 0 and a.base_data is not None:
                return a.base_data
            key = (a.base_data.int_ptr, a.offset)
            sub = subs.get(key)
            if sub is None:
                sub = a.base_data.get_sub_region(a.offset, max(a.nbytes, 1))
                subs[key] = sub
            return sub

        def run(*arrays: Any) -> None:
            if total:
                kernel(queue, (total,), local, *[buffer(a) for a in arrays], *tail)
        return run

    def _prepare_cuda(self, backend: Backend, device_id: int, total: int, block: int,
                      tail: list[Any]) -> Callable[..., None]:
        import cupy
        with backend.scope(device_id):
            kernel = cupy.RawKernel(self.source, self.entry, options=self.options)
            kernel.compile()
        grid = (total + block - 1) // block

        def run(*arrays: Any) -> None:
            if grid:
                with backend.scope(device_id):
                    kernel((grid,), (block,), (*arrays, *tail))
        return run

