"""One model, two modules in one process: A with the settings as they are, B made with overrides.

Settings are read when a module makes its kernels, so B is created with the overrides in the
environment and A without; then windows of run() calls alternate between them (A first in even
windows, B first in odd ones) and the result is the median over windows of B's median over A's
in the same window. Both modules share the process, the machine's load and the VM's spell (its
two vCPUs near or far apart on the host: docs/measurements.md), so a 2-3% difference reads
clearly where separate processes or separate bench runs differ by 30%. The outputs must agree.
Only settings read when kernels are made take: those a process holds once or reads at each run
(GRAPH_RUNTIME_ONEDNN_THREADS, GRAPH_RUNTIME_NUM_THREADS, GRAPH_RUNTIME_ONEDNN_PIN) are
compared in separate runs instead.
Run with `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` as on a user's machine.

Usage: python bench/ab_settings.py MODEL.onnx GRAPH_RUNTIME_X=value[,GRAPH_RUNTIME_Y=value]
                                   [--windows 12] [--runs 200] [--dim batch=1 ...]
(--dim: the value of a symbolic dim of a model exported with dynamic axes)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure the checkout this script sits in
import graph_runtime as gr  # noqa: E402
from peers import DEFAULT, machine_line, onnxruntime_sessions, random_feeds  # noqa: E402

PROCESS_WIDE = {"GRAPH_RUNTIME_ONEDNN_THREADS", "GRAPH_RUNTIME_NUM_THREADS",
                "GRAPH_RUNTIME_ONEDNN_PIN"}


def made_with(overrides: dict[str, str], make: Any) -> Any:
    """make() with the overrides in the environment, which is then as it was."""
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    try:
        return make()
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def window(module: Any, runs: int) -> float:
    """Median seconds of runs back-to-back run() calls (after five unmeasured)."""
    for _ in range(5):
        module.run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        module.run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("overrides", help="NAME=value[,NAME=value...] for module B")
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--runs", type=int, default=200, help="run() calls a window")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                        help="a symbolic dim's value (batch=1), for a model with dynamic axes")
    opts = parser.parse_args()
    try:
        dims = {name: int(value) for name, value in (d.split("=", 1) for d in opts.dim)}
    except ValueError:
        raise SystemExit(f"--dim takes NAME=N (batch=1), got {opts.dim}") from None
    overrides = dict(item.split("=", 1) for item in opts.overrides.split(","))
    unknown = [name for name in overrides if not name.startswith("GRAPH_RUNTIME_")]
    if unknown:
        raise SystemExit(f"not a graph_runtime setting: {', '.join(unknown)}")
    held = sorted(set(overrides) & PROCESS_WIDE)
    if held:
        raise SystemExit(f"{', '.join(held)}: held by the process or read at each run, not when "
                         "a module is made; compare it in separate runs")
    from graph_runtime.frontend import from_onnx
    feeds = random_feeds(onnxruntime_sessions(opts.model)[DEFAULT], pad_masks=True,
                         dims=dims)
    graph_json, lib, params = from_onnx(str(opts.model))

    def make() -> Any:
        module = gr.create(graph_json, lib)
        module.load_params(params)
        module.run(**feeds)
        return module
    a = make()
    b = made_with(overrides, make)
    error = max(float(np.abs(a.get_output(i).numpy() - b.get_output(i).numpy()).max())
                for i in range(a.get_num_outputs()))
    print(machine_line())
    times: dict[str, list[float]] = {"A": [], "B": []}
    for w in range(opts.windows):
        for name, module in (("A", a), ("B", b)) if w % 2 == 0 else (("B", b), ("A", a)):
            times[name].append(window(module, opts.runs))
    paired = statistics.median(y / x for x, y in zip(times["A"], times["B"]))
    print(f"{opts.model.name}: A (as set) {statistics.median(times['A']) * 1e6:.0f} us, "
          f"B ({opts.overrides}) {statistics.median(times['B']) * 1e6:.0f} us; "
          f"B / A paired by window {paired:.3f} over {opts.windows} windows; outputs differ "
          f"by at most {error:.1e}")
    print(machine_line())


if __name__ == "__main__":
    main()
