"""Lib files: .py libs, .json libs (chains, shorthand), schema errors with JSON paths, devices."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graph_runtime as gr
from graph_runtime.backends import get_backend
from graph_runtime.errors import LibraryError
from graph_runtime.lib import Module, load_module, standard_module
from graph_runtime.lib.chain import Chain
from graph_runtime.lib.library import TensorSpec


def _write_json(tmp_path: Path, functions: dict[str, Any], **top: Any) -> Path:
    doc = {"format": "graph_runtime.lib", "version": 1, "functions": functions, **top}
    path = tmp_path / "lib.json"
    path.write_text(json.dumps(doc))
    return path


def _run(lib: Module, name: str, backend_name: str, inputs: list[np.ndarray],
         out: TensorSpec) -> np.ndarray:
    backend = get_backend(backend_name)
    dev = gr.device(backend_name)
    run = lib.prepare(name, dev, [TensorSpec(a.shape, str(a.dtype)) for a in inputs], [out])
    arrays = []
    for host in inputs:
        arr = backend.empty(0, host.shape, host.dtype)
        backend.from_host(host, arr)
        arrays.append(arr)
    result = backend.empty(0, out.shape, out.dtype)
    run(*arrays, result)
    backend.sync(0)
    return backend.to_host(result)


def test_py_lib_runs_code_and_takes_lib(tmp_path: Path) -> None:
    path = tmp_path / "mylib.py"
    path.write_text("import numpy as np\nimport graph_runtime as gr\n"
                    "from graph_runtime.lib import Module\n"
                    "lib = Module('mylib')\n"
                    "@lib.register('plus_one', device='cpu')\n"
                    "def plus_one(x, out):\n    np.add(x, 1, out=out)\n")
    lib = load_module(path)
    assert lib.source == str(path)
    x = np.arange(4, dtype=np.float32)
    got = _run(lib, "plus_one", "cpu", [x], TensorSpec((4,), "float32"))
    np.testing.assert_array_equal(got, x + 1)


@pytest.mark.parametrize("body,message", [
    ("x = 1\n", "must define a module-level `lib"),
    ("lib = 42\n", "`lib` must be a graph_runtime.Module, got int"),
    ("raise ValueError('boom')\n", "running the lib file raised ValueError: boom"),
])
def test_py_lib_errors_name_the_file(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.py"
    path.write_text(body)
    with pytest.raises(LibraryError, match="bad.py") as info:
        load_module(path)
    assert message in str(info.value)


def test_missing_file_and_wrong_suffix(tmp_path: Path) -> None:
    with pytest.raises(LibraryError, match="does not exist"):
        load_module(tmp_path / "nope.json")
    other = tmp_path / "lib.so"
    other.write_bytes(b"\0")
    with pytest.raises(LibraryError, match=r"expected a \.py or \.json file, got '\.so'"):
        load_module(other)


def test_json_chain_shorthand_and_default_devices(tmp_path: Path, backend_name: str) -> None:
    path = _write_json(tmp_path, {
        "fused": {"ops": [{"op": "multiply"}, {"op": "add"}, {"op": "relu"}]},
        "mysub": {"op": "subtract"},
        "tp": {"op": "transpose", "axes": [1, 0], "devices": ["cpu", "opencl"]},
    })
    lib = load_module(path)
    assert lib.devices_for("fused") == ["cpu", "cuda", "opencl"]
    assert lib.devices_for("tp") == ["cpu", "opencl"]
    a = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    b = np.float32(3) * a[::-1].copy()
    c = np.ones((3,), np.float32)
    spec = TensorSpec((2, 3), "float32")
    got = _run(lib, "fused", backend_name, [a, b, c], spec)
    np.testing.assert_allclose(got, np.maximum(a * b + c, 0), rtol=1e-6)
    np.testing.assert_allclose(_run(lib, "mysub", backend_name, [a, b], spec), a - b)
    if backend_name != "cuda":
        got = _run(lib, "tp", backend_name, [a], TensorSpec((3, 2), "float32"))
        np.testing.assert_array_equal(got, a.T)


def test_devices_restriction_is_enforced(tmp_path: Path) -> None:
    lib = load_module(_write_json(tmp_path, {"r": {"op": "relu", "devices": ["opencl"]}}))
    spec = [TensorSpec((2,), "float32")]
    with pytest.raises(LibraryError, match="no function 'r' for cpu; it exists for: opencl"):
        lib.prepare("r", gr.cpu(), spec, spec)


@pytest.mark.parametrize("functions,where,message", [
    ({"f": {"ops": [{"op": "multiply"}, {"op": "relux"}]}}, "$.functions.f.ops[1]",
     "unknown op 'relux'; known ops: abs, "),
    ({"f": {"ops": [{"op": "relu"}, {"opx": "relu"}]}}, "$.functions.f.ops[1]",
     "missing key 'op'; required keys: op"),
    ({"f": {"op": "transpose", "axis": [1, 0]}}, "$.functions.f",
     "transpose: unknown attribute 'axis'; it accepts: axes"),
    ({"f": {"ops": [], "devices": ["cpu"]}}, "$.functions.f.ops",
     "expected at least 1 items, got 0"),
    ({"f": {"op": "relu", "devices": ["cpu", "gpu"]}}, "$.functions.f.devices[1]",
     'expected one of cpu, cuda, opencl, got "gpu"'),
    ({"f": {"ops": [{"op": "relu"}], "extra": 1}}, "$.functions.f",
     "unknown key 'extra'; allowed keys: ops, devices, description"),
    ({"f": {"kernel": {"opencl": {"source": "x"}}}}, "$.functions.f.kernel.opencl",
     "missing key 'entry'; required keys: source, entry"),
    ({"f": {"kernel": {"metal": {"source": "x", "entry": "k"}}}}, "$.functions.f.kernel",
     "unknown key 'metal'; allowed keys: opencl, cuda"),
    ({"f": {"kernel": {"opencl": {"source": "x", "entry": "k", "global_size": "n ** 2"}}}},
     "$.functions.f.kernel.opencl.global_size", "may use only integers, n"),
    ({"f": {"kernel": {"opencl": {"source": "x", "entry": "k"}}, "devices": ["cuda"]}},
     "$.functions.f.devices[0]", "'cuda' has no kernel source; this function has sources for: "
     "opencl"),
    ({"f": {"description": "no body"}}, "$.functions.f", "missing key 'op'; required keys: op; "
     'a function is {"ops": [...]}, {"op": NAME, ...attrs} or {"kernel": {...}}'),
    ({"f": {"kernel": {}}}, "$.functions.f.kernel", "expected at least 1 key, got {}"),
    ({"f": {"kernel": {"opencl": {"source": "x", "entry": "2x"}}}},
     "$.functions.f.kernel.opencl.entry", "expected a C identifier (the __kernel function's "
     'name), got "2x"'),
    ({"f": {"op": "add", "num_inputs": 3}}, "$.functions.f",
     "num_inputs 3: 'add' always takes 2 input(s)"),
])
def test_json_errors_give_json_path(tmp_path: Path, functions: dict[str, Any], where: str,
                                    message: str) -> None:
    path = _write_json(tmp_path, functions)
    with pytest.raises(LibraryError) as info:
        load_module(path)
    text = str(info.value)
    assert text.startswith(f"lib.json at {where}: "), text
    assert message in text, text


def test_json_top_level_errors(tmp_path: Path) -> None:
    path = _write_json(tmp_path, {}, extra=1)
    with pytest.raises(LibraryError, match=r"lib.json at \$: unknown key 'extra'; allowed keys: "
                                           "format, version, description, functions"):
        load_module(path)
    path.write_text('{"format": "graph_runtime.lib", "version": 2, "functions": {}}')
    with pytest.raises(LibraryError, match=r"lib.json at \$.version: expected 1, got 2"):
        load_module(path)
    path.write_text('{"format": ')
    with pytest.raises(LibraryError, match="lib.json: not valid JSON at line 1"):
        load_module(path)


def test_standard_module_has_every_op_for_every_backend() -> None:
    lib = standard_module()
    for name in ("add", "relu", "sum", "argmax", "transpose", "concatenate", "take", "cast"):
        assert lib.devices_for(name) == ["cpu", "cuda", "opencl"], name
        assert isinstance(lib.get_function(name, gr.cpu()), Chain)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = _run(lib, "sum", "cpu", [x], TensorSpec((), "float32"))
    assert float(got) == 15.0


# ---- inputs that used to escape as tracebacks (issue 13) -----------------------------------------

@pytest.mark.parametrize("content, message", [
    (b'{"format": "graph_runtime.lib", \xff}', r"lib.json: not UTF-8 text \(byte 32"),
    (b"[" * 100_000, r"lib.json: (JSON nested too deeply|not valid JSON)"),
    (b'{"version": ' + b"9" * 5000 + b"}",
     r"lib.json: not valid JSON: an integer of 5000 digits \(at most 4300\)$"),
])
def test_unreadable_lib_json_is_a_library_error(tmp_path: Path, content: bytes,
                                                message: str) -> None:
    path = tmp_path / "lib.json"
    path.write_bytes(content)
    with pytest.raises(LibraryError, match=message):
        load_module(path)


@pytest.mark.parametrize("functions, where, expected", [
    ({"cat": {"ops": [{"op": "concatenate", "num_inputs": 1.0}]}},
     r"\.functions\.cat\.ops\[0\]\.num_inputs", "a count"),
    # issue 30: JSON Schema's "integer" takes 64.0, which then reached len() (a TypeError)
    ({"k": {"kernel": {"opencl": {"source": "x", "entry": "k", "local_size": 64.0}}}},
     r"\.functions\.k\.kernel\.opencl\.local_size", "a work-group size"),
    ({"k": {"kernel": {"cuda": {"source": "x", "entry": "k", "global_size": 64.0}}}},
     r"\.functions\.k\.kernel\.cuda\.global_size", "a work size"),
])
def test_integers_must_be_ints_not_floats(tmp_path: Path, functions: dict[str, Any], where: str,
                                          expected: str) -> None:
    path = _write_json(tmp_path, functions)
    with pytest.raises(LibraryError, match=rf"lib.json at \${where}: expected {expected} .*, got "
                                           r"number (1|64)\.0$"):
        load_module(path)
    path = _write_json(tmp_path, {}, version=1.0)
    with pytest.raises(LibraryError, match=r"lib.json at \$.version: expected integer, got "
                                           r"number 1\.0"):
        load_module(path)


def test_load_module_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(LibraryError, match="needs the path of a .py or .json lib file, got None"):
        load_module(None)  # type: ignore[arg-type]
    with pytest.raises(LibraryError, match="is a directory; give the lib.json or lib.py inside it"):
        load_module(tmp_path)


def test_a_lib_py_calling_sys_exit_is_a_library_error(tmp_path: Path) -> None:
    path = tmp_path / "lib.py"
    path.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(LibraryError, match=r"called sys.exit\(3\) while loading"):
        load_module(path)


def test_a_lib_json_that_passed_the_schema_is_not_checked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import subprocess
    import sys
    from graph_runtime.lib import loader
    from graph_runtime.settings import CACHE_DIR
    monkeypatch.setenv(CACHE_DIR.name, str(tmp_path / "cache"))
    path = _write_json(tmp_path, {"f": {"op": "relu"}})
    checked: list[str] = []
    check = loader.check_schema
    monkeypatch.setattr(loader, "check_schema", lambda doc, name: checked.append(name) or
                        check(doc, name))
    assert "f" in load_module(path) and checked == ["lib.json"]
    assert "f" in load_module(path) and checked == ["lib.json"]  # remembered
    # a new process loads it without importing jsonschema
    program = ("import sys; from graph_runtime.lib import load_module; "
               f"load_module({str(path)!r}); print('jsonschema' in sys.modules)")
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=root), timeout=120, check=True)
    assert done.stdout.strip() == "False", done.stderr
    # any change to the text is checked again, and an error still names the JSON path
    path.write_text(path.read_text().replace('"relu"}', '"relu", "bogus": [1]}'))
    with pytest.raises(LibraryError, match="functions"):
        load_module(path)
    assert checked == ["lib.json", "lib.json"]


@pytest.mark.parametrize("dim, message", [
    ("seq % 0", "dim 'seq % 0' divides by '0', which is always 0"),
    ("seq seq", "dim 'seq seq': not an expression"),
    ("?", "'?' has no value here"),
    (None, "expected an int or an expression such as \"seq*4\", got None"),
    (["seq"], "got ['seq']"),
])
def test_symbolic_attrs_are_checked_at_load(tmp_path: Path, dim: Any, message: str) -> None:
    path = _write_json(tmp_path, {"r": {"ops": [{"op": "reshape",
                                                 "newshape": [1, {"dim": dim}]}]}})
    with pytest.raises(LibraryError) as info:
        load_module(path)
    text = str(info.value)
    assert text.startswith("lib.json at $.functions.r.ops[0].newshape[1].dim: "), text
    assert message in text, text
