"""`python cli.py run ...` from a checkout that was never installed: the package and its schemas
come from the checkout's folders alone.

How the never-installed checkout is simulated, and why this way:

The test venv has graph_runtime installed in editable mode. That install puts a finder on
sys.meta_path (from an `__editable__*.pth` file) which maps `graph_runtime` onto some checkout and
`graph_runtime.schemas` onto that checkout's top-level schemas/ folder, so in the venv the schemas
are importable as package data even where a bare checkout has none. `python -I` would not help:
it implies -E (PYTHONPATH ignored) and -P (the script's folder dropped from sys.path), which
would leave exactly that editable finder to find the package.

Instead the child runs the real command line, `python -s cli.py run examples/graphs/mlp -d cpu`,
from the repository root, with PYTHONPATH = a temporary hooks folder, then the checkout root. The
hooks folder holds a sitecustomize.py (imported by `site` after every .pth file ran) that
  * removes the editable install's finders from sys.meta_path and sys.path_hooks;
  * puts first on sys.meta_path a finder that finds `graph_runtime` only in the folders
    PYTHONPATH names (so a regular, non-editable install in site-packages is hidden too) and
    refuses `graph_runtime.schemas` (and anything under it) with ModuleNotFoundError, as on a
    machine where the package data was never installed;
  * reports at exit, on stderr, which file `graph_runtime` was imported from, how many times
    `graph_runtime.schemas` was asked for, and which *.schema.json files were opened (an audit
    hook on "open"), so the test can check the simulation held and the schema came from the
    checkout's schemas/ folder.
Third-party packages (numpy, click, jsonschema) still come from the venv's site-packages, as they
would for someone who installed the dependencies but not this package. -s keeps the user's own
site-packages out. The checkout files themselves are used unchanged.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SITECUSTOMIZE = '''\
"""Makes this interpreter see a never-installed checkout (see tests/cli/test_checkout_entry.py)."""
import atexit
import os
import sys
from importlib.machinery import PathFinder

# Only the folders PYTHONPATH names may provide graph_runtime (this hooks folder, the checkout).
ALLOWED = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _editable(obj):
    return (getattr(obj, "__module__", None) or "").startswith("__editable__")


class CheckoutOnly:
    """graph_runtime only from PYTHONPATH's folders; graph_runtime.schemas never (no package
    data was installed)."""

    schemas_asked = 0

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname == "graph_runtime.schemas" or fullname.startswith("graph_runtime.schemas."):
            cls.schemas_asked += 1
            raise ModuleNotFoundError(f"No module named {fullname!r} (never installed)",
                                      name=fullname)
        if fullname == "graph_runtime":
            spec = PathFinder.find_spec(fullname, ALLOWED)
            if spec is None:
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return spec
        return None


SCHEMA_FILES = []


def _audit(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].endswith(".schema.json"):
        SCHEMA_FILES.append(args[0])


sys.addaudithook(_audit)
sys.meta_path[:] = [CheckoutOnly] + [f for f in sys.meta_path if not _editable(f)]
sys.path_hooks[:] = [h for h in sys.path_hooks if not _editable(h)]
sys.path_importer_cache.clear()


@atexit.register
def _report():
    module = sys.modules.get("graph_runtime")
    where = getattr(module, "__file__", None) if module is not None else None
    print(f"checkout-entry: graph_runtime from {where}; "
          f"graph_runtime.schemas asked {CheckoutOnly.schemas_asked}", file=sys.stderr)
    print(f"checkout-entry: schema files read: {', '.join(SCHEMA_FILES) or 'none'}",
          file=sys.stderr)
'''


def run_python(args: list[str], cwd: Path, env: dict[str, str]
               ) -> subprocess.CompletedProcess[str]:
    """`python -s ARGS` in cwd; the caller checks the exit status and output."""
    return subprocess.run([sys.executable, "-s", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture
def checkout_env(tmp_path: Path) -> dict[str, str]:
    """The child's environment: hooks folder, then the checkout root, on PYTHONPATH only."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join([str(hooks), str(ROOT)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_simulation_hides_every_installed_copy(checkout_env: dict[str, str],
                                               tmp_path: Path) -> None:
    """Without the checkout on sys.path, graph_runtime cannot be imported at all; with it,
    graph_runtime comes from the checkout and graph_runtime.schemas is refused."""
    hooks_only = dict(checkout_env, PYTHONPATH=checkout_env["PYTHONPATH"].split(os.pathsep)[0])
    hidden = run_python(["-c", "import graph_runtime"], tmp_path, hooks_only)
    assert hidden.returncode != 0
    assert "No module named 'graph_runtime'" in hidden.stderr
    probe = ("import importlib, graph_runtime\n"
             "print(graph_runtime.__file__)\n"
             "try:\n"
             "    importlib.import_module('graph_runtime.schemas')\n"
             "except ModuleNotFoundError:\n"
             "    print('schemas refused')\n")
    seen = run_python(["-c", probe], tmp_path, checkout_env)
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.splitlines() == [str(ROOT / "graph_runtime" / "__init__.py"),
                                        "schemas refused"]


def test_cli_py_runs_mlp_from_a_never_installed_checkout(checkout_env: dict[str, str]) -> None:
    """`python cli.py run examples/graphs/mlp -d cpu` exits 0 and matches expected.npz."""
    result = run_python(["cli.py", "run", "examples/graphs/mlp", "-d", "cpu"], ROOT, checkout_env)
    assert result.returncode == 0, result.stdout + result.stderr
    ok_lines = [line for line in result.stdout.splitlines()
                if line.startswith("expected   OK: every output matches "
                                   "examples/graphs/mlp/expected.npz")]
    assert len(ok_lines) == 1, result.stdout
    report = [line for line in result.stderr.splitlines() if line.startswith("checkout-entry:")]
    # lib.json was validated with the checkout's schemas/ folder; the package data was never
    # asked for
    package = ROOT / "graph_runtime" / "__init__.py"
    schema = ROOT / "schemas" / "lib.schema.json"
    assert report == [f"checkout-entry: graph_runtime from {package}; "
                      + "graph_runtime.schemas asked 0",
                      f"checkout-entry: schema files read: {schema}"], result.stderr
    assert "Traceback" not in result.stderr
