"""Segmented runs: what a graph cut at data-dependent nodes costs per run against one static run.

Two onnx.helper models: NonZero followed by a gather and arithmetic, and a detection head
(TopK -> Gather -> NonMaxSuppression -> Gather -> RoiAlign). Each is imported once (its sizes
symbolic) and run segment by segment; the same graph with every size fixed to what the data
gave (count attrs and shapes made numbers: one static GraphModule, whose data-dependent kernels
check the count instead of cutting) is the baseline. Columns: a static run, a segmented run at a
size seen before (cached specialisations), and a run at a new size (specialising one segment).
Prints a table and writes bench/results/segments.json.
Usage: python bench/segments.py [--runs 200]
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
from onnx import TensorProto, helper

import graph_runtime as gr
from graph_runtime.frontend import import_onnx
from graph_runtime.graph.symbolic import evaluate

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def nonzero_model(n: int) -> Any:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"]),
             helper.make_node("GatherND", ["x", "idx"], ["picked"]),
             helper.make_node("Mul", ["picked", "picked"], ["sq"]),
             helper.make_node("Sqrt", ["sq"], ["y"])]
    graph = helper.make_graph(nodes, "nonzero", [helper.make_tensor_value_info("x", F32, [n, 64])],
                              [helper.make_tensor_value_info("y", F32, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def nonzero_feeds(seed: int, n: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((n, 64)).astype(np.float32)}


def head_model() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "frontend"))
    from test_detection import _head
    return _head(None)


def head_feeds(seed: int) -> dict[str, np.ndarray]:
    from test_detection import _crowded
    feeds = _crowded(seed)
    if seed:  # some boxes repeated: NMS keeps fewer, a new count to specialise for
        feeds["boxes"][:, :seed % 20] = feeds["boxes"][:, :1]
    return feeds


def _static(result: Any, env: dict[str, int]) -> tuple[str, Any]:
    """The imported graph and lib with every symbolic size replaced by its value in env."""
    def fix(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"dim"}:
            return evaluate(value["dim"], env)
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value
    graph = json.loads(result.graph_json)
    graph["attrs"]["shape"][1] = [[evaluate(d, env) for d in s]
                                  for s in graph["attrs"]["shape"][1]]
    from graph_runtime.lib.loader import module_from_json
    return json.dumps(graph), module_from_json(fix(result.lib_doc), "<static>")


def _median_run(module: Any, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        module.run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(model: Any, feeds: Any, runs: int) -> dict[str, Any]:
    result = import_onnx(model)
    segmented = gr.create(result.graph_json, result.module())
    segmented.load_params(result.params)
    segmented.run(**feeds(0))
    env = dict(segmented.env)
    graph_json, lib = _static(result, env)
    static = gr.create(graph_json, lib)
    static.load_params(result.params)
    static.run(**feeds(0))
    for i in range(segmented.get_num_outputs()):  # the same answer both ways
        np.testing.assert_array_equal(static.get_output(i).numpy(),
                                      segmented.get_output(i).numpy())
    new = []
    seen = {tuple(env.values())}
    for seed in range(1, 40):
        segmented.set_input(feeds(seed))
        start = time.perf_counter()
        segmented.run()
        spent = time.perf_counter() - start
        if tuple(segmented.env.values()) not in seen:
            seen.add(tuple(segmented.env.values()))
            new.append(spent)
    segmented.set_input(feeds(0))
    return {"sizes": env, "static_run_s": _median_run(static, runs),
            "segmented_run_s": _median_run(segmented, runs),
            "new_size_run_s": statistics.median(new) if new else None, "new_sizes": len(new),
            "cuts": segmented.describe_cuts()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    results = {"nonzero (64x64)": measure(nonzero_model(64), lambda s: nonzero_feeds(s, 64),
                                          args.runs),
               "detection head": measure(head_model(), head_feeds, args.runs)}
    print(f"{'model':<16} {'static run':>11} {'segmented':>11} {'per-run cost':>13} "
          f"{'new size':>10}")
    for name, r in results.items():
        extra = r["segmented_run_s"] - r["static_run_s"]
        new = f"{r['new_size_run_s'] * 1e3:8.2f}ms" if r["new_size_run_s"] else "     n/a"
        print(f"{name:<16} {r['static_run_s'] * 1e6:9.1f}us {r['segmented_run_s'] * 1e6:9.1f}us "
              f"{extra * 1e6:11.1f}us {new}")
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/segments.json", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
