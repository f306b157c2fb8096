"""Lib-file loading: `*.py` libs (run code), `*.json` libs (declarative), and the standard Module.

A `*.json` lib is validated by schemas/lib.schema.json and runs no Python code. Each function is
a chain of standard ops (`{"ops": [...]}` or the shorthand `{"op": NAME, ...attrs}`) or raw
kernel source (`{"kernel": {"opencl": {...}, "cuda": {...}}}`, see source_kernel.py).
"""
from __future__ import annotations

import json
import os
import runpy
from pathlib import Path
from typing import Any, Mapping

from ..errors import LibraryError
from ..graph.model import json_value_error
from ..graph.schema import describe, json_path, validator
from .attrs import check_attrs
from .chain import Chain, Step
from . import schema_passed
from .library import Module
from .registry import OPS, get_op, load_standard_ops
from .source_kernel import SourceKernel, add_source_function
from .symbolic_chain import SymbolicChain, check_dim_attrs, is_symbolic_attr

# Keys of an op entry that are not op attributes.
_OP_KEYS = ("op", "num_inputs", "devices", "description")


def load_module(path: str | os.PathLike[str]) -> Module:
    """Load a lib file: `*.py` (runs its code, takes its `lib` Module) or `*.json` (declarative)."""
    if not isinstance(path, (str, os.PathLike)):
        raise LibraryError(f"load_module needs the path of a .py or .json lib file, got "
                           f"{type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        raise LibraryError(f"lib file {str(path)!r} is a directory; give the lib.json or lib.py "
                           "inside it")
    if not path.exists():
        raise LibraryError(f"lib file {str(path)!r} does not exist")
    if not path.is_file():
        raise LibraryError(f"lib file {str(path)!r} is not a regular file (a FIFO or device?)")
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


def _function(obj: Chain | SymbolicChain | SourceKernel) -> Any:
    """obj as Module.register takes it: an object with prepare() stands in for a callable."""
    return obj


# -- *.py -----------------------------------------------------------------------------------------

def _load_py(path: Path) -> Module:
    # NOTE: like loading a .so, this runs the file's code with the caller's privileges.
    try:
        namespace = runpy.run_path(str(path), run_name=f"graph_runtime_lib_{path.stem}")
    except SystemExit as e:
        # NOTE: a lib calling sys.exit must not end the caller's process (graphrun exited 3).
        raise LibraryError(f"{path}: the lib file called sys.exit({e.code!r}) while loading; a "
                           "lib must define `lib`, not exit") from e
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

def _load_json(path: Path) -> Module:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise LibraryError(f"{path.name}: not UTF-8 text (byte {e.start}: {e.reason})") from e
    except OSError as e:
        raise LibraryError(f"{path.name}: cannot read: {e.strerror or e}") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise LibraryError(f"{path.name}: not valid JSON at line {e.lineno} column {e.colno}: "
                           f"{e.msg}") from e
    except RecursionError as e:
        raise LibraryError(f"{path.name}: JSON nested too deeply to read") from e
    except ValueError as e:  # an integer of more than 4300 digits
        raise LibraryError(f"{path.name}: not valid JSON: {json_value_error(e)}") from e
    checked = schema_passed.passed(text)
    if not checked:
        check_schema(doc, path.name)
        schema_passed.remember(text)
    lib = module_from_json(doc, path.name, schema_checked=True)
    lib.source = str(path)
    return lib


def check_schema(doc: Any, filename: str = "lib.json") -> None:
    """LibraryError naming filename and the JSON path where doc breaks lib.schema.json (an
    integer must be written as one: 64.0 is refused, as TVM's JSON reader refuses it)."""
    import jsonschema
    try:
        errors = list(validator("lib.schema.json").iter_errors(doc))
    except RecursionError as e:
        raise LibraryError(f"{filename}: JSON nested too deeply to check") from e
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        message = describe(error, doc, filename)
        if error.validator == "required" and len(error.absolute_path) == 2:
            # NOTE: the schema reads a function without "ops" or "kernel" as the one-op form.
            message += ('; a function is {"ops": [...]}, {"op": NAME, ...attrs} or '
                        '{"kernel": {...}}')
        raise LibraryError(message)


def module_from_json(doc: Any, filename: str = "lib.json", schema_checked: bool = False) -> Module:
    """A Module from a parsed lib document; errors name filename and the JSON path.

    schema_checked: doc is known to pass lib.schema.json (schema_passed.py), not checked again.
    """
    if not schema_checked:
        check_schema(doc, filename)
    lib = Module(Path(filename).stem)
    for name, func in doc["functions"].items():
        where = f"{filename} at {json_path(['functions', name])}"
        if "kernel" in func:
            add_source_function(lib, name, func, where)
        else:
            _add_chain_function(lib, name, func, where)
    return lib


def function_from_json(name: str, func: Mapping[str, Any], where: str = "lib.json") -> Chain:
    """The Chain of one `{"ops": [...]}` or `{"op": ...}` function (checks op names and attrs)."""
    entries = func["ops"] if "ops" in func else [func]
    load_standard_ops()
    steps = []
    for k, entry in enumerate(entries):
        at = f"{where}.ops[{k}]" if "ops" in func else where
        op_name = entry["op"]
        op = OPS.get(op_name)
        if op is None:
            raise LibraryError(f"{at}: unknown op {op_name!r}; known ops: "
                               + ", ".join(sorted(OPS)))
        attrs = {key: value for key, value in entry.items() if key not in _OP_KEYS}
        try:
            check_attrs(op_name, attrs, op.attrs)
        except LibraryError as e:
            raise LibraryError(f"{at}: {e}") from e
        count = entry.get("num_inputs")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)):
            # NOTE: JSON Schema's "integer" takes 1.0; the chain needs a Python int.
            raise LibraryError(f"{at}: num_inputs {count!r}: expected an integer such as 2")
        if count is not None and op.num_inputs is not None and count != op.num_inputs:
            raise LibraryError(f"{at}: num_inputs {count}: {op_name!r} always takes "
                               f"{op.num_inputs} input(s); num_inputs is for variadic ops")
        steps.append(Step(op_name, attrs, count))
    return Chain(name, steps)


def _add_chain_function(lib: Module, name: str, func: Mapping[str, Any], where: str) -> None:
    entries = func["ops"] if "ops" in func else [func]
    chain: Chain | SymbolicChain
    if any(is_symbolic_attr(v) for e in entries for v in e.values()):
        check_dim_attrs(entries, where, "ops" in func)
        chain = SymbolicChain(name, entries,
                              lambda n, doc: function_from_json(n, doc, where))
    else:
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
