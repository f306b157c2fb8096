"""ThreadedSession: every worker runs on a thread of the controller's process."""
from __future__ import annotations

import queue
from typing import Any

from .ccl import CpuCcl
from .comm import ThreadComm, ThreadGroup, ThreadP2P
from .globals import WorkerContext
from .nccl import nccl_factory
from .protocol import Command
from .session import DATA_PLANE_SHARE, Session
from .worker import InlineWorker, LocalWorker


class ThreadedSession(Session):
    """A Disco session backed by threads (TVM's ThreadedSession,
    python/tvm/runtime/disco/session.py).

    Worker i > 0 is a thread. Worker-0 is a thread too by default; with inline_worker0=True it
    runs in the caller's thread instead: a command for every worker is queued to workers
    1..n-1 first (so collectives can match), then worker-0's share runs before the call
    returns, and sync_worker_0 / copies to and from worker-0 need no thread switch. The work
    of workers 1..n-1 stays asynchronous. What inline mode gives up: worker-0's share has no
    timeout (a worker-0 function that hangs hangs the caller; collectives and point-to-point
    still end at their data-plane timeout, at once when a peer thread ends), and worker-0 must
    never wait for something only a later command provides (e.g. a recv whose matching send
    is issued afterwards).
    """

    def __init__(self, num_workers: int, num_groups: int = 1, timeout: float = 120.0,
                 inline_worker0: bool = False) -> None:
        super().__init__(num_workers, num_groups, timeout)
        self._cpu_state: dict[str, Any] = {}
        self._inline0 = bool(inline_worker0)
        first = InlineWorker if self._inline0 else LocalWorker
        self.workers: list[Any] = [first(self._context(0), self._abort_data_plane)]
        self.workers += [LocalWorker(self._context(i), self._abort_data_plane)
                         for i in range(1, num_workers)]
        self._others = self.workers[1:]
        self._submit0 = self.workers[0].submit

    def _context(self, worker_id: int) -> WorkerContext:
        return WorkerContext(worker_id, self._num_workers, self.num_groups,
                             timeout=self.timeout * DATA_PLANE_SHARE,
                             ccl_factories={"cpu": self._make_cpu_ccl, "nccl": nccl_factory})

    def _abort_data_plane(self, reason: str) -> None:
        """A worker ended: peers waiting for it in a collective or a recv stop now."""
        state = self._cpu_state
        if state:
            for group in [state["world"], *state["groups"]]:
                group.abort(reason)

    def init_ccl(self, ccl: str, *device_ids: int) -> None:
        if ccl == "cpu":
            # built here, before the command goes out; every worker thread then takes its view
            n, groups = self._num_workers, self.num_groups
            limit = self.timeout * DATA_PLANE_SHARE
            self._cpu_state = {
                "world": ThreadGroup(n, limit),
                "groups": [ThreadGroup(n // groups, limit) for _ in range(groups)],
                "queues": {(a, b): queue.Queue() for a in range(n) for b in range(n) if a != b},
            }
        super().init_ccl(ccl, *device_ids)

    def _make_cpu_ccl(self, ctx: WorkerContext, device_ids: tuple[int, ...],
                      extra: tuple[int, ...]) -> CpuCcl:
        state = self._cpu_state
        size = ctx.group_size
        members = range(ctx.group_id * size, (ctx.group_id + 1) * size)
        world = ThreadComm(state["world"], ctx.worker_id, range(ctx.num_workers))
        group = ThreadComm(state["groups"][ctx.group_id], ctx.local_rank, members)
        return CpuCcl(ctx.worker_id, world, group,
                      ThreadP2P(ctx.worker_id, state["queues"], ctx.timeout, state["world"]))

    def _send(self, cmd: Command, worker_id: int | None) -> None:
        if worker_id is None:
            for w in self._others:
                w.commands.put(cmd)
            # NOTE: worker-0 last: inline, it runs now and may wait for the others' share
            self._submit0(cmd)
        elif worker_id == 0:
            self._submit0(cmd)
        else:
            self.workers[worker_id].commands.put(cmd)

    def _get_reply(self, worker_id: int, timeout: float) -> tuple | None:
        return self.workers[worker_id].next_reply(timeout)

    def _check_alive(self) -> None:
        for w in self.workers:
            w.check_alive()

    def _terminate(self) -> None:
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(2.0)
