"""ProcessSession: worker-0 lives in the controller process, the others are children on pipes."""
from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from ..errors import DiscoError
from .ccl import CpuCcl
from .comm import ShmComm, SocketP2P
from .globals import WorkerContext, set_current
from .nccl import nccl_factory
from .protocol import (NO_FRAME, Command, FrameReader, encode_frame, pack_value, send_frame,
                       unpack_value, write_all)
from .session import DATA_PLANE_SHARE, Session
from .worker import InlineWorker, LocalWorker, Worker


class ProcessSession(Session):
    """A Disco session backed by child processes (TVM's ProcessSession,
    python/tvm/runtime/disco/session.py).

    Commands travel as pickled frames on pipes; tensors never do: collectives go through a
    shared-memory arena (memfd), copies to/from worker-0 stay inside the controller process.

    Worker-0 is a thread of the controller by default; with inline_worker0=True it runs in the
    caller's thread instead: a command for every worker is written to the children first (so
    collectives can match), then worker-0's share runs before the call returns, and
    sync_worker_0 / copies to and from worker-0 need no thread switch. The children's work
    stays asynchronous. What inline mode gives up: worker-0's share has no timeout (a worker-0
    function that hangs hangs the caller; collectives and point-to-point still end at their
    data-plane timeout, at once when a child exits), and worker-0 must never wait for
    something only a later command provides (e.g. a recv whose matching send comes after it).
    """

    def __init__(self, num_workers: int, num_groups: int = 1, timeout: float = 120.0,
                 startup_timeout: float = 60.0, inline_worker0: bool = False) -> None:
        super().__init__(num_workers, num_groups, timeout)
        self._inline0 = bool(inline_worker0)
        n = num_workers
        self._children: list[_Child] = []
        self._memfds = [os.memfd_create("graph_runtime_disco_world")] + [
            os.memfd_create(f"graph_runtime_disco_group{g}") for g in range(num_groups)]
        # one socketpair per pair of workers for barriers, one for point-to-point data;
        # the lower worker id keeps end 0
        self._sync_pairs = {(a, b): socket.socketpair() for a in range(n) for b in range(a + 1, n)}
        self._p2p_pairs = {(a, b): socket.socketpair() for a in range(n) for b in range(a + 1, n)}
        try:
            for wid in range(1, n):
                self._children.append(self._spawn(wid))
            for pair, socks in list(self._sync_pairs.items()) + list(self._p2p_pairs.items()):
                if pair[0] != 0:  # children own these now
                    socks[0].close()
                    socks[1].close()
                else:
                    socks[1].close()
            local_sync = {b: self._sync_pairs[(0, b)][0] for b in range(1, n)}
            local_p2p = {b: self._p2p_pairs[(0, b)][0] for b in range(1, n)}
            ctx = _context(0, n, num_groups, self.timeout * DATA_PLANE_SHARE, self._memfds,
                           local_sync, local_p2p)
            kind = InlineWorker if self._inline0 else LocalWorker
            self.worker0: Any = kind(ctx, self._worker0_ended)
            self._submit0 = self.worker0.submit
            self._await_ready(startup_timeout)
            self._poll = select.poll()
            for child in self._children:
                self._poll.register(child.rep_r, select.POLLIN)
            self._wid_of_fd = {child.rep_r: child.wid for child in self._children}
        except BaseException:
            self._closed = True
            self._terminate()
            raise

    # ---- startup -------------------------------------------------------------------------------

    def _spawn(self, wid: int) -> _Child:
        cmd_r, cmd_w = os.pipe()
        rep_r, rep_w = os.pipe()
        sync = {peer: self._end(self._sync_pairs, wid, peer) for peer in range(self._num_workers)
                if peer != wid}
        p2p = {peer: self._end(self._p2p_pairs, wid, peer) for peer in range(self._num_workers)
               if peer != wid}
        fds = [cmd_r, rep_w, *self._memfds, *sync.values(), *p2p.values()]
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in [
            env.get("PYTHONPATH")] if p])
        proc = subprocess.Popen([sys.executable, "-m", "graph_runtime.disco.process",
                                 str(cmd_r), str(rep_w)], pass_fds=fds, env=env,
                                stdin=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(rep_w)
        _grow_pipe(cmd_w)
        os.set_blocking(cmd_w, False)
        os.set_blocking(rep_r, False)
        child = _Child(wid, proc, cmd_w, rep_r)
        init = {"worker_id": wid, "num_workers": self._num_workers,
                "num_groups": self.num_groups, "timeout": self.timeout * DATA_PLANE_SHARE,
                "sys_path": list(sys.path), "memfds": self._memfds, "sync": sync, "p2p": p2p}
        write_all(cmd_w, encode_frame(init), time.monotonic() + self.timeout, f"worker {wid}")
        return child

    def _end(self, pairs: dict, wid: int, peer: int) -> int:
        a, b = min(wid, peer), max(wid, peer)
        return pairs[(a, b)][0 if wid == a else 1].fileno()

    def _await_ready(self, limit: float) -> None:
        deadline = time.monotonic() + limit
        for child in self._children:
            while True:
                reply = self._read_child(child, deadline - time.monotonic())
                if reply is not None:
                    break
                if time.monotonic() >= deadline:
                    raise DiscoError(f"worker {child.wid} (pid {child.proc.pid}) did not start "
                                     f"within {limit:g} s")
            if reply[0] != "ready":
                raise DiscoError(f"worker {child.wid} failed to start: {reply[2]}")

    def _worker0_ended(self, reason: str) -> None:
        """Worker-0 ended without SHUTDOWN: hang up its data-plane sockets, so children waiting
        for it in a barrier or a recv see end of file now, not at their timeout."""
        for (a, _), socks in list(self._sync_pairs.items()) + list(self._p2p_pairs.items()):
            if a == 0:
                socks[0].close()

    # ---- transport -----------------------------------------------------------------------------

    def _send(self, cmd: Command, worker_id: int | None) -> None:
        if worker_id == 0:
            self._submit0(cmd)
            return
        frame = encode_frame(cmd)
        if worker_id is None:
            for child in self._children:
                self._write(child, frame)
            # NOTE: worker-0 last: a thread is not woken while the controller still has writes
            # to do, and inline it runs now and may wait for the children's share
            self._submit0(cmd)
        else:
            self._write(self._children[worker_id - 1], frame)

    def _write(self, child: _Child, frame: bytes) -> None:
        try:
            send_frame(child.cmd_w, frame, time.monotonic() + self.timeout, f"worker {child.wid}")
        except DiscoError as e:
            self._check_alive()
            self._broken = str(e)
            raise

    def _get_reply(self, worker_id: int, timeout: float) -> tuple | None:
        if worker_id == 0:
            return self.worker0.next_reply(timeout)
        reply = self._read_child(self._children[worker_id - 1], timeout)
        if reply is not None:
            reply = (reply[0], reply[1], unpack_value(reply[2]))
        return reply

    def _read_child(self, child: _Child, timeout: float) -> tuple | None:
        frame = child.reader.next_frame()
        if frame is not NO_FRAME:
            return frame
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            wait = [child.rep_r] + ([child.pidfd] if child.pidfd is not None else [])
            ready, _, _ = select.select(wait, [], [], max(deadline - time.monotonic(), 0.0))
            if child.rep_r in ready:
                if not child.reader.fill():
                    self._dead(child)
                frame = child.reader.next_frame()
                if frame is not NO_FRAME:
                    return frame
            elif ready:
                self._dead(child)
            if time.monotonic() >= deadline:
                return None

    def _dead(self, child: _Child) -> None:
        try:
            code = child.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        how = _exit_text(code)
        raise DiscoError(f"worker {child.wid} (pid {child.proc.pid}) died ({how})")

    def _ready_workers(self) -> list[int]:
        ready = [0] if self.worker0.has_reply() else []
        ready += [c.wid for c in self._children if c.reader.next_frame_ready()]
        ready += [self._wid_of_fd[fd] for fd, _ in self._poll.poll(0)]
        return ready

    def _check_alive(self) -> None:
        for child in self._children:
            if child.proc.poll() is not None:
                self._broken = (f"worker {child.wid} (pid {child.proc.pid}) died "
                                f"({_exit_text(child.proc.returncode)})")
                raise DiscoError(self._broken)
        self.worker0.check_alive()

    def _pack(self, value: Any, worker_id: int) -> Any:
        return value if worker_id == 0 else pack_value(value)

    def _terminate(self) -> None:
        worker0 = getattr(self, "worker0", None)
        if worker0 is not None:
            worker0.stop()
        for child in self._children:
            _close(child.cmd_w)  # hang-up: the child exits at end of file
        for socks in list(self._sync_pairs.values()) + list(self._p2p_pairs.values()):
            for sock in socks:
                sock.close()
        for child in self._children:
            try:
                child.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait(timeout=5.0)
            _close(child.rep_r)
            if child.pidfd is not None:
                _close(child.pidfd)
        for fd in self._memfds:
            _close(fd)
        self._memfds = []
        if worker0 is not None:
            worker0.join(2.0)


class _Child:
    """The controller's handles on one worker process."""

    def __init__(self, wid: int, proc: subprocess.Popen, cmd_w: int, rep_r: int) -> None:
        self.wid = wid
        self.proc = proc
        self.cmd_w = cmd_w
        self.rep_r = rep_r
        self.reader = FrameReader(rep_r)
        try:
            self.pidfd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self.pidfd = None


def _grow_pipe(fd: int) -> None:
    """Let a command pipe hold a long stream (Linux: up to pipe-max-size, 1 MiB by default):
    a controller blocked on a full pipe wakes for every few commands the worker reads, and each
    wake-up takes the GIL from worker-0."""
    try:
        import fcntl
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass  # keep the default size


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running but not answering"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _context(wid: int, n: int, num_groups: int, timeout: float, memfds: list[int],
             sync: dict[int, socket.socket], p2p: dict[int, socket.socket]) -> WorkerContext:
    """A worker's context whose "cpu" ccl runs over the session's arenas and sockets."""

    def make_cpu(ctx: WorkerContext, device_ids: tuple[int, ...], extra: tuple) -> CpuCcl:
        world = _shm_comm(ctx.worker_id, list(range(n)), memfds[0], sync, timeout)
        size = ctx.group_size
        members = list(range(ctx.group_id * size, (ctx.group_id + 1) * size))
        group = _shm_comm(ctx.worker_id, members, memfds[1 + ctx.group_id], sync, timeout)
        return CpuCcl(ctx.worker_id, world, group, SocketP2P(ctx.worker_id, p2p, timeout))

    return WorkerContext(wid, n, num_groups, timeout=timeout,
                         ccl_factories={"cpu": make_cpu, "nccl": nccl_factory})


