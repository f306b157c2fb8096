"""Every collective x reduce op x dtype on the "cpu" ccl, checked against NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.disco import REDUCE_OPS, Session, ThreadedSession
from graph_runtime.disco.ccl import reduce_into
from graph_runtime.errors import DiscoError

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint32"]
NUMPY_OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def reference(stack: np.ndarray, op: str) -> np.ndarray:
    """What NumPy says op over axis 0 is (avg: sum / n, floor division for integers)."""
    if op == "avg":
        total = np.add.reduce(stack, axis=0, dtype=stack.dtype)
        n = stack.shape[0]
        return total // n if np.issubdtype(stack.dtype, np.integer) else total / n
    return NUMPY_OPS[op].reduce(stack, axis=0, dtype=stack.dtype)


def per_worker(sess: Session, shape: tuple, dtype: str, seed: int) -> tuple:
    """A DRef holding different random data on each worker, and that data stacked."""
    rng = np.random.default_rng(seed)
    data = [rng.integers(1, 5, size=shape).astype(dtype) for _ in range(sess.num_workers)]
    ref = sess.empty(shape, dtype)
    for w, value in enumerate(data):
        ref.debug_copy_from(w, value)
    return ref, np.stack(data)


def tolerance(dtype: str) -> dict:
    return {"float16": dict(rtol=1e-2), "float32": dict(rtol=1e-6)}.get(dtype, dict(rtol=0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_every_op(sess: Session, dtype: str) -> None:
    src, stack = per_worker(sess, (3, 5), dtype, seed=len(dtype))
    dst = sess.empty((3, 5), dtype)
    for op in REDUCE_OPS:
        sess.allreduce(src, dst, op)
        want = reference(stack, op)
        for w in range(sess.num_workers):
            np.testing.assert_allclose(dst.debug_get_from_remote(w), want, **tolerance(dtype),
                                       err_msg=f"{op} {dtype} worker {w}")


def test_allreduce_in_place(sess: Session) -> None:
    src, stack = per_worker(sess, (64,), "float32", seed=3)
    sess.allreduce(src, src, "max")
    for w in range(sess.num_workers):
        np.testing.assert_array_equal(src.debug_get_from_remote(w), stack.max(0))


def test_allreduce_with_a_late_worker(sess: Session) -> None:
    # the punctual workers outwait their spin and sleep until the late one wakes them
    src, stack = per_worker(sess, (8,), "float32", seed=7)
    dst = sess.empty((8,), "float32")
    for late in range(sess.num_workers):
        sess.get_global_func("test.sleep_on")(late, 0.05)
        sess.allreduce(src, dst, "sum")
        sess.allreduce(dst, dst, "max")  # the next barrier, right after a wake-up
    for w in range(sess.num_workers):
        np.testing.assert_allclose(dst.debug_get_from_remote(w), stack.sum(0), rtol=1e-6)


def test_allreduce_grows_the_arena(sess: Session) -> None:
    src, stack = per_worker(sess, (300_000,), "float64", seed=4)  # 2.4 MB per worker
    dst = sess.empty((300_000,), "float64")
    sess.allreduce(src, dst, "sum")
    np.testing.assert_array_equal(dst.debug_get_from_remote(sess.num_workers - 1), stack.sum(0))


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8"])
def test_allgather(sess: Session, dtype: str) -> None:
    n = sess.num_workers
    src, stack = per_worker(sess, (2, 3), dtype, seed=5)
    dst = sess.empty((n * 2, 3), dtype)
    sess.allgather(src, dst)
    for w in range(n):
        np.testing.assert_array_equal(dst.debug_get_from_remote(w), stack.reshape(n * 2, 3))


@pytest.mark.parametrize("dtype", ["float16", "float64", "int32"])
def test_broadcast_scatter_gather(sess: Session, dtype: str) -> None:
    n = sess.num_workers
    src, stack = per_worker(sess, (n, 4), dtype, seed=6)
    dst = sess.empty((n, 4), dtype)
    sess.broadcast_from_worker0(src, dst)
    chunk = sess.empty((4,), dtype)
    sess.scatter_from_worker0(src, chunk)
    gathered = sess.empty((n, 4), dtype, worker0_only=True)
    sess.gather_to_worker0(chunk, gathered)
    for w in range(n):
        np.testing.assert_array_equal(dst.debug_get_from_remote(w), stack[0])
        np.testing.assert_array_equal(chunk.debug_get_from_remote(w), stack[0][w])
    out = np.empty((n, 4), dtype)
    sess.copy_from_worker_0(out, gathered)
    np.testing.assert_array_equal(out, stack[0])


def test_unknown_reduce_op_is_refused_at_the_controller(sess: Session) -> None:
    src = sess.empty((2,), "float32")
    with pytest.raises(DiscoError, match="unknown reduce op 'mean'; expected one of: sum, prod, "
                                         "min, max, avg"):
        sess.allreduce(src, src, "mean")


def test_unknown_reduce_op_is_refused_on_the_workers_too(sess: Session) -> None:
    src = sess.empty((2,), "float32")
    sess.get_global_func("runtime.disco.allreduce")(src, src, "mean", True)
    with pytest.raises(DiscoError, match="(?s)worker 0 failed .*unknown reduce op 'mean'; expected "
                                         "one of: sum, prod, min, max, avg"):
        sess.sync_all()
    sess.sync_all()  # the session is still usable


def test_mismatched_collective_fails_on_every_worker_without_hanging(sess: Session) -> None:
    src = sess.empty((4,), "float32")
    dst = sess.empty((5,), "float32")
    sess.allreduce(src, dst, "sum")
    with pytest.raises(DiscoError, match=r"allreduce on worker 0: dst is \(5,\) float32, "
                                         r"expected \(4,\) float32"):
        sess.sync_all()
    sess.sync_all()  # the session is still usable


def test_groups_reduce_separately() -> None:
    with ThreadedSession(4, num_groups=2) as sess:
        sess.init_ccl("cpu")
        x = sess.empty((), "float32")
        for w in range(4):
            x.debug_copy_from(w, np.array(w, "float32"))
        y = sess.empty((), "float32")
        sess.allreduce(x, y, "sum", in_group=True)
        assert [float(y.debug_get_from_remote(w)) for w in range(4)] == [1, 1, 5, 5]
        sess.allreduce(x, y, "sum", in_group=False)
        assert float(y.debug_get_from_remote(3)) == 6
        group = sess.get_global_func("runtime.disco.group_id")()
        assert [group.debug_get_from_remote(w) for w in range(4)] == [0, 0, 1, 1]


def test_reduce_into_matches_numpy_for_three_parts() -> None:
    parts = [np.array([1, 5, 3], "int32"), np.array([4, 2, 6], "int32"),
             np.array([7, 8, 0], "int32")]
    out = np.empty(3, "int32")
    np.testing.assert_array_equal(reduce_into(parts, "avg", out), np.sum(parts, 0) // 3)
    np.testing.assert_array_equal(reduce_into(parts, "min", out), np.min(parts, 0))


@pytest.mark.cuda
def test_nccl_allreduce_on_gpus() -> None:
    import cupy
    count = cupy.cuda.runtime.getDeviceCount()
    n = 2 if count >= 2 else 1
    with ThreadedSession(n) as sess:
        sess.init_ccl("nccl", *range(n))
        sess.import_python_module("disco_testfuncs")
        x = sess.empty((8,), "float32")  # a CuPy array on each worker's GPU
        sess.get_global_func("test.fill_worker_id")(x)
        y = sess.empty((8,), "float32")
        sess.allreduce(x, y, "sum")
        np.testing.assert_allclose(y.debug_get_from_remote(0), sum(range(n)))
