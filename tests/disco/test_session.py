"""Every Session method on ThreadedSession and ProcessSession with 1, 2 and 4 workers."""
from __future__ import annotations

import os

import numpy as np
import pytest
from disco_support import SIZES, make_session

from graph_runtime import cpu
from graph_runtime.disco import DiscoAction, DPackedFunc, DRef, Session
from graph_runtime.disco.protocol import FrameReader, encode_frame
from graph_runtime.errors import DiscoError


def test_protocol_has_the_nine_actions() -> None:
    assert [a.name for a in DiscoAction] == [
        "SHUTDOWN", "KILL_REG", "GET_GLOBAL_FUNC", "CALL_PACKED", "SYNC_WORKER",
        "COPY_FROM_WORKER0", "COPY_TO_WORKER0", "DEBUG_GET_FROM_REMOTE", "DEBUG_SET_REGISTER"]
    assert [int(a) for a in DiscoAction] == list(range(9))


def test_frames_split_anywhere_on_the_pipe_arrive_whole() -> None:
    commands = [(3, (), i, 2, ("x" * (i * 37 % 300),), ()) for i in range(40)]
    data = b"".join(encode_frame(c) for c in commands)
    for step in (1, 3, 64, len(data)):
        r, w = os.pipe()
        reader = FrameReader(r)
        got: list = []
        for i in range(0, len(data), step):
            os.write(w, data[i:i + step])
            got += reader.read_frames() or []
        os.close(w)
        assert reader.read_frames() is None  # end of file: the controller hung up
        os.close(r)
        assert got == commands, f"split every {step} bytes"


def test_worker_globals(sess: Session) -> None:
    n = sess.num_workers
    ids = sess.get_global_func("runtime.disco.worker_id")()
    size = sess.get_global_func("runtime.disco.world_size")()
    rank = sess.get_global_func("runtime.disco.worker_rank")()
    dev = sess.get_global_func("runtime.disco.device")()
    assert [ids.debug_get_from_remote(w) for w in range(n)] == list(range(n))
    assert [size.debug_get_from_remote(w) for w in range(n)] == [n] * n
    assert [rank.debug_get_from_remote(w) for w in range(n)] == list(range(n))
    assert dev.debug_get_from_remote(n - 1) == cpu(0)


def test_call_packed_argument_types(sess: Session) -> None:
    echo = sess.get_global_func("test.echo")
    ref = echo(1, 2.5, "s", None, np.dtype("float16"), cpu(0), (2, 3), True)
    got = ref.debug_get_from_remote(sess.num_workers - 1)
    assert got == (1, 2.5, "s", None, np.dtype("float16"), cpu(0), (2, 3), True)
    assert isinstance(echo, DPackedFunc)


def test_call_packed_refuses_tensors(sess: Session) -> None:
    echo = sess.get_global_func("test.echo")
    with pytest.raises(DiscoError, match="argument 1 is a tensor.*copy_to_worker_0"):
        echo(1, np.zeros(3))
    with pytest.raises(DiscoError, match="argument 0 has unsupported type builtins.dict"):
        echo({"a": 1})


def test_empty_copy_roundtrip_and_dref_args(sess: Session) -> None:
    host = np.arange(12, dtype="float32").reshape(3, 4)
    remote = sess.copy_to_worker_0(host)
    plus = sess.get_global_func("test.add_one")
    out = np.empty_like(host)
    sess.copy_from_worker_0(out, remote)
    np.testing.assert_array_equal(out, host)
    # worker0_only: the other workers hold None
    if sess.num_workers > 1:
        assert remote.debug_get_from_remote(1) is None
    full = sess.empty((3, 4), "float32")
    sess.copy_to_worker_0(host, full)
    result = plus(full)
    sess.copy_from_worker_0(out, result)
    np.testing.assert_array_equal(out, host + 1)


def test_copies_into_and_out_of_an_ndarray_register(sess: Session) -> None:
    host = np.arange(6, dtype="float32").reshape(2, 3)
    remote = sess.get_global_func("test.nd_empty")((2, 3), "float32")
    sess.copy_to_worker_0(host, remote)
    out = np.zeros_like(host)
    sess.copy_from_worker_0(out, remote)
    np.testing.assert_array_equal(out, host)


def test_large_copies_round_trip(sess: Session) -> None:
    host = np.random.default_rng(1).standard_normal(1 << 18)  # 2 MB: the synchronous path
    remote = sess.copy_to_worker_0(host)
    host[:] = 0  # the copy already happened
    out = np.empty_like(host)
    sess.copy_from_worker_0(out, remote)
    assert out.std() > 0.5


def test_copy_layout_mismatch_is_clear(sess: Session) -> None:
    remote = sess.empty((2, 2), "float32")
    with pytest.raises(DiscoError, match=r"host array is \(3,\) float32.*\(2, 2\) float32"):
        sess.copy_from_worker_0(np.empty(3, "float32"), remote)
    with pytest.raises(DiscoError, match="writable numpy.ndarray"):
        sess.copy_from_worker_0([1, 2], remote)  # type: ignore[arg-type]