def _shm_comm(wid: int, members: list[int], fd: int, sync: dict[int, socket.socket],
              timeout: float) -> ShmComm:
    peers = {r: sync[m] for r, m in enumerate(members) if m != wid}
    return ShmComm(members.index(wid), members, fd, peers, timeout)


def _child_main(cmd_fd: int, rep_fd: int) -> None:
    """A worker process: read the init frame, say ready, then run commands until hang-up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
    reader = FrameReader(cmd_fd)

    def reply(message: tuple) -> None:
        try:
            write_all(rep_fd, encode_frame(message), time.monotonic() + 3600.0, "controller")
        except DiscoError:
            os._exit(0)  # the controller is gone: hang-up means shutdown

    first = reader.read_frames()
    if not first:
        return
    init = first[0]
    sys.path[:] = init["sys_path"]
    sync = {peer: socket.socket(fileno=fd) for peer, fd in init["sync"].items()}
    p2p = {peer: socket.socket(fileno=fd) for peer, fd in init["p2p"].items()}
    ctx = _context(init["worker_id"], init["num_workers"], init["num_groups"], init["timeout"],
                   init["memfds"], sync, p2p)
    set_current(ctx)
    from . import builtins  # noqa: F401  (registers runtime.disco.*)
    worker = Worker(ctx, reply, pack=pack_value, unpack=unpack_value)
    reply(("ready", True, os.getpid()))
    execute = worker.execute
    commands: list | None = first[1:]
    while commands is not None:
        for cmd in commands:
            if not execute(cmd):
                commands = None
                break
        else:
            commands = reader.read_frames()  # None at end of file: the controller hung up
    if ctx.ccl is not None:
        ctx.ccl.close()


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), int(sys.argv[2]))
    sys.stdout.flush()
    os._exit(0)
