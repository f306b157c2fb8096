"""A server's stream: one model imported once without --shape, fed requests of varying shapes.

The model (default: the LLaMA-style decoder bench/dynamic_models.py exports as llama_ts, with
dynamic batch and seq) is imported once; 40 requests of lengths 9-300 and batch 1-4 (seeded) are
run through one module created for the stream, against ONNX Runtime with default session options
and with one thread (bench/peers.py), each contender running the whole stream in turn with a
pause between them, over several rounds (a fresh module per round, so every round pays the new
shapes again; the tuning file is whatever the machine has). Every answer is compared with ONNX
Runtime's. Then, per shape, the first run against the warm runs, and for three shapes the
imported-once module's warm run against a module imported at that static shape (interleaved).

Prints ONNX Runtime's absolute times and the load; writes bench/results/stream.json.
--busy-core keeps one core busy with a spinning process meanwhile (issue 33's neighbour: oneDNN's
policy then runs the runtime's workers).
Usage: python bench/stream.py [--model PATH] [--requests 40] [--rounds 3] [--busy-core]
"""
from __future__ import annotations

import argparse
import json
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
from graph_runtime.frontend import import_onnx  # noqa: E402
from import_once import import_timed  # noqa: E402  (bench/)
from interleave import settle, interleaved_samples  # noqa: E402  (bench/)
from peers import DEFAULT, busy_core, machine_line, onnxruntime_sessions  # noqa: E402  (bench/)

DEFAULT_MODEL = Path.home() / ".cache" / "graph_runtime" / "bench_dynamic" / "llama_ts.onnx"
WARM_REPEAT = 5  # samples per round of the warm-vs-static comparison


def requests(count: int, seed: int = 0) -> list[tuple[int, int]]:
    """(batch, seq) per request: lengths 9-300, batch 1-4; a few shapes come back, as in a
    server."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, int]] = []
    for _ in range(count):
        if out and rng.random() < 0.2:
            out.append(out[int(rng.integers(len(out)))])
        else:
            out.append((int(rng.integers(1, 5)), int(rng.integers(9, 301))))
    return out


def feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(batch * 1000 + seq).integers(0, 2000, (batch, seq))
    mask = np.ones((batch, seq), np.int64)
    if batch > 1:
        mask[1, seq * 3 // 4:] = 0  # one padded sequence
    return {"input_ids": ids.astype(np.int64), "attention_mask": mask}


def create(graph_json: str, lib: Any, params: dict) -> Any:
    module = gr.create(graph_json, lib)
    module.load_params(params)
    return module


def ours_call(module: Any, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """One request as ONNX Runtime's session.run(None, feeds) is one: inputs set, run, the
    output returned as a host array of the caller's own (run_with)."""
    return module.run_with(**inputs)[0]


def _rounds(samples: list[float], repeat: int) -> list[list[float]]:
    """interleaved_samples' samples of one contender, split into its rounds."""
    return [samples[i:i + repeat] for i in range(0, len(samples), repeat)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "stream.json")
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy with a spinning child process meanwhile")
    opts = parser.parse_args()
    with busy_core(opts.busy_core):
        _bench(opts)
    if opts.busy_core:
        print("one core was kept busy by a spinning process")


