"""Disco control-plane benchmark: ours beside TVM's C++ Disco (apache-tvm), same run, 2 workers.

Measures (median of interleaved rounds, ours and TVM's sessions alive side by side so machine
noise hits both alike): call+sync_worker_0 latency, streamed calls per call, copy to/from worker-0
throughput, ProcessSession start-up (until every worker answers). Our sessions run twice: worker-0
as a thread (the default) and inline in the controller's thread (inline_worker0=True). Usage:
python bench/disco_session.py [--json out]
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
ROUNDS = 7


def call_sync(sess: Any, func: Any) -> float:
    """Microseconds per call followed by sync_worker_0."""
    n = 300
    start = time.perf_counter()
    for _ in range(n):
        func()
        sess.sync_worker_0()
    return (time.perf_counter() - start) / n * 1e6


def stream(sess: Any, func: Any) -> float:
    """Microseconds per call when calls stream out and one sync_worker_0 ends them."""
    n = 3000
    start = time.perf_counter()
    for _ in range(n):
        func()
    sess.sync_worker_0()
    return (time.perf_counter() - start) / n * 1e6


def copy_rates(sess: Any, copy_to: Callable[[], None], copy_from: Callable[[], None]) -> tuple:
    """GB/s of one 64 MB copy to worker-0 (synchronised) and one back."""
    start = time.perf_counter()
    copy_to()
    sess.sync_worker_0()
    middle = time.perf_counter()
    copy_from()
    end = time.perf_counter()
    return COPY_BYTES / (middle - start) / 1e9, COPY_BYTES / (end - middle) / 1e9


class Contender:
    """One session under test, with the copy callables for its kind of tensors."""

    def __init__(self, sess: Any, copy_to: Callable[[], None],
                 copy_from: Callable[[], None], ready: float) -> None:
        self.sess = sess
        self.func = sess.get_global_func("runtime.disco.worker_id")
        self.copy_to = copy_to
        self.copy_from = copy_from
        self.ready = ready
        self.samples: dict[str, list[float]] = {}

    def measure(self) -> None:
        rows = {"call+sync_worker_0 (us)": call_sync(self.sess, self.func),
                "streamed call (us)": stream(self.sess, self.func)}
        to, back = copy_rates(self.sess, self.copy_to, self.copy_from)
        rows["copy_to_worker_0 64 MB (GB/s)"] = to
        rows["copy_from_worker_0 64 MB (GB/s)"] = back
        for key, value in rows.items():
            self.samples.setdefault(key, []).append(value)

    def medians(self, kind: str) -> dict[str, float]:
        out = {key: statistics.median(values) for key, values in self.samples.items()}
        if kind == "process":
            out["session ready (s)"] = self.ready
        return out


def ours(kind: str, inline: bool = False) -> Contender:
    from graph_runtime.disco import ProcessSession, ThreadedSession
    cls = ThreadedSession if kind == "threaded" else ProcessSession
    start = time.perf_counter()
    sess = cls(WORKERS, inline_worker0=inline)  # returns when every worker is up
    ready = time.perf_counter() - start
    host = np.ones(COPY_BYTES // 4, "float32")
    out = np.empty_like(host)
    remote = sess.copy_to_worker_0(host)
    return Contender(sess, lambda: sess.copy_to_worker_0(host, remote),
                     lambda: sess.copy_from_worker_0(out, remote), ready)


def tvm(kind: str) -> Contender:
    import tvm as tvm_mod
    import tvm.runtime.disco as disco
    start = time.perf_counter()
    sess = disco.ThreadedSession(WORKERS) if kind == "threaded" else \
        disco.ProcessSession(WORKERS)
    sess._sync_all()  # TVM's constructor returns before its workers are up
    ready = time.perf_counter() - start
    # TVM copies between its own tensors: make them once, outside the timed region
    staged = tvm_mod.runtime.tensor(np.ones(COPY_BYTES // 4, "float32"))
    landing = tvm_mod.runtime.empty((COPY_BYTES // 4,), "float32")
    remote = sess.copy_to_worker_0(staged)

    def copy_from() -> None:
        sess.copy_from_worker_0(landing, remote)
        sess.sync_worker_0()

    return Contender(sess, lambda: sess.copy_to_worker_0(staged, remote), copy_from, ready)


def tvm_available() -> str | None:
    try:
        import tvm.runtime.disco  # noqa: F401
        import tvm_ffi
        tvm_ffi.init_ffi_api("runtime.disco", "tvm.runtime.disco._ffi_api")
    except Exception as e:  # not installed, or a build without Disco
        return f"TVM Disco unavailable ({type(e).__name__}: {e}); pip install apache-tvm"
    return None


def run_all() -> tuple[dict, dict, dict, str | None]:
    """Every contender of each kind alive at once; rounds alternate between them."""
    why = tvm_available()
    mine: dict[str, dict[str, float]] = {}
    inline: dict[str, dict[str, float]] = {}
    theirs: dict[str, dict[str, float]] = {}
    for kind in ("threaded", "process"):
        contenders = {"ours": ours(kind), "inline": ours(kind, inline=True)}
        if why is None:
            try:
                contenders["tvm"] = tvm(kind)
            except Exception as e:
                theirs[kind] = {"error": f"{type(e).__name__}: {e}"}  # type: ignore[dict-item]
        for _ in range(ROUNDS):
            for contender in contenders.values():
                contender.measure()
        mine[kind] = contenders["ours"].medians(kind)
        inline[kind] = contenders["inline"].medians(kind)
        if "tvm" in contenders:
            theirs[kind] = contenders["tvm"].medians(kind)
        for contender in contenders.values():
            contender.sess.shutdown()
    return mine, inline, theirs, why


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    mine, inline, theirs, why = run_all()
    if why:
        print(why)
    print(f"{'session':9} {'metric':34} {'graph_runtime':>14} {'inline w0':>10} "
          f"{'TVM Disco':>10}")
    for kind, row in mine.items():
        for metric, value in row.items():
            base = theirs.get(kind, {}).get(metric)
            base_text = f"{base:10.2f}" if isinstance(base, float) else f"{'n/a':>10}"
            print(f"{kind:9} {metric:34} {value:14.2f} {inline[kind][metric]:10.2f} {base_text}")
        if "error" in theirs.get(kind, {}):
            print(f"  TVM {kind}: {theirs[kind]['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"graph_runtime": mine, "graph_runtime_inline_worker0": inline,
                       "tvm": theirs, "tvm_missing": why}, f, indent=1)


if __name__ == "__main__":
    main()
