"""Warm start: the wall time of fresh `graphrun run` processes of an imported model, and where
it goes; with --fresh, the first run of an empty environment (every cache empty) too.

Warm means the second and later process starts: numba's cache, the generated chains, the
tuning cache and Python's bytecode already filled. The model comes from
bench/transformers_models.py (made with --torch-python when missing) and is imported once into
~/.cache/graph_runtime/bench_warm_start/NAME. Each round runs one `graphrun run DIR` (the
headline: process wall time, median of rounds) and one process of this script's --phases mode,
which does what the command does step by step with a clock between steps: interpreter start,
imports, lib, create, params, first run (and within it oneDNN's weight packing and numba's
loading of cached code), then a second run. Python's bytecode goes to a folder in the bench
cache (PYTHONPYCACHEPREFIX) even where PYTHONDONTWRITEBYTECODE is set, as an installed package
has it. Run it unniced with `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`; say the load average.

An imported folder of another model (`graphrun import x.onnx -o DIR`) is timed the same way
with --folder DIR (say ResNet-50, whose warm start has no numba kernel to set up).

Usage: python bench/warm_start.py [--model bert_base] [--folder DIR] [--rounds 7] [-d cpu]
                                  [--fresh] [--baseline OTHER_CHECKOUT]
                                  [--torch-python /path/to/python] [--json OUT.json]
"""
from __future__ import annotations

import time

_START = time.time()  # the --phases child's first clock: as early as Python lets us read it

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BENCH_CACHE = Path.home() / ".cache" / "graph_runtime"
MODELS = BENCH_CACHE / "bench_transformers"
IMPORTED = BENCH_CACHE / "bench_warm_start"
SERIAL = ["start", "imports", "lib", "create", "params", "run1", "exit"]  # one after another
PHASES = SERIAL + ["pack", "numba", "run2"]


def _env(extra: dict[str, str] | None = None, root: Path = ROOT) -> dict[str, str]:
    """The child's environment: graph_runtime from root, bytecode kept in the bench cache."""
    env = dict(os.environ, PYTHONPATH=str(root))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(IMPORTED / "pycache")
    env.update(extra or {})
    return env


def ensure_model(name: str, torch_python: str | None) -> Path:
    """The exported ONNX file, made by bench/transformers_models.py when missing."""
    path = MODELS / f"{name}.onnx"
    if path.is_file():
        return path
    if torch_python is None:
        sys.exit(f"{path} is missing: give --torch-python (a Python with torch and transformers) "
                 f"or run bench/transformers_models.py --only {name}")
    subprocess.run([torch_python, str(ROOT / "bench" / "transformers_models.py"), "--only", name],
                   check=True)
    return path


def ensure_imported(name: str, model: Path) -> Path:
    """The folder `graphrun import` wrote for model (again when the model is newer)."""
    folder = IMPORTED / name
    graph = folder / "graph.json"
    if not graph.is_file() or graph.stat().st_mtime < model.stat().st_mtime:
        subprocess.run([sys.executable, str(ROOT / "cli.py"), "import", str(model), "-o",
                        str(folder), "--force"], check=True, env=_env(), stdout=subprocess.DEVNULL)
    return folder


def run_command(folder: Path, devices: list[str], env: dict[str, str],
                root: Path = ROOT) -> float:
    """Wall seconds of one `graphrun run folder` process (root's cli.py)."""
    flags = [x for d in devices for x in ("-d", d)]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(root / "cli.py"), "run", str(folder), *flags],
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"graphrun run {folder} failed:\n{done.stdout}{done.stderr}")
    return seconds


def run_phases(folder: Path, devices: list[str], env: dict[str, str]) -> dict[str, float]:
    """One --phases child's seconds per step."""
    done = subprocess.run([sys.executable, __file__, "--phases", str(folder), "--spawned",
                           repr(time.time()), *[x for d in devices for x in ("-d", d)]],
                          env=env, capture_output=True, text=True)
    ended = time.time()
    if done.returncode != 0:
        sys.exit(f"--phases {folder} failed:\n{done.stdout}{done.stderr}")
    seconds = json.loads(done.stdout.splitlines()[-1])
    seconds["exit"] = ended - seconds.pop("end")
    return seconds


class _Clock:
    """Seconds per step, and time spent inside wrapped functions."""

    def __init__(self, spawned: float) -> None:
        self.seconds = {"start": _START - spawned}
        self.last = time.perf_counter() - (time.time() - _START)

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = now - self.last
        self.last = now

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        inner = getattr(owner, attr)
        self.seconds.setdefault(name, 0.0)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
        setattr(owner, attr, timed)


