"""Benchmark the device planner: pool bytes (no sharing / planned / peak-live bound) and plan time.

Runs on the example graphs in examples/graphs/ and on random graphs of 1,000 and 10,000 nodes,
each with everything on cpu and with a mixed cpu/opencl placement. Targets: planned pool bytes
within 10% of the peak-live lower bound, and planning under 1 s for 10,000 nodes.

    python bench/plan_memory.py [--sizes 1000 10000] [--seed 0] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from graph_runtime.graph.model import Graph
from graph_runtime.planner import plan_graph

ROOT = Path(__file__).resolve().parents[1]
REPEAT = 3
# Activation shapes like a small CNN's, so sizes differ the way real graphs' do.
SHAPES = [[1, 64, 56, 56], [1, 128, 28, 28], [1, 256, 14, 14], [1, 512, 7, 7], [1, 1000],
          [1, 64, 112, 112], [1, 32, 56, 56]]


def random_graph(num_nodes: int, seed: int) -> Graph:
    """A random DAG: 2% inputs, ops reading 1-3 of the 16 latest nodes, 1% of ops as outputs."""
    rng = random.Random(seed)
    nodes: list[dict[str, Any]] = []
    shapes: list[list[int]] = []
    for nid in range(num_nodes):
        if nid == 0 or rng.random() < 0.02:
            nodes.append({"op": "null", "name": f"in{nid}", "inputs": []})
        else:
            picks = sorted({rng.randrange(max(0, nid - 16), nid) for _ in range(rng.randint(1, 3))})
            nodes.append({"op": "tvm_op", "name": f"op{nid}", "inputs": [[p, 0, 0] for p in picks],
                          "attrs": {"func_name": f"fused_{rng.choice(['conv', 'add', 'relu'])}",
                                    "num_inputs": str(len(picks)), "num_outputs": "1",
                                    "flatten_data": "0"}})
        shapes.append(rng.choice(SHAPES))
    consumed = {ref[0] for node in nodes for ref in node["inputs"]}
    ops = [nid for nid, node in enumerate(nodes) if node["op"] != "null"]
    sampled = set(rng.sample(ops, len(ops) // 100))
    heads = sorted({nid for nid in ops if nid not in consumed} | sampled)
    return Graph.build(nodes, [[h, 0, 0] for h in heads], shapes=shapes, dtypes="float32")


def mixed_placement(g: Graph, seed: int) -> dict[str, Any]:
    """Ops pinned to cpu and opencl in alternating runs (about 20 runs), the rest free.

    Small graphs (the examples) get every op pinned; large ones 30% of them.
    """
    rng = random.Random(seed)
    run = max(1, g.num_nodes // 20)
    share = 1.0 if g.num_nodes < 100 else 0.3
    node_devices = {}
    for node in g.nodes:
        if not node.is_arg and rng.random() < share:
            node_devices[node.name] = "opencl:0" if (node.nid // run) % 2 else "cpu:0"
    return {"default_device": "cpu:0", "node_devices": node_devices}


def measure(name: str, g: Graph, placement: dict[str, Any] | None) -> dict[str, Any]:
    # The best of three runs: the machine may be shared, and the minimum is the planner's cost.
    runs = [plan_graph(g, placement) for _ in range(REPEAT)]
    result = min(runs, key=lambda r: r.seconds)
    stages = {name: min(r.stage_seconds[name] for r in runs) for name in result.stage_seconds}
    pools = result.pools.values()
    bound = sum(p.lower_bound for p in pools)
    after = sum(p.after for p in pools)
    return {"graph": name, "nodes": g.num_nodes, "placement": "mixed" if placement else "cpu",
            "copies": len(result.copies), "no_sharing": sum(p.no_sharing for p in pools),
            "after": after, "lower_bound": bound, "over_bound": after / bound - 1 if bound else 0.0,
            "seconds": result.seconds, "plan_seconds": sum(stages.values()) - stages["build"],
            "stages": stages,
            "per_device": {p.device.spec: {"no_sharing": p.no_sharing, "after": p.after,
                                           "lower_bound": p.lower_bound} for p in pools}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path,
                        default=ROOT / "bench" / "results" / "plan_memory.json")
    args = parser.parse_args(argv)
    cases: list[tuple[str, Graph]] = []
    for path in sorted((ROOT / "examples" / "graphs").glob("*/graph.json")):
        cases.append((path.parent.name, Graph.from_json(path)))
    for size in args.sizes:
        cases.append((f"random{size}", random_graph(size, args.seed)))
    rows = []
    for name, g in cases:
        rows.append(measure(name, g, None))
        rows.append(measure(name, g, mixed_placement(g, args.seed)))
    mib = 1024 * 1024
    print(f"{'graph':<16}{'nodes':>7}{'place':>7}{'copies':>8}{'no share MiB':>14}"
          f"{'after MiB':>11}{'bound MiB':>11}{'over':>8}{'plan s':>8}{'+build s':>9}")
    for r in rows:
        print(f"{r['graph']:<16}{r['nodes']:>7}{r['placement']:>7}{r['copies']:>8}"
              f"{r['no_sharing'] / mib:>14.1f}{r['after'] / mib:>11.1f}"
              f"{r['lower_bound'] / mib:>11.1f}{r['over_bound']:>8.1%}{r['plan_seconds']:>8.3f}"
              f"{r['seconds']:>9.3f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1))
    print(f"plan s: solve + copies + storage; +build s: total, with building and validating the "
          f"planned Graph (Graph.build); best of {REPEAT}.")
    worst = max(rows, key=lambda r: r["over_bound"])
    big = [r["plan_seconds"] for r in rows if r["nodes"] >= 10000]
    print(f"target 1, pool within 10% of the bound: worst {worst['over_bound']:.1%} "
          f"({worst['graph']}, {worst['placement']}): "
          f"{'met' if worst['over_bound'] <= 0.10 else 'MISSED'}")
    if big:
        print(f"target 2, plan under 1 s for 10,000 nodes: slowest {max(big):.3f} s: "
              f"{'met' if max(big) < 1.0 else 'MISSED'}")
    print(f"results in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