def test_debug_set_and_get_on_each_worker(sess: Session) -> None:
    ref = sess.empty((2,), "int64")
    for w in range(sess.num_workers):
        ref.debug_copy_from(w, np.array([w, -w]))
    for w in range(sess.num_workers):
        np.testing.assert_array_equal(ref.debug_get_from_remote(w), [w, -w])
    ref.debug_copy_from(0, "a string")
    assert ref.debug_get_from_remote(0) == "a string"


def test_sync_worker_and_sync_all(sess: Session) -> None:
    fill = sess.get_global_func("test.fill_worker_id")
    x = sess.empty((4,), "int32")
    fill(x)
    sess.sync_worker(sess.num_workers - 1)
    sess.sync_all()
    sess.sync_worker_0(timeout=5)
    assert x.debug_get_from_remote(sess.num_workers - 1)[0] == sess.num_workers - 1


def test_register_zero_reserved_and_ids_reused(sess: Session) -> None:
    first = sess.empty((1,), "float32")
    assert first.reg_id > 0
    reg = first.reg_id
    del first
    again = sess.empty((1,), "float32")  # the freed id rides along and is reused
    assert again.reg_id == reg
    sess.sync_all()


def test_freed_register_is_killed_on_workers(sess: Session) -> None:
    ref = sess.empty((3,), "float32")
    reg = ref.reg_id
    del ref
    sess.get_global_func("test.echo")  # carries the free
    sess.sync_all()
    with pytest.raises(DiscoError, match=f"bad register id {reg}"):
        sess.debug_get_from_remote(reg, 0)


def test_bad_worker_and_register_ids(sess: Session) -> None:
    ref = sess.empty((1,), "float32")
    n = sess.num_workers
    with pytest.raises(DiscoError, match=rf"bad worker id {n}: this session has {n} worker"):
        ref.debug_get_from_remote(n)
    with pytest.raises(DiscoError, match="bad worker id -1"):
        sess.sync_worker(-1)
    with pytest.raises(DiscoError, match="bad register id 0.*register 0 is reserved"):
        sess.debug_get_from_remote(0, 0)
    with pytest.raises(DiscoError, match="bad register id 99999"):
        sess.debug_set_register(99999, 1, 0)


def test_host_helpers_broadcast_and_scatter(sess: Session) -> None:
    n = sess.num_workers
    host = np.arange(n * 3, dtype="float64").reshape(n, 3)
    b = sess.broadcast(host)
    s = sess.scatter(host)
    for w in range(n):
        np.testing.assert_array_equal(b.debug_get_from_remote(w), host)
        np.testing.assert_array_equal(s.debug_get_from_remote(w), host[w])
    with pytest.raises(DiscoError, match="one slot per worker"):
        sess.scatter(np.zeros((n + 1, 2)))


def test_point_to_point(sess: Session) -> None:
    if sess.num_workers < 2:
        pytest.skip("point-to-point needs two workers")
    x = sess.empty((5,), "float32")
    out = sess.empty((5,), "float32")
    for w in range(sess.num_workers):
        x.debug_copy_from(w, np.full(5, w * 10, "float32"))
        out.debug_copy_from(w, np.zeros(5, "float32"))
    sess.get_global_func("test.ring")(x, out)
    sess.sync_all()
    for w in range(1, sess.num_workers, 2):
        np.testing.assert_array_equal(out.debug_get_from_remote(w), (w - 1) * 10)


def test_unknown_ccl_and_wrong_device_ids(sess: Session) -> None:
    with pytest.raises(DiscoError, match="unknown ccl 'gloo'; expected one of: cpu, mpi, nccl"):
        sess.init_ccl("gloo")
    with pytest.raises(DiscoError, match="expected one per worker"):
        sess.init_ccl("cpu", *range(sess.num_workers + 1))
    with pytest.raises(DiscoError, match="needs MPISession"):
        sess.init_ccl("mpi")


def test_drefs_of_another_session_are_refused(sess: Session) -> None:
    from graph_runtime.disco import ThreadedSession
    with ThreadedSession(1) as other:
        foreign = other.empty((1,), "float32")
        echo = sess.get_global_func("test.echo")
        with pytest.raises(DiscoError, match="belongs to another session"):
            echo(foreign)
        assert isinstance(foreign, DRef)


@pytest.mark.parametrize("kind", ["threaded-inline", "process-inline"])
@pytest.mark.parametrize("n", SIZES)
def test_inline_worker0_has_run_its_share_when_call_packed_returns(kind: str, n: int) -> None:
    import disco_testfuncs
    sess = make_session(kind, n)
    try:
        disco_testfuncs.RECORDED.clear()
        record = sess.get_global_func("test.record")
        for i in range(3):
            record(i)
            assert disco_testfuncs.RECORDED == list(range(i + 1))  # no sync needed
        # worker-0's context is current only while it runs: between calls the controller is
        # no worker
        from graph_runtime.disco import get_global_func
        with pytest.raises(DiscoError, match="only work inside a Disco worker"):
            get_global_func("runtime.disco.worker_id")()
    finally:
        sess.shutdown()
