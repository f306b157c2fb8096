"""MPISession and the "mpi" ccl: workers are MPI ranks started by mpiexec (mpi4py)."""
from __future__ import annotations

import os
import pickle
import struct
import sys
import time
from collections import deque
from typing import Any

import numpy as np

from ..errors import DiscoError
from .ccl import average_in_place, check_dst, host_tensor
from .globals import WorkerContext, set_current
from .nccl import nccl_factory
from .protocol import Command
from .session import DATA_PLANE_SHARE, Session
from .worker import LocalWorker, Worker

_CMD, _REPLY, _P2P = 11, 12, 13
_LOOKAHEAD = 16  # commands worker-0 forwards (in one message) before running the first
_LENGTH = struct.Struct("<I")  # the length before each command's pickle in a message


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DiscoError("MPISession needs mpi4py and an MPI (pip install mpi4py mpich); run "
                         "the program as: mpiexec -n N python program.py") from e
    return MPI


class MPISession(Session):
    """A Disco session over MPI ranks: rank 0 is the controller and worker-0; every other rank
    serves inside this constructor and exits the program when the session shuts down.

    Run it as `mpiexec -n N python program.py` (with a hostfile across machines); every rank
    must reach MPISession() (it is collective). Worker-0's thread forwards each command to the
    other ranks before running it, so during a stream of collectives one thread per rank talks
    MPI and the controller thread never competes with it for MPI's locks.
    """

    def __init__(self, num_groups: int = 1, timeout: float = 120.0) -> None:
        MPI = _mpi()
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise DiscoError("MPISession needs MPI_THREAD_MULTIPLE (worker-0 is a thread next to "
                             "the controller); this MPI provides level "
                             f"{MPI.Query_thread()}")
        world = MPI.COMM_WORLD
        n, rank = world.Get_size(), world.Get_rank()
        if not isinstance(num_groups, int) or num_groups < 1 or n % num_groups:
            raise DiscoError(f"num_groups must be a positive int dividing the number of MPI "
                             f"ranks ({n}), got {num_groups!r}")
        ctl = world.Dup()
        data = world.Dup()
        group = data.Split(rank // (n // num_groups), rank)
        if rank != 0:
            _serve(_context(rank, n, num_groups, timeout * DATA_PLANE_SHARE, data, group), ctl)
            sys.stdout.flush()
            sys.exit(0)
        super().__init__(n, num_groups, timeout)
        self._ctl = ctl
        self._all_ranks = tuple(range(1, n))
        self.worker0 = _ForwardingWorker(
            _context(0, n, num_groups, timeout * DATA_PLANE_SHARE, data, group), ctl)
        deadline = time.monotonic() + timeout
        for wid in range(1, n):
            reply = self._get_reply(wid, deadline - time.monotonic())
            if reply is None or reply[0] != "ready":
                raise DiscoError(f"MPI rank {wid} did not report ready within {timeout:g} s")

    def _check_ccl(self, ccl: str) -> None:
        if ccl == "cpu":
            raise DiscoError("ccl 'cpu' is shared memory on one machine; MPISession uses 'mpi' "
                             "(or 'nccl' on GPUs)")

    def _send(self, cmd: Command, worker_id: int | None) -> None:
        if worker_id == 0:
            self.worker0.commands.put((None, (), cmd))
        elif worker_id is None:
            self.worker0.commands.put((_encode(cmd), self._all_ranks, cmd))
        else:
            self.worker0.commands.put((_encode(cmd), (worker_id,), None))

    def _get_reply(self, worker_id: int, timeout: float) -> tuple | None:
        if worker_id == 0:
            return self.worker0.next_reply(timeout)
        if not _poll(lambda: self._ctl.Iprobe(source=worker_id, tag=_REPLY), timeout):
            return None
        return self._ctl.recv(source=worker_id, tag=_REPLY)

    def _check_alive(self) -> None:
        # NOTE: a dead rank makes mpiexec abort the whole job; only worker-0 can end alone.
        self.worker0.check_alive()

    def _terminate(self) -> None:
        self.worker0.commands.put(None)
        self.worker0.thread.join(timeout=2.0)


def _encode(cmd: Command) -> bytes:
    """A length-prefixed pickle, encoded when the command is issued (its arguments are
    snapshotted then); several frames concatenated make one message."""
    data = pickle.dumps(cmd, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


class _ForwardingWorker(LocalWorker):
    """Worker-0 of an MPISession: queue items are (frame, ranks, cmd); it sends frame to ranks,
    then runs cmd (None when the command is for other ranks only); None ends the thread."""

    def __init__(self, ctx: WorkerContext, ctl: Any) -> None:
        self.ctl = ctl
        self.byte = _mpi().BYTE
        self.in_flight: deque = deque()  # (request, frame): a frame lives until its send is done
        super().__init__(ctx)

    def _serve(self) -> None:
        commands = self.commands
        execute = self.worker.execute
        isend = self.ctl.Isend
        byte = self.byte
        in_flight = self.in_flight
        mine: deque = deque()  # forwarded, still to run here
        batch: list[bytes] = []  # frames for batch_ranks not sent yet
        batch_ranks: tuple[int, ...] = ()
        running = True

        def flush() -> None:
            if batch:
                payload = batch[0] if len(batch) == 1 else b"".join(batch)
                for rank in batch_ranks:
                    in_flight.append((isend([payload, byte], dest=rank, tag=_CMD), payload))
                batch.clear()

        while True:
            # NOTE: forward the queued commands ahead of running them, so the other ranks have
            # their next command while this one runs. Consecutive commands for the same ranks
            # travel as one message: a message per command costs more than a 1 KB allreduce,
            # and every message waiting unmatched at a rank slows down each receive there.
            # Refill only when few are left, so that a stream goes out in messages of several.
            refill = len(mine) <= _LOOKAHEAD // 4
            while not mine or (refill and len(mine) < _LOOKAHEAD and not commands.empty()):
                if not mine and commands.empty():
                    # MPI moves a non-blocking send only while someone drives progress: finish
                    # them before sleeping. This worker has run all its commands, so no peer
                    # waits for it in a collective: this cannot deadlock.
                    flush()
                    for request, _ in in_flight:
                        request.Wait()
                    in_flight.clear()
                item = commands.get()
                if item is None:  # the session is done: no more commands to run or forward
                    flush()
                    for request, _ in in_flight:
                        request.Wait()
                    return
                frame, ranks, cmd = item
                if ranks:
                    if ranks != batch_ranks:
                        flush()
                        batch_ranks = ranks
                    batch.append(frame)
                if cmd is not None:
                    mine.append(cmd)
            flush()
            while in_flight and in_flight[0][0].Test():
                in_flight.popleft()
            cmd = mine.popleft()
            if running:
                # after its own SHUTDOWN worker-0 still forwards the other ranks' SHUTDOWNs
                running = execute(cmd)


def _poll(probe: Any, timeout: float, spin: float = 50e-6) -> bool:
    """Call probe until it is true or timeout passes: spin for `spin` seconds, then back off
    to 2 ms sleeps (MPI has no blocking wait with a timeout)."""
    if probe():
        return True
    now = time.monotonic()
    deadline = now + max(timeout, 0.0)
    spin_until = now + spin
    delay = 0.0
    while not probe():
        now = time.monotonic()
        if now >= deadline:
            return False
        if now > spin_until:
            delay = min(0.002, delay + 0.00005)
            time.sleep(delay)
    return True


def _serve(ctx: WorkerContext, ctl: Any) -> None:
    """A serving rank: execute commands from rank 0 until SHUTDOWN."""
    set_current(ctx)
    MPI = _mpi()

    def reply(message: tuple) -> None:
        ctl.send(message, dest=0, tag=_REPLY)

    worker = Worker(ctx, reply)
    execute = worker.execute
    status = MPI.Status()
    iprobe = ctl.Iprobe
    buf = bytearray(1 << 16)
    reply(("ready", True, os.getpid()))
    while True:
        # NOTE: a rank between commands spins a little (streams of commands arrive back to
        # back), then sleeps; an idle rank wakes at most every 2 ms.
        if not iprobe(source=0, tag=_CMD, status=status):
            _poll(lambda: iprobe(source=0, tag=_CMD, status=status), float("inf"), spin=200e-6)
        size = status.Get_count(MPI.BYTE)
        if size > len(buf):
            buf = bytearray(size)
        ctl.Recv([buf, size, MPI.BYTE], source=0, tag=_CMD)
        if not _run_frames(execute, memoryview(buf)[:size]):
            break
    if ctx.ccl is not None:
        ctx.ccl.close()


def _run_frames(execute: Any, message: memoryview) -> bool:
    """Execute each command of a message in order; False once one of them was SHUTDOWN."""
    offset = 0
    while offset < len(message):
        (size,) = _LENGTH.unpack_from(message, offset)
        offset += _LENGTH.size
        if not execute(pickle.loads(message[offset:offset + size])):
            return False
        offset += size
    return True


def _context(rank: int, n: int, num_groups: int, timeout: float, data: Any,
             group: Any) -> WorkerContext:
    def make_mpi(ctx: WorkerContext, device_ids: tuple[int, ...], extra: tuple) -> MpiCcl:
        return MpiCcl(ctx.worker_id, data, group)

    return WorkerContext(rank, n, num_groups, timeout=timeout,
                         ccl_factories={"mpi": make_mpi, "nccl": nccl_factory})


class MpiCcl:
    """The "mpi" data plane: mpi4py buffer collectives on numpy arrays (no pickling)."""

    name = "mpi"

    def __init__(self, worker_id: int, world: Any, group: Any) -> None:
        MPI = _mpi()
        self.MPI = MPI
        self.worker_id = worker_id
        self.world = world
        self.group = group
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
                    "avg": MPI.SUM}

    def _comm(self, in_group: bool) -> Any:
        return self.group if in_group else self.world

    def _arrays(self, what: str, src: Any, dst: Any, src_ok: bool = True,
                dst_ok: bool = True) -> tuple[Any, Any]:
        s = host_tensor(src, f"{what} src", self.worker_id) if src_ok else None
        d = host_tensor(dst, f"{what} dst", self.worker_id) if dst_ok else None
        return s, d

    def allreduce(self, src: Any, dst: Any, op: str, in_group: bool) -> None:
        if type(src) is np.ndarray and type(dst) is np.ndarray:
            s, d = src, dst  # the usual case, without the checks that unwrap NDArrays
        else:
            s, d = self._arrays("allreduce", src, dst)
        check_dst(d, s.shape, s.dtype, f"allreduce on worker {self.worker_id}")
        comm = self._comm(in_group)
        comm.Allreduce(self.MPI.IN_PLACE if s is d else s, d, op=self.ops[op])
        if op == "avg":
            average_in_place(d, comm.Get_size())

    def allgather(self, src: Any, dst: Any, in_group: bool) -> None:
        s, d = self._arrays("allgather", src, dst)
        self._comm(in_group).Allgather(s, d)

    def broadcast_from_worker0(self, src: Any, dst: Any, in_group: bool) -> None:
        comm = self._comm(in_group)
        root = comm.Get_rank() == 0
        s, d = self._arrays("broadcast_from_worker0", src, dst, src_ok=root)
        if root:
            np.copyto(d, s)
        comm.Bcast(d, root=0)

    def scatter_from_worker0(self, src: Any, dst: Any, in_group: bool) -> None:
        comm = self._comm(in_group)
        root = comm.Get_rank() == 0
        s, d = self._arrays("scatter_from_worker0", src, dst, src_ok=root)
        comm.Scatter(s, d, root=0)

    def gather_to_worker0(self, src: Any, dst: Any, in_group: bool) -> None:
        comm = self._comm(in_group)
        root = comm.Get_rank() == 0
        s, d = self._arrays("gather_to_worker0", src, dst, dst_ok=root)
        comm.Gather(s, d, root=0)

    def send(self, array: Any, peer: int) -> None:
        self.world.Send(host_tensor(array, "send", self.worker_id), dest=peer, tag=_P2P)

    def recv(self, array: Any, peer: int) -> None:
        self.world.Recv(host_tensor(array, "recv", self.worker_id), source=peer, tag=_P2P)

    def close(self) -> None:
        """The communicators belong to the session; nothing to free per init."""
