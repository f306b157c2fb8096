"""Lib-file loading: `*.py` libs (run code), `*.json` libs (declarative), and the standard Module.

A `*.json` lib is validated by schemas/lib.schema.json and runs no Python code. Each function is
a chain of standard ops (`{"ops": [...]}` or the shorthand `{"op": NAME, ...attrs}`) or raw
kernel source (`{"kernel": {"opencl": {...}, "cuda": {...}}}`).

Raw kernels: arguments are one pointer per graph input, then one per graph output (each pointing
at the array's first element), then, when `"count"` is "int32" or "int64", the element count n of
output 0. `"global_size"` (default "n") is the number of work items: an integer or an integer
expression in n (`+ - * / %`, parentheses; `/` rounds down), e.g. "(n + 255) / 256 * 256".
`"local_size"` is the OpenCL work-group size (null lets the driver choose) or the CUDA block size
(default 256); CUDA launches ceil(global_size / local_size) blocks. Kernels must guard i < n.
"""
from __future__ import annotations

import ast
import json
import os
import runpy
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..backends import get_backend
from ..device import Device
from ..errors import LibraryError
from .chain import BACKEND_KINDS, Chain, Step
from .module import Module, TensorSpec
from .ops._common import check_attrs, size_of
from .registry import OPS, get_op, load_standard_ops

# Keys of an op entry that are not op attributes.
_OP_KEYS = ("op", "num_inputs", "devices", "description")


def load_module(path: str | os.PathLike[str]) -> Module:
    """Load a lib file: `*.py` (runs its code, takes its `lib` Module) or `*.json` (declarative)."""
    path = Path(path)
    if not path.is_file():
        raise LibraryError(f"lib file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".py":
        return _load_py(path)
    if suffix == ".json":
        return _load_json(path)
    raise LibraryError(f"lib file {str(path)!r}: expected a .py or .json file, got "
                       f"{suffix or 'no suffix'!r}")


def standard_module() -> Module:
    """Every standard op under its own name, for every backend that has its kernel."""
    load_standard_ops()
    lib = Module("standard")
    for name in sorted(OPS):
        chain = Chain(name, [Step(name)])
        for kind in chain.backends():
            lib.register(name, _function(chain), device=kind)
    return lib


def _function(obj: Chain | SourceKernel) -> Any:
    """obj as Module.register takes it: an object with prepare() stands in for a callable."""
    return obj


# -- *.py -----------------------------------------------------------------------------------------

def _load_py(path: Path) -> Module:
    # NOTE: like loading a .so, this runs the file's code with the caller's privileges.
    try:
        namespace = runpy.run_path(str(path), run_name=f"graph_runtime_lib_{path.stem}")
    except Exception as e:
        raise LibraryError(f"{path}: running the lib file raised {type(e).__name__}: {e}") from e
    lib = namespace.get("lib")
    if lib is None:
        raise LibraryError(f"{path}: a .py lib must define a module-level `lib = "
                           "graph_runtime.Module(...)`; no name `lib` found")
    if not isinstance(lib, Module):
        raise LibraryError(f"{path}: `lib` must be a graph_runtime.Module, got "
                           f"{type(lib).__name__}")
    lib.source = str(path)
    return lib


# -- *.json ---------------------------------------------------------------------------------------

_validator: Any = None


def _schema_validator() -> Any:
    global _validator
    if _validator is None:
        import jsonschema
        text = resources.files("graph_runtime.schemas").joinpath("lib.schema.json").read_text()
        _validator = jsonschema.Draft202012Validator(json.loads(text))
    return _validator


def json_path(parts: Sequence[Any]) -> str:
    """`$.functions.f.ops[1]` from a jsonschema error path."""
    text = "$"
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif str(part).isidentifier():
            text += f".{part}"
        else:
            text += f"[{json.dumps(part)}]"
    return text


def _load_json(path: Path) -> Module:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LibraryError(f"{path.name}: not valid JSON at line {e.lineno} column {e.colno}: "
                           f"{e.msg}") from e
    lib = module_from_json(doc, path.name)
    lib.source = str(path)
    return lib


def module_from_json(doc: Any, filename: str = "lib.json") -> Module:
    """A Module from a parsed lib document; errors name filename and the JSON path."""
    import jsonschema
    errors = list(_schema_validator().iter_errors(doc))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        raise LibraryError(f"{filename} at {json_path(error.absolute_path)}: "
                           f"{_schema_message(error)}")
    lib = Module(Path(filename).stem)
    for name, func in doc["functions"].items():
        where = f"{filename} at {json_path(['functions', name])}"
        if "kernel" in func:
            _add_source_function(lib, name, func, where)
        else:
            _add_chain_function(lib, name, func, where)
    return lib


def _schema_message(error: Any) -> str:
    message = error.message
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        message += "; allowed keys: " + ", ".join(allowed)
    return message


def function_from_json(name: str, func: Mapping[str, Any], where: str = "lib.json") -> Chain:
    """The Chain of one `{"ops": [...]}` or `{"op": ...}` function (checks op names and attrs)."""
    entries = func["ops"] if "ops" in func else [func]
    load_standard_ops()
    steps = []
    for k, entry in enumerate(entries):
        at = f"{where}.ops[{k}]" if "ops" in func else where
        op_name = entry["op"]
        if op_name not in OPS:
            raise LibraryError(f"{at}: unknown op {op_name!r}; known ops: "
                               + ", ".join(sorted(OPS)))
        op = get_op(op_name)
        attrs = {key: value for key, value in entry.items() if key not in _OP_KEYS}
        try:
            check_attrs(op_name, attrs, op.attrs)
        except LibraryError as e:
            raise LibraryError(f"{at}: {e}") from e
        count = entry.get("num_inputs")
        if count is not None and op.num_inputs is not None and count != op.num_inputs:
            raise LibraryError(f"{at}: num_inputs {count}: {op_name!r} always takes "
                               f"{op.num_inputs} input(s); num_inputs is for variadic ops")
        steps.append(Step(op_name, attrs, count))
    return Chain(name, steps)


def _add_chain_function(lib: Module, name: str, func: Mapping[str, Any], where: str) -> None:
    chain = function_from_json(name, func, where)
    supported = chain.backends()
    devices = func.get("devices")
    if devices is None:
        if not supported:
            raise LibraryError(f"{where}: no device kind has kernels for all of its ops "
                               f"{[s.op for s in chain.steps]}")
        devices = supported
    for i, kind in enumerate(devices):
        if kind not in supported:
            missing = [s.op for s in chain.steps if kind not in get_op(s.op).kernels]
            raise LibraryError(f"{where}.devices[{i}]: {kind!r} has no kernel for op(s) "
                               f"{', '.join(missing)}; this function can run on: "
                               f"{', '.join(supported) or 'nothing'}")
    for kind in devices:
        lib.register(name, _function(chain), device=kind)


def _add_source_function(lib: Module, name: str, func: Mapping[str, Any], where: str) -> None:
    sources = func["kernel"]
    devices = func.get("devices", [k for k in BACKEND_KINDS if k in sources])
    for i, kind in enumerate(devices):
        if kind not in sources:
            raise LibraryError(f"{where}.devices[{i}]: {kind!r} has no kernel source; this "
                               f"function has sources for: {', '.join(sources)}")
    for kind in devices:
        spec = sources[kind]
        at = f"{where}.kernel.{kind}"
        kernel = SourceKernel(name, kind, spec["source"], spec["entry"],
                              size_expression(spec.get("global_size", "n"), f"{at}.global_size"),
                              _local_size(spec.get("local_size"), f"{at}.local_size"),
                              spec.get("count"), tuple(spec.get("options", ())))
        lib.register(name, _function(kernel), device=kind)


def _local_size(value: Any, where: str) -> Callable[[int], int] | None:
    return None if value is None else size_expression(value, where)


_SIZE_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a // b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
}