def _bench(opts: argparse.Namespace) -> None:
    result = import_timed(opts.model)
    graph_json, lib, params = result.graph_json, result.module(), result.params
    stream = requests(opts.requests)
    inputs = [feeds(b, s) for b, s in stream]
    sessions = onnxruntime_sessions(opts.model)
    expected = [sessions[DEFAULT].run(None, x)[0] for x in inputs]

    totals: dict[str, list[float]] = {"graph_runtime": [], **{k: [] for k in sessions}}
    first_runs: list[float] = []  # seconds, per request that met a new shape (first round)
    worst = 0.0
    for round_ in range(opts.rounds):
        for name in totals:
            settle()
            if name == "graph_runtime":
                module = create(graph_json, lib, params)
                seen: set[tuple[int, int]] = set()
                total = 0.0  # the calls' own times: the answers are checked outside them
                for shape, x, want in zip(stream, inputs, expected):
                    t = time.perf_counter()
                    got = ours_call(module, x)
                    elapsed = time.perf_counter() - t
                    total += elapsed
                    if round_ == 0 and shape not in seen:
                        first_runs.append(elapsed)
                    seen.add(shape)
                    worst = max(worst, float(np.max(np.abs(got - want))))
                totals[name].append(total)
                del module  # its garbage collected by the next settle(), outside the timing
            else:
                session = sessions[name]
                total = 0.0
                for x in inputs:
                    t = time.perf_counter()
                    session.run(None, x)
                    total += time.perf_counter() - t
                totals[name].append(total)
    peer = min(statistics.median(totals[k]) for k in sessions)
    ours = statistics.median(totals["graph_runtime"])
    print(f"\nstream of {len(stream)} requests ({len(set(stream))} shapes), "
          f"{opts.rounds} rounds, max |ours - ORT| = {worst:.2e}")
    for name, values in totals.items():
        print(f"  {name:24s} median {statistics.median(values):7.2f} s   "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    print(f"  ratio to ONNX Runtime's faster setting: {ours / peer:.2f}x")

    # Per shape: first run (a fresh module) against that shape's warm runs.
    module = create(graph_json, lib, params)
    per_shape = []
    for shape in list(dict.fromkeys(stream))[:12]:
        x = feeds(*shape)
        t = time.perf_counter()
        ours_call(module, x)
        first = time.perf_counter() - t
        warm = []
        for _ in range(5):
            t = time.perf_counter()
            ours_call(module, x)
            warm.append(time.perf_counter() - t)
        per_shape.append({"shape": shape, "first_ms": first * 1e3,
                          "warm_ms": statistics.median(warm) * 1e3,
                          "warm_max_ms": max(warm) * 1e3})
    print("\n  (batch, seq)   first ms   warm ms (median / max)   first/warm")
    for row in per_shape:
        print(f"  {str(tuple(row['shape'])):13s} {row['first_ms']:9.1f}   "
              f"{row['warm_ms']:8.1f} / {row['warm_max_ms']:6.1f}        "
              f"{row['first_ms'] / row['warm_ms']:6.1f}x")

    # Warm runs: the imported-once module against a module imported at that static shape.
    statics = []
    for shape in [(1, 32), (2, 128), (4, 300)]:
        x = feeds(*shape)
        static = import_onnx(opts.model, shape={k: list(v.shape) for k, v in x.items()})
        static_module = create(static.graph_json, static.module(), static.params)
        # NOTE: 12 rounds of 5 samples of 2 calls: with 5 rounds of 3 single calls the ratio
        # swung 0.85-1.21 between runs on the 2-core machine (docs/measurements.md)
        samples = interleaved_samples({"symbolic": lambda: ours_call(module, x),
                                       "static": lambda: ours_call(static_module, x)},
                                      rounds=12, repeat=WARM_REPEAT, number=2)
        sym, sta = (statistics.median(samples[k]) for k in ("symbolic", "static"))
        per_round = [statistics.median(a) / statistics.median(b) for a, b in zip(
            _rounds(samples["symbolic"], WARM_REPEAT),
            _rounds(samples["static"], WARM_REPEAT))]
        statics.append({"shape": shape, "symbolic_ms": sym * 1e3, "static_ms": sta * 1e3,
                        "round_ratios": per_round})
        print(f"  warm {shape}: imported once {sym * 1e3:.2f} ms, static {sta * 1e3:.2f} ms, "
              f"ratio {sym / sta:.3f} (rounds {min(per_round):.2f}-{max(per_round):.2f})")
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps({
        "machine": machine_line(), "load": os.getloadavg()[0], "model": opts.model.name,
        "busy_core": opts.busy_core,
        "stream": stream, "totals_s": totals, "ratio": ours / peer, "max_abs_diff": worst,
        "first_runs_s": first_runs, "per_shape": per_shape, "static": statics}, indent=1))
    print(f"wrote {opts.json}")


if __name__ == "__main__":
    main()
