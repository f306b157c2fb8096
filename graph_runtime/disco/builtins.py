"""The runtime.disco.* global functions every worker has (TVM's names, run on the worker)."""
from __future__ import annotations

import importlib
import threading
from typing import Any, Callable

import numpy as np

from ..device import Device, cuda
from ..errors import DiscoError
from .ccl import check_reduce_op
from .globals import current, register_func, require_ccl


def collective(func: Callable[..., Any]) -> Callable[..., Any]:
    """Mark func so a worker whose argument register is unreadable still joins (and aborts) it."""
    func.disco_collective = True  # type: ignore[attr-defined]
    return func


def _reg(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return register_func("runtime.disco." + name, override=True)


@_reg("worker_id")
def worker_id() -> int:
    """This worker's id, 0..num_workers-1."""
    return current().worker_id


@_reg("worker_rank")
def worker_rank() -> int:
    """This worker's rank inside its group."""
    return current().local_rank


@_reg("world_size")
def world_size() -> int:
    return current().num_workers


@_reg("num_groups")
def num_groups() -> int:
    return current().num_groups


@_reg("group_id")
def group_id() -> int:
    return current().group_id


@_reg("device")
def device() -> Device:
    """The worker's default device (cpu(0), or its GPU after init_ccl("nccl", ...))."""
    return current().device


@_reg("init_ccl")
def init_ccl(name: str, device_ids: tuple[int, ...], extra: tuple[int, ...]) -> None:
    """Build this worker's data plane; extra carries e.g. NCCL unique ids from the controller."""
    ctx = current()
    factory = ctx.ccl_factories.get(name)
    if factory is None:
        raise DiscoError(f"ccl {name!r} is not available in this session; available: "
                         + ", ".join(sorted(ctx.ccl_factories)))
    if ctx.ccl is not None:
        ctx.ccl.close()
        ctx.ccl = None
    if name == "nccl":
        ctx.device = cuda(device_ids[ctx.worker_id] if device_ids else ctx.worker_id)
    ctx.ccl = factory(ctx, device_ids, extra)


@_reg("empty")
def empty(shape: tuple[int, ...], dtype: str, dev: Device | None, worker0_only: bool,
          in_group: bool) -> Any:
    """A fresh tensor; None on workers that worker0_only leaves out."""
    ctx = current()
    if worker0_only:
        leader = ctx.local_rank == 0 if in_group else ctx.worker_id == 0
        if not leader:
            return None
    target = ctx.device if dev is None else dev
    if target.kind == "cpu":
        return np.empty(shape, dtype)
    from ..backends import check_device
    return check_device(target).empty(target.device_id, tuple(shape), np.dtype(dtype))


@_reg("allreduce")
@collective
def allreduce(src: Any, dst: Any, op: str, in_group: bool) -> None:
    ccl = require_ccl("allreduce")
    check_reduce_op(op)
    ccl.allreduce(src, dst, op, in_group)


@_reg("allgather")
@collective
def allgather(src: Any, dst: Any, in_group: bool) -> None:
    require_ccl("allgather").allgather(src, dst, in_group)


@_reg("broadcast_from_worker0")
@collective
def broadcast_from_worker0(src: Any, dst: Any, in_group: bool) -> None:
    require_ccl("broadcast_from_worker0").broadcast_from_worker0(src, dst, in_group)


@_reg("scatter_from_worker0")
@collective
def scatter_from_worker0(src: Any, dst: Any, in_group: bool) -> None:
    require_ccl("scatter_from_worker0").scatter_from_worker0(src, dst, in_group)


@_reg("gather_to_worker0")
@collective
def gather_to_worker0(src: Any, dst: Any, in_group: bool) -> None:
    require_ccl("gather_to_worker0").gather_to_worker0(src, dst, in_group)


def _peer(peer: int, what: str) -> int:
    ctx = current()
    if not 0 <= peer < ctx.num_workers or peer == ctx.worker_id:
        raise DiscoError(f"{what} on worker {ctx.worker_id}: bad peer {peer}; expected another "
                         f"worker id in 0..{ctx.num_workers - 1}")
    return peer


@_reg("send_to_worker")
def send_to_worker(buffer: Any, receiver_id: int) -> None:
    """Send buffer to one worker (call it from worker-side code that picks the sender)."""
    require_ccl("send_to_worker").send(buffer, _peer(receiver_id, "send_to_worker"))


@_reg("recv_from_worker")
def recv_from_worker(buffer: Any, sender_id: int) -> None:
    """Receive into buffer from one worker."""
    require_ccl("recv_from_worker").recv(buffer, _peer(sender_id, "recv_from_worker"))


@_reg("send_to_next_group")
def send_to_next_group(buffer: Any) -> None:
    """Pipeline step: send to the same rank of the next group (a no-op in the last group)."""
    ctx = current()
    if ctx.group_id + 1 < ctx.num_groups:
        require_ccl("send_to_next_group").send(buffer, ctx.worker_id + ctx.group_size)


@_reg("recv_from_prev_group")
def recv_from_prev_group(buffer: Any) -> None:
    """Pipeline step: receive from the same rank of the previous group (no-op in the first)."""
    ctx = current()
    if ctx.group_id > 0:
        require_ccl("recv_from_prev_group").recv(buffer, ctx.worker_id - ctx.group_size)


@_reg("import_python_module")
def import_python_module(name: str) -> None:
    importlib.import_module(name)


# NOTE: worker threads share one process; loading libraries (and the standard-op registry they
# fill on first use) is done one worker at a time.
_LOAD_LOCK = threading.Lock()


@_reg("load_module")
def load_module(path: str) -> Any:
    from .. import load_module as load
    with _LOAD_LOCK:
        return load(path)


class _BoundKernel:
    """A library function bound to the worker's device, called destination-passing style:
    f(*inputs, out) with NDArrays unwrapped; kernels that need preparing are prepared once per
    argument layout (the last argument is the one output)."""

    def __init__(self, module: Any, name: str, dev: Device) -> None:
        self.module = module
        self.name = name
        self.device = dev
        self.kernel = module.get_function(name, dev)
        self._prepared: dict[tuple, Callable[..., Any]] = {}

    def __call__(self, *args: Any) -> Any:
        arrays = [getattr(a, "native", a) for a in args]
        fn = self.kernel
        if hasattr(fn, "prepare"):
            key = tuple((tuple(a.shape), str(a.dtype)) for a in arrays)
            fn = self._prepared.get(key)
            if fn is None:
                from ..lib.library import TensorSpec
                specs = [TensorSpec(tuple(a.shape), np.dtype(a.dtype).name) for a in arrays]
                fn = self.module.prepare(self.name, self.device, specs[:-1], specs[-1:])
                self._prepared[key] = fn
        return fn(*arrays)

    def __repr__(self) -> str:
        return f"<kernel {self.name} on {self.device}>"


@_reg("module_get_function")
def module_get_function(module: Any, name: str) -> Any:
    return _BoundKernel(module, name, current().device)


@_reg("create_graph_module")
def create_graph_module(graph: str, lib: Any, params: str | None, dev: Device | None) -> Any:
    from .. import create
    with _LOAD_LOCK:
        gm = create(graph, lib, current().device if dev is None else dev)
    if params is not None:
        gm.load_params(params)
    return gm


@_reg("graph_module_set_input")
def graph_module_set_input(gm: Any, key: Any, value: Any) -> None:
    gm.set_input(key, value)


@_reg("graph_module_load_params")
def graph_module_load_params(gm: Any, path: str) -> None:
    gm.load_params(path)


@_reg("graph_module_run")
def graph_module_run(gm: Any) -> None:
    gm.run()


@_reg("graph_module_get_output")
def graph_module_get_output(gm: Any, index: int | str) -> Any:
    return gm.get_output(index)
