"""Benchmark: dense and conv2d standard ops on OpenCL against the CPU (NumPy) kernels.

Run: python bench/ops_opencl_vs_cpu.py [--reps 5] [--json out.json] [--only conv2d]
Each op is prepared once per device (workspace allocated then); only run() + sync is timed,
with the inputs already on the device. Medians are reported; ratio = opencl / cpu time.
"opencl ms" is the method conv2d_cl picks itself (timed at prepare where Winograd applies; the
"picked" column); where Winograd applies the table also times each candidate forced through
GRAPH_RUNTIME_OPENCL_CONV: the GEMM method conv2d used before Winograd ("gemm ms", direct,
panel or im2col), "winograd" (F(2x2,3x3)) and "winograd4" (F(4x4,3x3)).
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
from graph_runtime.lib import tuning
from graph_runtime.lib.chain import Chain, Step
from graph_runtime.lib.conv_params import conv2d_params
from graph_runtime.lib.kernels.opencl.conv_choice import CHOICE, gemm_method
from graph_runtime.lib.kernels.opencl.gemm import GemmShape
from graph_runtime.lib.kernels.winograd_math import winograd_applies
from graph_runtime.lib.library import InputVersion, TensorSpec
from graph_runtime.lib.prepared import capabilities
from graph_runtime.settings import OPENCL_CONV, overridden

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
    # ResNet-18's 3x3 stride-1 convolutions, and its first stage at batch 8.
    ("conv2d", [(1, 64, 56, 56), (64, 64, 3, 3)], {"padding": [1, 1]}),
    ("conv2d", [(1, 128, 28, 28), (128, 128, 3, 3)], {"padding": [1, 1]}),
    ("conv2d", [(1, 256, 14, 14), (256, 256, 3, 3)], {"padding": [1, 1]}),
    ("conv2d", [(1, 512, 7, 7), (512, 512, 3, 3)], {"padding": [1, 1]}),
    ("conv2d", [(8, 64, 56, 56), (64, 64, 3, 3)], {"padding": [1, 1]}),
]
WINOGRAD = ("winograd", "winograd4")


def median_ms(kind: str, op: str, hosts: list[np.ndarray], attrs: dict[str, Any],
              reps: int) -> tuple[float, np.ndarray]:
    """Median milliseconds of one prepared op on device kind 0, and its (host) output."""
    backend = get_backend(kind)
    chain = Chain(op, [Step(op)])
    specs = [TensorSpec(h.shape, str(h.dtype)) for h in hosts]
    outs = chain.infer(specs, attrs)
    run = chain.prepare(Device(backend.device_type, 0), specs, outs, attrs)
    # As a graph's params are: written once, so weights derived from them are made once.
    steady = InputVersion()
    kernel = capabilities(run)
    kernel.bind_versions({pos: steady for pos in kernel.cached_inputs()})
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


def conv_methods(hosts: list[np.ndarray], attrs: dict[str, Any]) -> tuple[str, str] | None:
    """(the GEMM method, what conv2d_cl picked) for a conv2d where Winograd applies, else None."""
    specs = [TensorSpec(h.shape, str(h.dtype)) for h in hosts]
    p = conv2d_params(specs, attrs)
    if not winograd_applies(p):
        return None
    kk = p.cg * p.kh * p.kw
    shape = GemmShape(p.og, p.oh * p.ow, kk, p.dtype, batch=p.n * p.groups, a_batches=p.groups,
                      b_batches=p.n * p.groups)
    picked = [e.chosen for e in tuning.remembered() if e.choice == CHOICE.name and e.key == p.key()]
    return gemm_method(get_backend("opencl"), 0, p, shape), picked[0] if picked else "?"


def forced_ms(method: str, op: str, hosts: list[np.ndarray], attrs: dict[str, Any],
              reps: int, want: np.ndarray) -> float:
    """median_ms on OpenCL with conv2d's method forced."""
    with overridden(OPENCL_CONV, method):
        ms, got = median_ms("opencl", op, hosts, attrs, reps)
    tol = 5e-3 if method == "winograd4" else 1e-3  # F(4x4)'s float32 error grows with C
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--only", help="run only this op's cases (dense or conv2d)")
    args = parser.parse_args()
    os.environ.pop(OPENCL_CONV.name, None)  # "opencl ms" is conv2d_cl's own pick
    load = os.getloadavg()
    print(f"opencl: {get_backend('opencl').device_info(0).name}; load average {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f}")
    print(f"{'op':<8} {'shapes':<38} {'cpu ms':>8} {'opencl ms':>10} {'opencl/cpu':>11} "
          f"{'gemm ms':>13} {'winograd':>9} {'winograd4':>10} {'picked':>10}")
    rows = []
    rng = np.random.default_rng(0)
    for op, shapes, attrs in CASES:
        if args.only and op != args.only:
            continue
        hosts = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        cpu_ms, want = median_ms("cpu", op, hosts, attrs, args.reps)
        cl_ms, got = median_ms("opencl", op, hosts, attrs, args.reps)
        np.testing.assert_allclose(got, want, rtol=5e-3, atol=5e-3)
        label = " x ".join(str(s) for s in shapes)
        row: dict[str, Any] = {"op": op, "shapes": shapes, "attrs": attrs, "cpu_ms": cpu_ms,
                               "opencl_ms": cl_ms}
        line = f"{op:<8} {label:<38} {cpu_ms:>8.2f} {cl_ms:>10.2f} {cl_ms / cpu_ms:>11.2f}"
        methods = conv_methods(hosts, attrs) if op == "conv2d" else None
        if methods is not None:
            gemm, picked = methods
            row["methods"] = {m: forced_ms(m, op, hosts, attrs, args.reps, want)
                              for m in (gemm, *WINOGRAD)}
            row["picked"] = picked
            times = row["methods"]
            line += (f" {gemm:>6} {times[gemm]:>6.2f} {times['winograd']:>9.2f} "
                     f"{times['winograd4']:>10.2f} {picked:>10}")
        print(line, flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
