"""Worker-side functions for the Disco tests (workers import this module by name)."""
from __future__ import annotations

import os
import time

import numpy as np

from graph_runtime import NDArray, nd
from graph_runtime.disco import get_global_func, register_func


@register_func("test.add_one", override=True)
def add_one(x: np.ndarray) -> np.ndarray:
    return x + 1


@register_func("test.nd_empty", override=True)
def nd_empty(shape: tuple[int, ...], dtype: str) -> NDArray:
    """An NDArray register (what a GraphModule's get_output gives), not a bare numpy array."""
    return nd.empty(shape, dtype)


@register_func("test.echo", override=True)
def echo(*args: object) -> tuple:
    return args


@register_func("test.fill_worker_id", override=True)
def fill_worker_id(x: np.ndarray) -> None:
    x[...] = get_global_func("runtime.disco.worker_id")()


@register_func("test.raise_on", override=True)
def raise_on(worker: int) -> None:
    if get_global_func("runtime.disco.worker_id")() == worker:
        raise ValueError(f"boom on worker {worker}")


@register_func("test.exit_on", override=True)
def exit_on(worker: int) -> None:
    if get_global_func("runtime.disco.worker_id")() == worker:
        os._exit(3)


@register_func("test.pid", override=True)
def pid() -> int:
    return os.getpid()


@register_func("test.sleep", override=True)
def sleep(seconds: float) -> None:
    time.sleep(seconds)


@register_func("test.sleep_on", override=True)
def sleep_on(worker: int, seconds: float) -> None:
    """Make one worker late for whatever comes next (e.g. a collective)."""
    if get_global_func("runtime.disco.worker_id")() == worker:
        time.sleep(seconds)


@register_func("test.allreduce_only_on", override=True)
def allreduce_only_on(worker: int, x: np.ndarray) -> None:
    """A collective that only one worker joins: its peers never come, so it must time out."""
    if get_global_func("runtime.disco.worker_id")() == worker:
        get_global_func("runtime.disco.allreduce")(x, x, "sum", False)


@register_func("test.ring", override=True)
def ring(x: np.ndarray, out: np.ndarray) -> None:
    """Even workers send to the next worker, odd ones receive from the previous one."""
    me = get_global_func("runtime.disco.worker_id")()
    n = get_global_func("runtime.disco.world_size")()
    if me % 2 == 0 and me + 1 < n:
        get_global_func("runtime.disco.send_to_worker")(x, me + 1)
    elif me % 2 == 1:
        get_global_func("runtime.disco.recv_from_worker")(out, me - 1)


@register_func("test.system_exit_on", override=True)
def system_exit_on(worker: int) -> None:
    """End one worker the way user code can: its thread ends, or its process exits with 3."""
    if get_global_func("runtime.disco.worker_id")() == worker:
        raise SystemExit(3)


# what test.record saw, in the process that ran it (worker-0 runs in the controller's process)
RECORDED: list = []


@register_func("test.record", override=True)
def record(value: object) -> None:
    if get_global_func("runtime.disco.worker_id")() == 0:
        RECORDED.append(value)


@register_func("test.recv_on", override=True)
def recv_on(worker: int, peer: int, out: np.ndarray) -> None:
    """Only `worker` receives from `peer` (its send comes in some other command)."""
    if get_global_func("runtime.disco.worker_id")() == worker:
        get_global_func("runtime.disco.recv_from_worker")(out, peer)


@register_func("test.send_on", override=True)
def send_on(worker: int, peer: int, x: np.ndarray) -> None:
    if get_global_func("runtime.disco.worker_id")() == worker:
        get_global_func("runtime.disco.send_to_worker")(x, peer)
