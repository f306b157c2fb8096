"""Executor overhead: a chain of tiny adds through GraphModule.run() vs a plain NumPy loop.

The NumPy loop makes the same np.add calls on preallocated arrays: the Python floor. Prints a
table (medians over repeats, per-node cost, ratio) and writes bench/results/executor_overhead.json.
Usage: python bench/executor_overhead.py [--nodes 1000] [--repeat 30]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np

import graph_runtime as gr
from graph_runtime._timing import time_runs


def _no_sync() -> None:
    """CPU-only contenders: nothing to wait for."""


def chain_graph(n: int, width: int) -> dict:
    """x, y inputs; node k = add(node k-1, y); storage ping-pongs between two ids."""
    nodes = [{"op": "null", "name": "x", "inputs": []}, {"op": "null", "name": "y", "inputs": []}]
    prev = 0
    for k in range(n):
        nodes.append({"op": "tvm_op", "name": f"add{k}", "inputs": [[prev, 0, 0], [1, 0, 0]],
                      "attrs": {"func_name": "add", "num_inputs": "2", "num_outputs": "1",
                                "flatten_data": "0"}})
        prev = len(nodes) - 1
    entries = len(nodes)
    return {"nodes": nodes, "arg_nodes": [0, 1], "heads": [[prev, 0, 0]],
            "node_row_ptr": list(range(entries + 1)),
            "attrs": {"dltype": ["list_str", ["float32"] * entries],
                      "shape": ["list_shape", [[width]] * entries],
                      "storage_id": ["list_int", [0, 1] + [2 + (k % 2) for k in range(n)]]}}


def median_seconds(fn, repeat: int, number: int) -> float:
    return statistics.median(time_runs(fn, _no_sync, repeat, number).results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--number", type=int, default=10)
    args = parser.parse_args()

    m = gr.create(chain_graph(args.nodes, args.width), None, gr.cpu())
    x = np.ones(args.width, "float32")
    y = np.full(args.width, 0.5, "float32")
    m.set_input(x=x, y=y)
    m.run()

    # The floor: the same np.add calls over preallocated arrays, in a plain loop.
    bufs = [np.empty(args.width, "float32") for _ in range(2)]
    triples = []
    prev = x
    for k in range(args.nodes):
        out = bufs[k % 2]
        triples.append((prev, y, out))
        prev = out

    def floor() -> None:
        for a, b, out in triples:
            np.add(a, b, out=out)

    add = np.add

    def floor_positional() -> None:
        for a, b, out in triples:
            add(a, b, out)

    floor()
    np.testing.assert_allclose(m.get_output(0).numpy(), bufs[(args.nodes - 1) % 2], rtol=1e-5)
    rounds = []
    for _ in range(5):  # interleave so machine noise hits every contender alike
        rounds.append((median_seconds(floor, args.repeat, args.number),
                       median_seconds(floor_positional, args.repeat, args.number),
                       median_seconds(m.run, args.repeat, args.number)))
    t_kw, t_pos, t_ours = (statistics.median(r[i] for r in rounds) for i in range(3))
    t_floor = min(t_kw, t_pos)
    n = args.nodes
    print(f"chain of {n} tiny adds (shape ({args.width},) float32); medians of "
          f"{args.repeat}x{args.number} runs, 5 interleaved rounds")
    print(f"{'what':<34} {'per run (us)':>13} {'per node (ns)':>14} {'vs floor':>9}")
    for label, t in (("numpy loop, np.add(a, b, out=out)", t_kw),
                     ("numpy loop, add(a, b, out)", t_pos), ("GraphModule.run()", t_ours)):
        print(f"{label:<34} {t * 1e6:13.1f} {t / n * 1e9:14.1f} {t / t_floor:9.2f}")
    print(f"run() overhead per node over the faster floor: {(t_ours - t_floor) / n * 1e9:.1f} ns")
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/executor_overhead.json", "w", encoding="utf-8") as f:
        json.dump({"nodes": n, "floor_kwarg_s": t_kw, "floor_positional_s": t_pos,
                   "run_s": t_ours, "ratio": t_ours / t_floor}, f, indent=2)


if __name__ == "__main__":
    main()
