"""Benchmark: graph_runtime's OpenCL GEMM kernels against CLBlast (pyclblast) and NumPy.

Run: python bench/opencl_gemm.py [--sizes 64 128 256 512 1024] [--layout nn|nt] [--reps 7]
     [--json out.json]
Square float32 C = A @ B (layout nn) or C = A @ B.T with B stored (N, K) as dense's weight
(layout nt). Columns: "pick" is what make_gemm runs by default on this device, then each of our
kernel families forced (tiled_gemm variants), CLBlast when importable, and NumPy (OpenBLAS) on
the host for scale. Implementations alternate within each repetition so that a shared, noisy
machine slows all alike; medians are reported. First it times PoCL's launch floor: an empty
kernel launched and waited for, with typed and with untyped scalar arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable

import numpy as np

from graph_runtime.backends import get_backend
from graph_runtime.lib.kernels.opencl.args import typed_kernel
from graph_runtime.lib.kernels.opencl.gemm import (GemmShape, clblast_available, is_cpu_device,
                                                   make_gemm, pick_variant, tiled_gemm)


def _once_ms(run: Callable[[], None], sync: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    sync()
    return (time.perf_counter() - start) * 1e3


def _median_ms(run: Callable[[], None], sync: Callable[[], None], reps: int) -> float:
    run()
    sync()
    return statistics.median(_once_ms(run, sync) for _ in range(reps))


def launch_floor(backend: Any, device_id: int, reps: int = 200) -> dict[str, float]:
    """Median ms of an empty kernel with 6 scalar arguments, launched and waited for."""
    import pyopencl as cl
    source = "__kernel void gr_empty(__global float* a, long b, int c, int d, int e, long f, " \
             "int g) {}"
    program = backend.program(device_id, source, name="empty kernel")
    queue = backend.queue(device_id)
    buf = backend.alloc(device_id, 4)
    types = [None, np.int64, np.int32, np.int32, np.int32, np.int64, np.int32]
    typed = typed_kernel(program, "gr_empty", types)
    untyped = cl.Kernel(program, "gr_empty")
    scalars = [t(0) for t in types[1:]]
    sync = lambda: queue.finish()  # noqa: E731
    return {
        "typed_args_ms": _median_ms(lambda: typed(queue, (1,), None, buf, 0, 0, 0, 0, 0, 0),
                                    sync, reps),
        "numpy_scalar_args_ms": _median_ms(lambda: untyped(queue, (1,), None, buf, *scalars),
                                           sync, reps)}


def _runners(backend: Any, device_id: int, shape: GemmShape) -> dict[str, Callable[..., None]]:
    cpu = is_cpu_device(backend, device_id)
    runs = {f"pick:{pick_variant(shape, cpu)}": make_gemm(backend, device_id, shape, "tiled")}
    variants = ["packed", "local"] + (["dot"] if shape.trans_b else [])
    for variant in variants:
        runs[variant] = tiled_gemm(backend, device_id, shape, variant=variant)
    if clblast_available():
        runs["clblast"] = make_gemm(backend, device_id, shape, "clblast")
    return runs


def bench_size(backend: Any, device_id: int, n: int, layout: str, reps: int) -> dict[str, float]:
    """Median ms per implementation for one n x n x n product, each checked against NumPy."""
    rng = np.random.default_rng(n)
    host_a = rng.standard_normal((n, n)).astype(np.float32)
    host_b = rng.standard_normal((n, n)).astype(np.float32)
    trans_b = layout == "nt"
    want = host_a.astype(np.float64) @ (host_b.T if trans_b else host_b).astype(np.float64)
    a = backend.empty(device_id, (n, n), np.float32)
    b = backend.empty(device_id, (n, n), np.float32)
    c = backend.empty(device_id, (n, n), np.float32)
    backend.from_host(host_a, a)
    backend.from_host(host_b, b)
    runs = _runners(backend, device_id, GemmShape(n, n, n, "float32", trans_b=trans_b))
    sync = lambda: backend.sync(device_id)  # noqa: E731
    for impl, run in runs.items():
        run(a, b, c)  # warm-up: builds kernels (CLBlast compiles on first use)
        sync()
        err = float(np.abs(backend.to_host(c) - want).max() / max(np.abs(want).max(), 1.0))
        if err > 1e-4:
            raise SystemExit(f"{impl} gemm {n}: relative error {err:.2e}")
    host_b_op = host_b.T if trans_b else host_b
    host_c = np.empty((n, n), np.float32)
    times: dict[str, list[float]] = {impl: [] for impl in [*runs, "numpy"]}
    for _ in range(reps):
        for impl, run in runs.items():
            times[impl].append(_once_ms(lambda: run(a, b, c), sync))
        times["numpy"].append(_once_ms(lambda: np.matmul(host_a, host_b_op, out=host_c),
                                       lambda: None))
    return {impl: statistics.median(t) for impl, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--layout", choices=["nn", "nt"], default="nn")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    backend = get_backend("opencl")
    device = backend.device_info(args.device_id).name
    load = os.getloadavg()
    print(f"device: {device}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    floor = launch_floor(backend, args.device_id)
    print(f"launch floor (empty kernel, launch + wait): {floor['typed_args_ms']:.3f} ms with "
          f"typed scalar args, {floor['numpy_scalar_args_ms']:.3f} ms with NumPy scalars")
    print(f"layout {args.layout}: median ms per implementation (GF/s of the fastest OpenCL one)")
    rows = []
    for n in args.sizes:
        medians = bench_size(backend, args.device_id, n, args.layout, args.reps)
        opencl = {k: v for k, v in medians.items() if k != "numpy"}
        best = min(opencl, key=lambda k: opencl[k])
        gflops = 2.0 * n ** 3 / (opencl[best] * 1e-3) / 1e9
        cells = "  ".join(f"{impl} {ms:.2f}" for impl, ms in medians.items())
        print(f"{n:>5}: {cells}  | best {best} {gflops:.1f} GF/s", flush=True)
        rows.append({"size": n, "layout": args.layout, **{f"{k}_ms": v for k, v in
                                                           medians.items()}})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": device, "load_average": load, "launch_floor": floor,
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
