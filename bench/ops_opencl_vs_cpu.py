"""Benchmark: dense and conv2d standard ops on OpenCL against the CPU (NumPy) kernels.

Run: python bench/ops_opencl_vs_cpu.py [--reps 5] [--json out.json]
Each op is prepared once per device (workspace allocated then); only run() + sync is timed,
with the inputs already on the device. Medians are reported; ratio = opencl / cpu time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import numpy as np

from graph_runtime.backends import get_backend
from graph_runtime.device import Device
from graph_runtime.lib.chain import Chain, Step
from graph_runtime.lib.library import TensorSpec

# (op, input shapes, attrs)
CASES: list[tuple[str, list[tuple[int, ...]], dict[str, Any]]] = [
    ("dense", [(1, 512), (512, 512)], {}),
    ("dense", [(8, 512), (512, 512)], {}),
    ("dense", [(64, 512), (512, 512)], {}),
    ("dense", [(256, 1024), (1024, 1024)], {}),
    ("conv2d", [(1, 3, 64, 64), (16, 3, 3, 3)], {"padding": [1, 1]}),
    ("conv2d", [(1, 64, 28, 28), (64, 64, 3, 3)], {"padding": [1, 1]}),
    ("conv2d", [(4, 32, 28, 28), (64, 32, 3, 3)], {"padding": [1, 1], "strides": [2, 2]}),
    ("conv2d", [(1, 64, 28, 28), (64, 1, 3, 3)], {"padding": [1, 1], "groups": 64}),
    ("conv2d", [(1, 32, 56, 56), (64, 32, 1, 1)], {}),
]


def median_ms(kind: str, op: str, hosts: list[np.ndarray], attrs: dict[str, Any],
              reps: int) -> tuple[float, np.ndarray]:
    """Median milliseconds of one prepared op on device kind 0, and its (host) output."""
    backend = get_backend(kind)
    chain = Chain(op, [Step(op)])
    specs = [TensorSpec(h.shape, str(h.dtype)) for h in hosts]
    outs = chain.infer(specs, attrs)
    run = chain.prepare(Device(backend.device_type, 0), specs, outs, attrs)
    args = []
    for h in hosts:
        arr = backend.empty(0, h.shape, h.dtype)
        backend.from_host(h, arr)
        args.append(arr)
    results = [backend.empty(0, s.shape, np.dtype(s.dtype)) for s in outs]
    run(*args, *results)  # warm-up: builds kernels
    backend.sync(0)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run(*args, *results)
        backend.sync(0)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, backend.to_host(results[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"opencl: {get_backend('opencl').device_info(0).name}; load average {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f}")
    print(f"{'op':<8} {'shapes':<34} {'cpu ms':>9} {'opencl ms':>10} {'opencl/cpu':>11}")
    rows = []
    rng = np.random.default_rng(0)
    for op, shapes, attrs in CASES:
        hosts = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        cpu_ms, want = median_ms("cpu", op, hosts, attrs, args.reps)
        cl_ms, got = median_ms("opencl", op, hosts, attrs, args.reps)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
        label = " x ".join(str(s) for s in shapes)
        print(f"{op:<8} {label:<34} {cpu_ms:>9.2f} {cl_ms:>10.2f} {cl_ms / cpu_ms:>11.2f}",
              flush=True)
        rows.append({"op": op, "shapes": shapes, "attrs": attrs, "cpu_ms": cpu_ms,
                     "opencl_ms": cl_ms})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
