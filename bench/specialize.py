"""Specialisation cost: BERT-tiny / GPT-2-tiny imported once without --shape, new shapes timed.

The models (tests/data/onnx/{bert,gpt2}_dyn.onnx, dims batch and seq) are imported once; the
first shape pays the one-time kernel compilation (compiled chains, cached on disk), then each
new (batch, seq) is specialised once (shape inference, storage plan, kernels prepared) and timed
from the module's own count, its first run against its warm runs (issue 32: at most 3x); a run at
a cached shape is timed against a static module's run(). Prints a table and writes
bench/results/specialize.json.
Usage: python bench/specialize.py [--shapes 12] [--models bert gpt2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

import graph_runtime as gr
from graph_runtime.frontend import from_onnx

MODELS = Path(__file__).resolve().parents[1] / "tests" / "data" / "onnx"


def feeds(model: str, batch: int, seq: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seq).integers(0, 100, (batch, seq)).astype(np.int64)
    if model == "bert":
        return {"input_ids": ids, "attention_mask": np.ones((batch, seq), np.int64)}
    return {"input_ids": ids}


def measure(model: str, count: int) -> dict[str, float]:
    start = time.perf_counter()
    graph_json, lib, params = from_onnx(MODELS / f"{model}_dyn.onnx")
    import_s = time.perf_counter() - start
    module = gr.create(graph_json, lib)
    module.load_params(params)
    start = time.perf_counter()
    module.run(**feeds(model, 1, 8))
    first_s = time.perf_counter() - start
    shapes = [(1 + k % 4, 9 + 9 * k) for k in range(count)]  # every one new, seq up to 128
    each, ratios = [], []
    for batch, seq in shapes:
        before = module.specialize_seconds
        inputs = feeds(model, batch, seq)
        start = time.perf_counter()
        module.run(**inputs)
        first = time.perf_counter() - start
        each.append(module.specialize_seconds - before)
        ratios.append(first / statistics.median(_timed(module.run) for _ in range(5)))
    batch, seq = shapes[-1]
    inputs = feeds(model, batch, seq)
    static_json, static_lib, static_params = from_onnx(
        MODELS / f"{model}_dyn.onnx", shape={k: v.shape for k, v in inputs.items()})
    static = gr.create(static_json, static_lib)
    static.load_params(static_params)
    static.set_input(**inputs)
    module.set_input(**inputs)
    cached = statistics.median(_timed(module.run) for _ in range(50))
    plain = statistics.median(_timed(static.run) for _ in range(50))
    return {"import_s": import_s, "first_run_s": first_s, "specialise_median_s":
            statistics.median(each), "specialise_max_s": max(each), "shapes": len(each),
            "first_over_warm_median": statistics.median(ratios),
            "first_over_warm_max": max(ratios),
            "cached_run_s": cached, "static_run_s": plain, "specializations":
            module.specializations}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=12)
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2"])
    args = parser.parse_args()
    results = {m: measure(m, args.shapes) for m in args.models}
    print(f"{'model':<6} {'import':>8} {'1st run':>8} {'new shape (median/max)':>23} "
          f"{'1st/warm (median/max)':>22} {'cached run':>11} {'static run':>11}")
    for name, r in results.items():
        print(f"{name:<6} {r['import_s']:7.2f}s {r['first_run_s']:7.2f}s "
              f"{r['specialise_median_s'] * 1e3:10.1f} / {r['specialise_max_s'] * 1e3:5.1f} ms "
              f"{r['first_over_warm_median']:14.1f} / {r['first_over_warm_max']:5.1f} "
              f"{r['cached_run_s'] * 1e3:9.2f}ms {r['static_run_s'] * 1e3:9.2f}ms")
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/specialize.json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
