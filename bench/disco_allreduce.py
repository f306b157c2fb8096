"""Allreduce benchmark: raw mpi4py Allreduce beside MPISession ("mpi") and ProcessSession ("cpu").

Run `python bench/disco_allreduce.py`: each round measures ProcessSession here, then relaunches
itself under `mpiexec -n 2` for the raw mpi4py baseline and MPISession on the same buffers; the
table gives medians over the rounds.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

SIZES = {"1 KB": 1 << 10, "1 MB": 1 << 20, "64 MB": 64 << 20}
ROUNDS = 3


def repeats(nbytes: int) -> int:
    return max(5, min(2000, (256 << 20) // (nbytes * 8)))


def session_allreduce(sess: object) -> dict[str, float]:
    """Median microseconds per allreduce (streamed, then one sync of every worker)."""
    out = {}
    for label, nbytes in SIZES.items():
        src = sess.empty((nbytes // 4,), "float32")  # type: ignore[attr-defined]
        dst = sess.empty((nbytes // 4,), "float32")  # type: ignore[attr-defined]
        n = repeats(nbytes)
        sess.allreduce(src, dst, "sum")  # type: ignore[attr-defined]
        sess.sync_all()  # type: ignore[attr-defined]
        times = []
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(n):
                sess.allreduce(src, dst, "sum")  # type: ignore[attr-defined]
            sess.sync_all()  # type: ignore[attr-defined]
            times.append((time.perf_counter() - start) / n * 1e6)
        out[label] = statistics.median(times)
    return out


def under_mpi() -> None:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    raw = {}
    for label, nbytes in SIZES.items():
        src = np.ones(nbytes // 4, "float32")
        dst = np.empty_like(src)
        n = repeats(nbytes)
        comm.Allreduce(src, dst)
        times = []
        for _ in range(3):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(n):
                comm.Allreduce(src, dst)
            comm.Barrier()
            times.append((time.perf_counter() - start) / n * 1e6)
        raw[label] = statistics.median(times)
    from graph_runtime.disco import MPISession
    sess = MPISession()  # ranks other than 0 serve and exit here
    sess.init_ccl("mpi")
    ours = session_allreduce(sess)
    sess.shutdown()
    print("RESULT " + json.dumps({"mpi4py": raw, "MPISession": ours}), flush=True)


def process_session() -> dict[str, float]:
    from graph_runtime.disco import ProcessSession
    with ProcessSession(2) as sess:
        sess.init_ccl("cpu")
        return session_allreduce(sess)


def mpi_job() -> dict[str, dict[str, float]]:
    """One `mpiexec -n 2` run: raw mpi4py, then MPISession, on the same buffers."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    try:
        proc = subprocess.run([mpiexec, "-n", "2", sys.executable, __file__, "--under-mpi"],
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"mpiexec unavailable ({e}); only ProcessSession measured")
        return {}
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        print("mpiexec run failed:", proc.stderr[-2000:])
        return {}
    return json.loads(line[0][7:])


def main() -> None:
    # NOTE: rounds alternate the contenders so that machine noise hits them alike; medians.
    samples: dict[str, dict[str, list[float]]] = {}
    for _ in range(ROUNDS):
        round_results = {"ProcessSession cpu": process_session(), **mpi_job()}
        for name, row in round_results.items():
            for label, value in row.items():
                samples.setdefault(name, {}).setdefault(label, []).append(value)
    results = {name: {label: statistics.median(values) for label, values in row.items()}
               for name, row in samples.items()}
    base = results.get("mpi4py", {})
    process = results["ProcessSession cpu"]
    print(f"{'size':6} {'mpi4py Allreduce':>17} {'MPISession':>11} {'ratio':>6} "
          f"{'ProcessSession cpu':>19} {'ratio':>6}   (us per allreduce, 2 workers, float32 sum, "
          f"median of {ROUNDS} rounds)")
    for label in SIZES:
        raw = base.get(label)
        mpi = results.get("MPISession", {}).get(label)
        cpu = process[label]

        def ratio(x: float | None) -> str:
            return f"{x / raw:6.2f}" if raw and x else f"{'n/a':>6}"

        print(f"{label:6} {raw or float('nan'):17.1f} {mpi or float('nan'):11.1f} {ratio(mpi)} "
              f"{cpu:19.1f} {ratio(cpu)}")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    if "--under-mpi" in sys.argv:
        under_mpi()
    else:
        main()
