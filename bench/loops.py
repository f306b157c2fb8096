"""What a Loop with scan outputs costs per run: its count known at import (onnx_loop, one static
graph) or decided by the body's condition (onnx_loop_dynamic: the graph cut at the Loop, the
loop run on the host, the rest specialised per count), against ONNX Runtime on the same model.

Both models: an accumulator of 64 floats, a scan output of each step, a sum after the loop. The
static one runs `n` iterations from a constant trip count; the dynamic one has a trip count of
10,000 and stops when the accumulator's sum passes a limit chosen so that it runs `n`. Rounds
interleave every contender (bench/interleave.py); medians of all samples. ONNX Runtime with its
default threads and with one thread; the ratio is against the faster.
Usage: python bench/loops.py [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from interleave import interleaved_samples
from peers import DEFAULT, ONE_THREAD, onnxruntime_sessions
from onnx import TensorProto, helper

import graph_runtime as gr
from graph_runtime.frontend import import_onnx

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
WIDTH = 64


def loop_model(n: int, dynamic: bool) -> Any:
    info = helper.make_tensor_value_info
    nodes = [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
             helper.make_node("Mul", ["acc_out", "x"], ["step"])]
    if dynamic:
        nodes += [helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
                  helper.make_node("Less", ["total", "limit"], ["go"])]
    else:
        nodes.append(helper.make_node("Identity", ["c"], ["go"]))
    body = helper.make_graph(nodes, "body", [info("i", I64, []), info("c", B, []),
                                             info("acc_in", F, [WIDTH])],
                             [info("go", B, []), info("acc_out", F, [WIDTH]),
                              info("step", F, [WIDTH])])
    trips = onnx.numpy_helper.from_array(np.array(10_000 if dynamic else n, np.int64), "trips")
    inits = [trips, onnx.numpy_helper.from_array(np.array([0], np.int64), "axis0"),
             onnx.numpy_helper.from_array(np.array(True), "c0")]
    if dynamic:
        # sum(acc) after k steps is k * WIDTH (x = 1): stop once it reaches n * WIDTH
        inits.append(onnx.numpy_helper.from_array(np.array(n * WIDTH - 0.5, np.float32),
                                                  "limit"))
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "c0", "acc0"], ["acc", "steps"], body=body),
         helper.make_node("ReduceSum", ["steps", "axis0"], ["y"], keepdims=0)], "loop",
        [info("acc0", F, [WIDTH]), info("x", F, [WIDTH])],
        [info("acc", F, [WIDTH]), info("y", F, [WIDTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    feeds = {"acc0": np.zeros(WIDTH, np.float32), "x": np.ones(WIDTH, np.float32)}
    rows = []
    for n in (8, 64):
        for dynamic in (False, True):
            model = loop_model(n, dynamic)
            result = import_onnx(model)
            module = gr.create(result.graph_json, result.module())
            module.load_params(gr.save_param_dict(result.params))
            ours = module.run_with(**feeds)
            peers = onnxruntime_sessions(model.SerializeToString())
            sessions = {"ort": peers[DEFAULT], "ort_1t": peers[ONE_THREAD]}
            want = sessions["ort"].run(None, feeds)
            for got, ref in zip(ours, want):
                np.testing.assert_allclose(got, ref, rtol=1e-6)
            calls = {"graph_runtime": lambda: module.run_with(**feeds)}
            calls.update({k: (lambda s=s: s.run(None, feeds)) for k, s in sessions.items()})
            samples = interleaved_samples(calls, args.rounds, 5, 20)
            med = {k: statistics.median(v) for k, v in samples.items()}
            best = min(med["ort"], med["ort_1t"])
            rows.append({"iterations": n, "kind": "onnx_loop_dynamic" if dynamic else "onnx_loop",
                         "ms": med["graph_runtime"] * 1e3, "ort_ms": med["ort"] * 1e3,
                         "ort_1t_ms": med["ort_1t"] * 1e3, "ratio": med["graph_runtime"] / best,
                         "us_per_iteration": med["graph_runtime"] * 1e6 / n})
    print(f"{'iters':>5} {'op':<18} {'ms':>8} {'ort ms':>8} {'ort 1t':>8} {'ratio':>6} "
          f"{'us/iter':>8}")
    for r in rows:
        print(f"{r['iterations']:>5} {r['kind']:<18} {r['ms']:>8.3f} {r['ort_ms']:>8.3f} "
              f"{r['ort_1t_ms']:>8.3f} {r['ratio']:>6.2f} {r['us_per_iteration']:>8.1f}")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "loops.json").write_text(json.dumps({"rows": rows, "load": os.getloadavg()},
                                               indent=1) + "\n")


if __name__ == "__main__":
    main()