def phases_child(folder: Path, spawned: float, devices: list[str]) -> None:
    """What `graphrun run folder` does (cli/job.py's job_from_files, then one run), timed."""
    clock = _Clock(spawned)
    import graph_runtime as gr
    from graph_runtime.cli import app  # noqa: F401  (the command's imports)
    from graph_runtime.cli import job
    clock.lap("imports")
    files = job.resolve_files(folder)
    graph = gr.Graph.from_json(files.graph)
    params = gr.load_params_file(files.params, views=True)
    inputs = job.load_inputs(graph, files, [], 0, skip=list(params), draw=False)
    lib = gr.load_module(files.lib)
    clock.lap("lib")
    module = gr.create(graph, lib, job.parse_devices(devices))
    job.draw_missing(graph, inputs, 0, skip=list(params))
    clock.lap("create")
    module.load_params(params, source=os.fspath(files.params))
    module.set_input(inputs.values)
    clock.lap("params")
    from graph_runtime.lib.kernels.onednn import weights
    clock.wrap(weights.PackedWeight, "refresh", "pack")
    if "numba" in sys.modules:  # only a module that made numba kernels loaded numba
        from numba.core import dispatcher
        clock.wrap(dispatcher.Dispatcher, "_compile_for_args", "numba")
    else:
        clock.seconds["numba"] = 0.0
    module.run()
    module.get_output(0).numpy()
    clock.lap("run1")
    module.run()
    module.get_output(0).numpy()
    clock.lap("run2")
    clock.seconds["end"] = time.time()
    print(json.dumps(clock.seconds), flush=True)
    os._exit(0)  # as graphrun's main ends (cli/app.py): the exit step is then the same


def fresh(name: str, folder: Path, devices: list[str]) -> dict[str, float]:
    """First and second `graphrun run` in an environment whose caches start empty."""
    with tempfile.TemporaryDirectory(prefix="warm_start_") as tmp:
        env = _env({"GRAPH_RUNTIME_CACHE_DIR": tmp, "GRAPH_RUNTIME_TUNING_CACHE": tmp,
                    "NUMBA_CACHE_DIR": tmp, "PYTHONPYCACHEPREFIX": tmp})
        return {"fresh_s": run_command(folder, devices, env),
                "second_s": run_command(folder, devices, env)}


def _row(label: str, values: dict[str, list[float]]) -> str:
    cells = "".join(f"{statistics.median(values[p]):8.3f}" if p in values else f"{'-':>8}"
                    for p in PHASES)
    return f"{label:11}{cells}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append",
                        help="bench_transformers model name(s) (default bert_base)")
    parser.add_argument("--folder", action="append", type=Path, default=[],
                        help="an imported folder (graph.json, lib.json, params) to time too")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("-d", "--device", action="append", default=[],
                        help="as graphrun run's -d (default: its default, auto)")
    parser.add_argument("--fresh", action="store_true",
                        help="also time the first run of an environment with empty caches")
    parser.add_argument("--torch-python", help="a Python with torch and transformers, to "
                                               "export a missing model")
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. main's) whose "
                        "graphrun run is timed in the same rounds, interleaved")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--phases", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.phases is not None:
        phases_child(opts.phases, opts.spawned, opts.device)
        return
    results = []
    print(f"load average {os.getloadavg()}")
    names = opts.model or ([] if opts.folder else ["bert_base"])
    folders = [(name, ensure_imported(name, ensure_model(name, opts.torch_python)))
               for name in names] + [(str(path), path.resolve()) for path in opts.folder]
    for name, folder in folders:
        result: dict[str, Any] = {"model": name}
        if opts.fresh:
            result.update(fresh(name, folder, opts.device))
            print(f"{name}: fresh environment {result['fresh_s']:.2f} s, its second run "
                  f"{result['second_s']:.2f} s", flush=True)
        roots = {"this": ROOT}
        if opts.baseline is not None:
            roots["baseline"] = opts.baseline.resolve()
        for root in roots.values():
            run_command(folder, opts.device, _env(root=root), root)  # fills the caches
        walls: dict[str, list[float]] = {label: [] for label in roots}
        steps: dict[str, dict[str, list[float]]] = {label: {} for label in roots}
        for _ in range(opts.rounds):
            for label, root in roots.items():  # interleaved: the machine's load hits both
                walls[label].append(run_command(folder, opts.device, _env(root=root), root))
                for key, value in run_phases(folder, opts.device, _env(root=root)).items():
                    steps[label].setdefault(key, []).append(value)
        result.update(walls=walls, steps=steps)
        results.append(result)
        print(f"{name}: warm graphrun run, {opts.rounds} processes each, interleaved")
        for label in roots:
            times = walls[label]
            print(f"  {label:9} median {statistics.median(times):.3f} s (min {min(times):.3f}, "
                  f"max {max(times):.3f})")
        print("  --phases processes, median seconds per step (pack and numba are inside run1):")
        print(f"{'':11}" + "".join(f"{p:>8}" for p in PHASES))
        for label in roots:
            print(_row(f"  {label}", steps[label]))
        for label in roots:
            totals = [sum(values) for values in zip(*(steps[label][p] for p in SERIAL))]
            print(f"  {label}: sum of {'+'.join(SERIAL)}: median "
                  f"{statistics.median(totals):.3f} s")
    print(f"load average {os.getloadavg()}")
    if opts.json:
        opts.json.write_text(json.dumps({"results": results, "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
