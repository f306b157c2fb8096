"""Benchmark: graph_runtime's tiled OpenCL GEMM against CLBlast (pyclblast) on one OpenCL device.

Run: python bench/opencl_gemm.py [--sizes 64 128 256 512 1024] [--reps 5] [--json out.json]
Square float32 C = A @ B. The two implementations alternate within each repetition so that a
shared, noisy machine slows both alike; medians are reported.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import numpy as np

from graph_runtime.backends import get_backend
from graph_runtime.lib.opencl_gemm import GemmShape, clblast_available, make_gemm


def _timed(run: Callable[[], None], sync: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    sync()
    return time.perf_counter() - start


def bench_size(backend: Any, device_id: int, n: int, reps: int, impls: list[str]) -> dict[str, Any]:
    """Median seconds per implementation for one n x n x n product, checked against NumPy."""
    rng = np.random.default_rng(n)
    host_a = rng.standard_normal((n, n)).astype(np.float32)
    host_b = rng.standard_normal((n, n)).astype(np.float32)
    a = backend.empty(device_id, (n, n), np.float32)
    b = backend.empty(device_id, (n, n), np.float32)
    c = backend.empty(device_id, (n, n), np.float32)
    backend.from_host(host_a, a)
    backend.from_host(host_b, b)
    want = host_a.astype(np.float64) @ host_b.astype(np.float64)
    shape = GemmShape(n, n, n, "float32")
    runs = {impl: make_gemm(backend, device_id, shape, impl) for impl in impls}
    sync = lambda: backend.sync(device_id)  # noqa: E731
    times: dict[str, list[float]] = {impl: [] for impl in impls}
    for impl, run in runs.items():
        run(a, b, c)  # warm-up: builds kernels (CLBlast compiles on first use)
        sync()
        err = float(np.abs(backend.to_host(c) - want).max() / max(np.abs(want).max(), 1.0))
        if err > 1e-4:
            raise SystemExit(f"{impl} gemm {n}: relative error {err:.2e}")
    for _ in range(reps):
        for impl, run in runs.items():
            times[impl].append(_timed(lambda: run(a, b, c), sync))
    return {impl: statistics.median(t) for impl, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    backend = get_backend("opencl")
    impls = ["tiled"] + (["clblast"] if clblast_available() else [])
    print(f"device: {backend.device_info(args.device_id).name}")
    if "clblast" not in impls:
        print("pyclblast not importable: only the tiled kernel is measured")
    header = f"{'size':>6} " + " ".join(f"{impl + ' ms':>12} {impl + ' GF/s':>13}"
                                        for impl in impls)
    if len(impls) == 2:
        header += f" {'tiled/clblast':>14}"
    print(header)
    rows = []
    for n in args.sizes:
        medians = bench_size(backend, args.device_id, n, args.reps, impls)
        flops = 2.0 * n ** 3
        line = f"{n:>6} " + " ".join(f"{medians[i] * 1e3:>12.2f} {flops / medians[i] / 1e9:>13.2f}"
                                     for i in impls)
        row: dict[str, Any] = {"size": n, **{f"{i}_ms": medians[i] * 1e3 for i in impls}}
        if len(impls) == 2:
            ratio = medians["tiled"] / medians["clblast"]
            line += f" {ratio:>14.2f}"
            row["tiled_over_clblast"] = ratio
        print(line, flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": backend.device_info(args.device_id).name, "rows": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()
