"""ThreadedSession: every worker is a thread of the controller's process."""
from __future__ import annotations

import queue
from typing import Any

from .ccl import CpuCcl
from .comm import ThreadComm, ThreadGroup, ThreadP2P
from .globals import WorkerContext
from .protocol import Command
from .nccl import nccl_factory
from .session import DATA_PLANE_SHARE, Session
from .worker import LocalWorker


class ThreadedSession(Session):
    """A Disco session backed by threads (seed 002's ThreadedSession)."""

    def __init__(self, num_workers: int, num_groups: int = 1, timeout: float = 120.0) -> None:
        super().__init__(num_workers, num_groups, timeout)
        self._cpu_state: dict[str, Any] = {}
        self.workers = [LocalWorker(self._context(i)) for i in range(num_workers)]

    def _context(self, worker_id: int) -> WorkerContext:
        return WorkerContext(worker_id, self._num_workers, self.num_groups,
                             timeout=self.timeout * DATA_PLANE_SHARE,
                             ccl_factories={"cpu": self._make_cpu_ccl, "nccl": nccl_factory})

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
                      ThreadP2P(ctx.worker_id, state["queues"], ctx.timeout))

    def _send(self, cmd: Command, worker_id: int | None) -> None:
        if worker_id is None:
            for w in self.workers:
                w.commands.put(cmd)
        else:
            self.workers[worker_id].commands.put(cmd)

    def _get_reply(self, worker_id: int, timeout: float) -> tuple | None:
        return self.workers[worker_id].next_reply(timeout)

    def _check_alive(self) -> None:
        for w in self.workers:
            w.check_alive()

    def _terminate(self) -> None:
        for w in self.workers:
            w.thread.join(timeout=2.0)
