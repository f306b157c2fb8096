"""Failure behaviour: worker errors, dead workers, timeouts, shutdown, hang-up; never a hang."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from disco_support import KINDS as ALL_KINDS
from disco_support import make_session

from graph_runtime.disco import ProcessSession, Session, ThreadedSession
from graph_runtime.errors import DiscoError

KINDS = list(ALL_KINDS)
PROCESS_KINDS = ["process", "process-inline"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is as good as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], limit: float = 10.0) -> list[int]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.fixture(scope="module", params=KINDS)
def pair(request: pytest.FixtureRequest) -> Session:
    session = make_session(request.param, 2, timeout=20.0)
    yield session
    session.shutdown()


def test_user_exception_names_worker_and_carries_traceback(pair: Session) -> None:
    pair.get_global_func("test.raise_on")(1)
    with pytest.raises(DiscoError) as info:
        pair.sync_all()
    text = str(info.value)
    assert "worker 1 failed in call_packed" in text
    assert "Traceback" in text and "ValueError: boom on worker 1" in text
    assert "disco_testfuncs.py" in text
    pair.sync_all()  # reported once; the session stays usable


def test_missing_global_function(pair: Session) -> None:
    pair.get_global_func("no.such.function")
    with pytest.raises(DiscoError, match="(?s)worker 0 failed in get_global_func.*no global "
                                         "function 'no.such.function'"):
        pair.sync_all()  # sync_all: both workers' errors are in by then


def test_register_of_a_failed_call_says_why(pair: Session) -> None:
    bad = pair.get_global_func("test.add_one")("not an array")
    with pytest.raises(DiscoError):
        pair.sync_all()
    with pytest.raises(DiscoError, match="(?s)register .* has no value because call_packed"):
        bad.debug_get_from_remote(0)


def test_collective_before_init_ccl(pair: Session) -> None:
    x = pair.empty((2,), "float32")
    pair.allreduce(x, x, "sum")
    with pytest.raises(DiscoError, match="allreduce on worker 0: no collective library; call "
                                         "sess.init_ccl"):
        pair.sync_all()
    pair.sync_all()


def test_collective_of_a_host_array_is_refused_on_the_controller(pair: Session) -> None:
    dst = pair.empty((2,), "float32")
    with pytest.raises(DiscoError, match=r"allreduce: src must be a DRef of this session .*got "
                                         r"array\(\[0\., 0\.\]"):
        pair.allreduce(np.zeros(2), dst, "sum")
    with pytest.raises(DiscoError, match="gather_to_worker0: dst must be a DRef of this session"):
        pair.gather_to_worker0(dst, None)  # type: ignore[arg-type]
    pair.sync_all()  # nothing was sent: the session is fine


def test_collective_with_bad_register_aborts_everywhere(pair: Session) -> None:
    pair.init_ccl("cpu")
    fail = pair.get_global_func("test.add_one")("x")  # a register that failed on every worker
    dst = pair.empty((2,), "float32")
    pair.allreduce(fail, dst, "sum")
    with pytest.raises(DiscoError, match="(?s)has no value"):
        pair.sync_all()
    ok = pair.empty((2,), "float32")
    pair.allreduce(ok, dst, "sum")
    pair.sync_all()


@pytest.mark.parametrize("kind", KINDS)
def test_collective_that_peers_never_join_times_out(kind: str) -> None:
    sess = make_session(kind, 2, timeout=1.5)
    try:
        sess.init_ccl("cpu")
        x = sess.empty((2,), "float32")
        sess.get_global_func("test.allreduce_only_on")(1, x)
        start = time.monotonic()
        with pytest.raises(DiscoError, match=r"(?s)allreduce on worker 1: timed out after 1.2 s "
                                             r"waiting for the other workers"):
            sess.sync_all()
        assert time.monotonic() - start < 10
    finally:
        sess.shutdown()


# NOTE: thread kinds only: an inline worker-0 runs test.sleep inside call_packed, where no timeout
# applies (see test_inline_sync_of_a_slow_worker_times_out for what inline sessions keep)
@pytest.mark.parametrize("kind", ["threaded", "process"])
def test_blocking_call_times_out_instead_of_hanging(kind: str) -> None:
    sess = make_session(kind, 2)
    try:
        sess.get_global_func("test.sleep")(3.0)
        with pytest.raises(DiscoError, match="did not answer sync_worker_0 within 0.2 s"):
            sess.sync_worker_0(timeout=0.2)
        with pytest.raises(DiscoError, match="is broken"):
            sess.sync_worker_0()
    finally:
        sess.shutdown()


@pytest.mark.parametrize("kind", PROCESS_KINDS)
def test_dead_worker_is_detected(kind: str) -> None:
    sess = make_session(kind, 2, timeout=30.0)
    try:
        sess.get_global_func("test.exit_on")(1)
        start = time.monotonic()
        with pytest.raises(DiscoError, match=r"worker 1 \(pid \d+\) died \(exit code 3\)"):
            sess.sync_worker(1)
        assert time.monotonic() - start < 5
        with pytest.raises(DiscoError, match="broken"):
            sess.get_global_func("test.echo")
    finally:
        sess.shutdown()


@pytest.mark.parametrize("kind", PROCESS_KINDS)
def test_killed_worker_is_detected_by_sync_worker_0(kind: str) -> None:
    sess = make_session(kind, 2, timeout=30.0)
    try:
        pid = sess.get_global_func("test.pid")().debug_get_from_remote(1)
        os.kill(pid, signal.SIGKILL)
        _wait_gone([pid])
        with pytest.raises(DiscoError, match="worker 1 .*died \\(killed by SIGKILL\\)"):
            for _ in range(3):
                sess.sync_worker_0()
                time.sleep(0.2)
    finally:
        sess.shutdown()


@pytest.mark.parametrize("kind", ["threaded-inline", "process-inline"])
def test_inline_sync_of_a_slow_worker_times_out(kind: str) -> None:
    sess = make_session(kind, 2)
    try:
        sess.get_global_func("test.sleep_on")(1, 3.0)
        with pytest.raises(DiscoError, match=r"did not answer sync_worker\(1\) within 0.2 s"):
            sess.sync_worker(1, timeout=0.2)
        with pytest.raises(DiscoError, match="is broken"):
            sess.sync_worker_0()
    finally:
        sess.shutdown()


def test_worker0_error_surfaces_at_the_next_blocking_call(pair: Session) -> None:
    pair.get_global_func("test.raise_on")(0)  # inline too: the call itself does not raise
    with pytest.raises(DiscoError) as info:
        pair.sync_worker_0()
    text = str(info.value)
    assert text.startswith("sync_worker_0: worker 0 failed in call_packed")
    assert "Traceback" in text and "ValueError: boom on worker 0" in text
    pair.sync_worker_0()  # reported once; the session stays usable
    pair.sync_all()


_ENDED = (r"worker 1 (thread ended \(SystemExit: 3\)|\(pid \d+\) died \(exit code 3\)|"
          r"has exited|exited mid-send)")


@pytest.mark.parametrize("kind", KINDS)
def test_worker_that_ends_mid_collective_is_reported_at_once(kind: str) -> None:
    # worker-0 waits for worker 1 in the allreduce (inline: in the controller's own thread);
    # the data-plane timeout is 24 s, so only noticing the end stops it within seconds
    sess = make_session(kind, 2, timeout=30.0)
    try:
        sess.init_ccl("cpu")
        x = sess.empty((4,), "float32")
        sess.get_global_func("test.system_exit_on")(1)
        start = time.monotonic()
        with pytest.raises(DiscoError, match=_ENDED):
            sess.allreduce(x, x, "sum")
            sess.sync_worker_0()
        assert time.monotonic() - start < 10
        with pytest.raises(DiscoError, match=r"worker 1 .*(ended|died)"):
            sess.sync_all()
    finally:
        sess.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_worker_that_ends_before_a_send_is_reported_at_once(kind: str) -> None:
    sess = make_session(kind, 2, timeout=30.0)
    try:
        sess.init_ccl("cpu")
        out = sess.empty((3,), "float32")
        sess.get_global_func("test.system_exit_on")(1)
        start = time.monotonic()
        with pytest.raises(DiscoError, match=_ENDED):
            sess.get_global_func("test.recv_on")(0, 1, out)  # worker 1 never sends
            sess.sync_worker_0()
        assert time.monotonic() - start < 10
    finally:
        sess.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_worker0_that_ends_breaks_the_session(kind: str) -> None:
    sess = make_session(kind, 2, timeout=30.0)
    try:
        sess.get_global_func("test.system_exit_on")(0)  # inline: SystemExit stays inside
        with pytest.raises(DiscoError, match=r"worker 0 (thread )?ended .*SystemExit: 3"):
            sess.sync_worker_0()
        with pytest.raises(DiscoError, match="is broken"):
            sess.get_global_func("test.echo")
    finally:
        sess.shutdown()


@pytest.mark.parametrize("kind", ["threaded-inline", "process-inline"])
def test_inline_worker0_waiting_on_a_later_command_times_out(kind: str) -> None:
    # the documented limit of inline mode: worker-0's recv blocks the controller before the
    # command with the matching send goes out, so it ends at the data-plane timeout (1.2 s)
    sess = make_session(kind, 2, timeout=1.5)
    try:
        sess.init_ccl("cpu")
        buf = sess.empty((3,), "float32")
        sess.get_global_func("test.recv_on")(0, 1, buf)
        sess.get_global_func("test.send_on")(1, 0, buf)
        with pytest.raises(DiscoError, match=r"worker 0: recv from worker 1 timed out after "
                                             r"1.2 s \(no matching send\)"):
            sess.sync_all()
    finally:
        sess.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_call_after_shutdown_raises(kind: str) -> None:
    sess = make_session(kind, 2)
    func = sess.get_global_func("test.echo")
    sess.shutdown()
    sess.shutdown()  # idempotent
    for call in (lambda: func(1), sess.sync_worker_0, lambda: sess.empty((1,), "float32"),
                 lambda: sess.copy_from_worker_0(np.empty(1), func)):
        with pytest.raises(DiscoError, match="is shut down"):
            call()


def test_shutdown_leaves_no_child() -> None:
    sess = ProcessSession(4)
    pids = [c.proc.pid for c in sess._children]
    assert all(_alive(p) for p in pids)
    sess.shutdown()
    assert _wait_gone(pids, 5.0) == []


def _run_controller(body: str) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import sys, time
        from graph_runtime.disco import ProcessSession
        sess = ProcessSession(3)
        print(" ".join(str(c.proc.pid) for c in sess._children), flush=True)
        {body}
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_interpreter_exit_leaves_no_child() -> None:
    proc = _run_controller("pass  # no shutdown(): atexit must clean up")
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert proc.wait(timeout=30) == 0
    assert len(pids) == 2 and _wait_gone(pids, 5.0) == []


def test_killing_the_controller_makes_workers_exit() -> None:
    proc = _run_controller("time.sleep(60)")
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert all(_alive(p) for p in pids)
    proc.kill()
    proc.wait(timeout=10)
    assert _wait_gone(pids, 10.0) == []


def test_bad_session_arguments() -> None:
    with pytest.raises(DiscoError, match="num_workers must be a positive int"):
        ThreadedSession(0)
    with pytest.raises(DiscoError, match="num_groups must be a positive int dividing "
                                         "num_workers \\(3\\)"):
        ThreadedSession(3, num_groups=2)
