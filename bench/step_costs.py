"""Where a run's time goes between its steps: each step timed in the run, and alone, against ONNX
Runtime's time by op.

A small model's steps can each match ONNX Runtime's nodes while its call is slower: the time is
lost between the steps (the interpreter's objects and each kernel's data come back to the cores
after the step before pushed them out; docs/measurements.md). This bench measures that gap
directly. For each model it runs `run_with(**feeds)` back to back (--calls times) with every
step of the executor's run called from Python (no replay: runtime/native_runs.py) and timed
where it stands, then each step alone in a loop of the same calls on the same arrays, and
prints per step: the time in the run, alone, and the difference. Then the totals: the steps in
the run and alone, `run()` and `run_with` (inputs copied in and outputs out) as the module runs
(its replays, where it has them), and ONNX Runtime's call (default session options,
bench/peers.py) with its profiler's time summed by op type (which carries the profiler's own
few microseconds a node).
A step alone reads its operands from the cache its last call filled: for a product whose weight
outgrows a core's cache (a decoder's), its difference holds the weight's stream from memory as
well, not only what is lost between steps.

A model is an ONNX file, imported with graphrun's frontend (graph_runtime.frontend.from_onnx);
its symbolic dims take the values given with --dim (a KV-cache decoder at one past length:
`--dim batch=1 seq=1 past=100 total=101`). Inputs are bench/peers.py's random_feeds. The
in-run timing wraps the executor's step calls for the measured calls only, and puts them back.

Run as users' machines are:
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/step_costs.py MODEL.onnx
      [--dim NAME=N ...] [--calls 300] [--top 25]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure the checkout this script sits in
import graph_runtime as gr  # noqa: E402
from graph_runtime.frontend import from_onnx  # noqa: E402
from interleave import SETTLE_S  # noqa: E402  (bench/)
from peers import (DEFAULT, machine_line, onnxruntime_sessions, profile_by_op,  # noqa: E402
                   profiled_session, random_feeds)


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def timed_calls(call: Callable[[], Any], calls: int) -> list[float]:
    """Seconds of each of calls back-to-back calls (after a few untimed ones)."""
    for _ in range(min(10, calls)):
        call()
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds


def in_run(executor: Any, run: Callable[[], Any], calls: int) -> list[list[float]]:
    """Each step call's seconds at each of calls runs, timed where it stands in the run."""
    clock = time.perf_counter
    steps = list(executor._calls)
    seconds: list[list[float]] = [[] for _ in steps]

    def timed(index: int, fn: Callable[..., Any]) -> Callable[..., None]:
        def call(*args: Any) -> None:
            start = clock()
            fn(*args)
            seconds[index].append(clock() - start)
        return call
    executor._calls = [(timed(i, fn), args) for i, (fn, args) in enumerate(steps)]
    native, executor.native = executor.native, None  # every step called, to be timed
    try:
        for _ in range(calls):
            run()
    finally:
        executor._calls, executor.native = steps, native
    return seconds


def alone(executor: Any, calls: int) -> list[float]:
    """Each step call's median seconds in a loop of its own, on the run's arrays (in the run's
    order: a step reading what the one before wrote reads it as the last run left it)."""
    found = []
    for fn, args in executor._calls:
        found.append(statistics.median(timed_calls(lambda: fn(*args), calls)))
    return found


def report(path: Path, dims: dict[str, int], calls: int, top: int) -> None:
    sessions = onnxruntime_sessions(path)
    feeds = random_feeds(sessions[DEFAULT], dims=dims)
    graph, lib, params = from_onnx(str(path))
    module = gr.create(graph, lib, gr.cpu(0))
    module.load_params(params)
    module.run_with(**feeds)
    executor = module.executor
    labels = [step.label for step in executor._call_steps]
    kinds = [type(fn).__name__ for fn, _ in executor._calls]
    whole = timed_calls(lambda: module.run_with(**feeds), calls)
    runs = timed_calls(module.run, calls)
    placed = [median_us(s) for s in in_run(executor, lambda: module.run_with(**feeds), calls)]
    single = [s * 1e6 for s in alone(executor, calls)]
    time.sleep(SETTLE_S)
    peer = timed_calls(lambda: sessions[DEFAULT].run(None, feeds), calls)
    time.sleep(SETTLE_S)
    profiled = profiled_session(path)
    for _ in range(calls):
        profiled.run(None, feeds)
    by_op = profile_by_op(profiled)

    print(f"\n{path.name}: {len(labels)} steps, {calls} calls each way")
    order = sorted(range(len(labels)), key=lambda i: placed[i] - single[i], reverse=True)
    print(f"{'in run us':>10} {'alone us':>9} {'between':>8}  step (kernel)")
    for i in order[:top]:
        print(f"{placed[i]:10.1f} {single[i]:9.1f} {placed[i] - single[i]:8.1f}  "
              f"{labels[i]} ({kinds[i]})")
    if len(order) > top:
        print(f"  ... {len(order) - top} more steps")
    native = executor.native
    replayed = (f"{native.replayed} of {len(labels)} steps replayed in {len(native.replays)} "
                f"calls" if native is not None else f"no replay ({executor.native_reason})")
    print(f"steps: {sum(placed):.1f} us in the run, {sum(single):.1f} alone (each called from "
          f"Python); run() {median_us(runs):.1f} us, run_with {median_us(whole):.1f} us "
          f"({replayed}); ONNX Runtime's call {median_us(peer):.1f} us ({DEFAULT}: default "
          f"session options)")
    total = sum(seconds for seconds, _ in by_op.values())
    shown = ", ".join(f"{op} {seconds * 1e6:.0f} ({count})" for op, (seconds, count) in
                      sorted(by_op.items(), key=lambda kv: -kv[1][0]))
    print(f"ONNX Runtime's profiler by op, us (nodes): {total * 1e6:.0f} in all: {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help="ONNX files")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                        help="the value of a symbolic dim of the models' inputs")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=25, help="steps listed, most lost first")
    opts = parser.parse_args()
    dims = {}
    for item in opts.dim:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise SystemExit(f"--dim {item!r}: expected NAME=N with N a whole number")
        dims[name] = int(value)
    print(machine_line())
    for path in opts.models:
        report(path, dims, opts.calls, opts.top)


if __name__ == "__main__":
    main()
