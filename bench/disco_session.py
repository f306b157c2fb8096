"""Disco control-plane benchmark: ours beside TVM's C++ Disco (apache-tvm), same run, 2 workers.

Measures (median of repeats): call+sync_worker_0 latency, streamed calls per call, copy to/from
worker-0 throughput, ProcessSession start-up. Usage: python bench/disco_session.py [--json out]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import numpy as np

WORKERS = 2
COPY_BYTES = 64 << 20


def median_of(fn: Callable[[], float], repeats: int = 5) -> float:
    return statistics.median(fn() for _ in range(repeats))


def control_plane(sess: Any, func_name: str) -> dict[str, float]:
    func = sess.get_global_func(func_name)
    sess.sync_worker_0()

    def call_sync() -> float:
        n = 300
        start = time.perf_counter()
        for _ in range(n):
            func()
            sess.sync_worker_0()
        return (time.perf_counter() - start) / n * 1e6

    def stream() -> float:
        n = 3000
        start = time.perf_counter()
        for _ in range(n):
            func()
        sess.sync_worker_0()
        return (time.perf_counter() - start) / n * 1e6

    return {"call+sync_worker_0 (us)": median_of(call_sync), "streamed call (us)": median_of(stream)}


def copies(sess: Any, to_remote: Callable[[np.ndarray], Any],
           copy_to: Callable[[np.ndarray, Any], None],
           copy_from: Callable[[np.ndarray, Any], None]) -> dict[str, float]:
    host = np.ones(COPY_BYTES // 4, "float32")
    out = np.empty_like(host)
    remote = to_remote(host)

    def to() -> float:
        start = time.perf_counter()
        copy_to(host, remote)
        sess.sync_worker_0()
        return COPY_BYTES / (time.perf_counter() - start) / 1e9

    def back() -> float:
        start = time.perf_counter()
        copy_from(out, remote)
        return COPY_BYTES / (time.perf_counter() - start) / 1e9

    return {"copy_to_worker_0 64 MB (GB/s)": median_of(to),
            "copy_from_worker_0 64 MB (GB/s)": median_of(back)}


def ours() -> dict[str, dict[str, float]]:
    from graph_runtime.disco import ProcessSession, ThreadedSession
    results = {}
    for name, cls in (("threaded", ThreadedSession), ("process", ProcessSession)):
        start = time.perf_counter()
        sess = cls(WORKERS)
        ready = time.perf_counter() - start
        row = control_plane(sess, "runtime.disco.worker_id")
        row.update(copies(sess, lambda h: sess.copy_to_worker_0(h),
                          lambda h, r: sess.copy_to_worker_0(h, r),
                          lambda h, r: sess.copy_from_worker_0(h, r)))
        if name == "process":
            row["session ready (s)"] = ready
        sess.shutdown()
        results[name] = row
    return results


def tvm_baseline() -> tuple[dict[str, dict[str, float]], str | None]:
    try:
        import tvm
        import tvm.runtime.disco as disco
        import tvm_ffi
        tvm_ffi.init_ffi_api("runtime.disco", "tvm.runtime.disco._ffi_api")
    except Exception as e:  # not installed, or a build without Disco
        return {}, f"TVM Disco unavailable ({type(e).__name__}: {e}); pip install apache-tvm"
    results = {}
    for name in ("threaded", "process"):
        try:
            start = time.perf_counter()
            sess = disco.ThreadedSession(WORKERS) if name == "threaded" else \
                disco.ProcessSession(WORKERS)
            sess.sync_worker_0()
            ready = time.perf_counter() - start
            row = control_plane(sess, "runtime.disco.worker_id")

            # TVM copies between its own tensors: make them once, outside the timed region
            staged = tvm.runtime.tensor(np.ones(COPY_BYTES // 4, "float32"))
            landing = tvm.runtime.empty((COPY_BYTES // 4,), "float32")

            def to_remote(h: np.ndarray, sess: Any = sess) -> Any:
                return sess.copy_to_worker_0(staged)

            def copy_to(h: np.ndarray, r: Any, sess: Any = sess) -> None:
                sess.copy_to_worker_0(staged, r)

            def copy_from(h: np.ndarray, r: Any, sess: Any = sess) -> None:
                sess.copy_from_worker_0(landing, r)
                sess.sync_worker_0()

            row.update(copies(sess, to_remote, copy_to, copy_from))
            if name == "process":
                row["session ready (s)"] = ready
            sess.shutdown()
            results[name] = row
        except Exception as e:
            results[name] = {"error": f"{type(e).__name__}: {e}"}  # type: ignore[dict-item]
    return results, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    mine = ours()
    theirs, why = tvm_baseline()
    if why:
        print(why)
    print(f"{'session':9} {'metric':34} {'graph_runtime':>14} {'TVM Disco':>12}")
    for kind, row in mine.items():
        for metric, value in row.items():
            base = theirs.get(kind, {}).get(metric)
            base_text = f"{base:12.2f}" if isinstance(base, float) else f"{'n/a':>12}"
            print(f"{kind:9} {metric:34} {value:14.2f} {base_text}")
        if "error" in theirs.get(kind, {}):
            print(f"  TVM {kind}: {theirs[kind]['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"graph_runtime": mine, "tvm": theirs, "tvm_missing": why}, f, indent=1)


if __name__ == "__main__":
    main()