def size_expression(value: int | str, where: str) -> Callable[[int], int]:
    """fn(n) for an integer or an expression in n; parsed here, never run as code."""
    if isinstance(value, int):
        return lambda n: value
    try:
        tree = ast.parse(value, mode="eval").body
    except SyntaxError as e:
        raise LibraryError(f"{where}: cannot parse size expression {value!r}: {e.msg}") from e

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.BinOp) and type(node.op) in _SIZE_OPS:
            check(node.left)
            check(node.right)
        elif isinstance(node, ast.Constant) and isinstance(node.value, int):
            pass
        elif not (isinstance(node, ast.Name) and node.id == "n"):
            raise LibraryError(f"{where}: size expression {value!r} may use only integers, n, "
                               "+ - * / % and parentheses")

    def evaluate(node: ast.AST, n: int) -> int:
        if isinstance(node, ast.BinOp):
            return _SIZE_OPS[type(node.op)](evaluate(node.left, n), evaluate(node.right, n))
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, int)  # check() let only ints through
            return node.value
        return n

    check(tree)
    return lambda n: evaluate(tree, n)


class SourceKernel:
    """A raw OpenCL C / CUDA C kernel from a lib.json, launched over a size computed from n."""

    def __init__(self, name: str, kind: str, source: str, entry: str,
                 global_size: Callable[[int], int], local_size: Callable[[int], int] | None,
                 count: str | None, options: tuple[str, ...]) -> None:
        self.name = name
        self.kind = kind
        self.source = source
        self.entry = entry
        self.global_size = global_size
        self.local_size = local_size
        self.count = count
        self.options = options

    def prepare(self, device: Device, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                attrs: Mapping[str, Any]) -> Callable[..., None]:
        n = size_of(outputs[0].shape) if outputs else 0
        total = self.global_size(n)
        group = self.local_size(n) if self.local_size is not None else None
        if total < 0 or (group is not None and group <= 0):
            raise LibraryError(f"{self.name}: launch shape global {total}, local {group} for "
                               f"n = {n}: sizes must be positive")
        tail = [] if self.count is None else [np.dtype(self.count).type(n)]
        backend = get_backend(device)
        if self.kind == "opencl":
            return self._prepare_opencl(backend, device.device_id, len(inputs) + len(outputs),
                                        total, group, tail)
        return self._prepare_cuda(backend, device.device_id, total, group or 256, tail)

    def _prepare_opencl(self, backend: Any, device_id: int, arrays: int, total: int,
                        group: int | None, tail: list[Any]) -> Callable[..., None]:
        import pyopencl as cl
        program = backend.program(device_id, self.source, list(self.options), name=self.name)
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

    def _prepare_cuda(self, backend: Any, device_id: int, total: int, block: int,
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
