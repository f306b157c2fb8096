"""Run under `mpiexec -n N`: exercises MPISession end to end and prints one JSON line at rank 0."""
from __future__ import annotations

import json
import sys

import numpy as np

from graph_runtime.disco import REDUCE_OPS, MPISession
from graph_runtime.errors import DiscoError

DTYPES = ("float16", "float32", "float64", "int8", "int32", "int64", "uint8")


def main() -> None:
    sess = MPISession(num_groups=int(sys.argv[1]) if len(sys.argv) > 1 else 1, timeout=60)
    n = sess.num_workers
    results: dict[str, object] = {"num_workers": n}
    wid = sess.get_global_func("runtime.disco.worker_id")()
    results["worker_ids"] = [wid.debug_get_from_remote(w) for w in range(n)]
    sess.init_ccl("mpi")
    rng = np.random.default_rng(0)
    checked = 0
    for dtype in DTYPES:
        data = [(rng.integers(1, 4, size=(3, 2))).astype(dtype) for _ in range(n)]
        src = sess.empty((3, 2), dtype)
        dst = sess.empty((3, 2), dtype)
        for w in range(n):
            src.debug_copy_from(w, data[w])
        stack = np.stack(data)
        for op in REDUCE_OPS:
            sess.allreduce(src, dst, op, in_group=False)
            if op == "avg":
                total = stack.sum(0, dtype=dtype)
                want = total // n if np.issubdtype(stack.dtype, np.integer) else total / n
            else:
                want = {"sum": np.add, "prod": np.multiply, "min": np.minimum,
                        "max": np.maximum}[op].reduce(stack, axis=0)
            for w in range(n):
                got = dst.debug_get_from_remote(w)
                np.testing.assert_allclose(got.astype("float64"), want.astype("float64"),
                                           rtol=1e-3, err_msg=f"{op} {dtype} worker {w}")
                checked += 1
    # broadcast / scatter / gather / allgather
    host = np.arange(n * 4, dtype="float32").reshape(n, 4)
    b = sess.broadcast(host, in_group=False)
    results["broadcast_ok"] = all(np.array_equal(b.debug_get_from_remote(w), host)
                                  for w in range(n))
    s = sess.scatter(host, in_group=False)
    results["scatter_ok"] = all(np.array_equal(s.debug_get_from_remote(w), host[w])
                                for w in range(n))
    gathered = sess.empty((n, 4), "float32", worker0_only=True)
    sess.gather_to_worker0(s, gathered, in_group=False)
    out = np.empty((n, 4), "float32")
    sess.copy_from_worker_0(out, gathered)
    results["gather_ok"] = bool(np.array_equal(out, host))
    allg = sess.empty((n, 4), "float32")
    sess.allgather(s, allg, in_group=False)
    results["allgather_ok"] = all(np.array_equal(allg.debug_get_from_remote(w), host)
                                  for w in range(n))
    results["allreduce_checked"] = checked
    # in-group: each group of n // num_groups consecutive ranks reduces on its own
    ids = sess.get_global_func("runtime.disco.worker_id")()
    as_float = sess.empty((), "float32")
    for w in range(n):
        as_float.debug_copy_from(w, np.array(w, "float32"))
    summed = sess.empty((), "float32")
    sess.allreduce(as_float, summed, "sum", in_group=True)
    size = n // sess.num_groups
    results["group_sums"] = [float(summed.debug_get_from_remote(w)) for w in range(n)]
    results["group_sums_expected"] = [float(sum(range(w // size * size, (w // size + 1) * size)))
                                      for w in range(n)]
    del ids
    try:
        sess.get_global_func("no.such.function")
        sess.sync_worker_0()
        results["error"] = None
    except DiscoError as e:
        results["error"] = str(e).splitlines()[0]
    sess.shutdown()
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
