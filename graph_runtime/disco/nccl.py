"""The "nccl" data plane: CuPy's NCCL bindings, one communicator per worker and per group."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import DeviceError, DiscoError
from .ccl import average_in_place, check_dst
from .globals import WorkerContext

_UID_LEN = 128  # NCCL_UNIQUE_ID_BYTES


def _nccl() -> Any:
    try:
        from cupy.cuda import nccl
    except Exception as e:  # ImportError, or CuPy without NCCL
        raise DeviceError(f"ccl 'nccl' needs CuPy with NCCL (pip install cupy-cuda12x): {e}") \
            from e
    # NOTE: without libnccl CuPy still imports cupy.cuda.nccl, as a stub with available False.
    if not getattr(nccl, "available", True):
        raise DeviceError("ccl 'nccl': CuPy could not load the NCCL library (libnccl.so.2); "
                          "pip install nvidia-nccl-cu12")
    return nccl


def unique_ids(count: int) -> tuple[int, ...]:
    """count NCCL unique ids flattened into one int tuple (they travel on the control plane)."""
    nccl = _nccl()
    out: list[int] = []
    for _ in range(count):
        out.extend(int(b) for b in nccl.get_unique_id())
    return tuple(out)


def nccl_factory(ctx: WorkerContext, device_ids: tuple[int, ...],
                 extra: tuple[int, ...]) -> NcclCcl:
    """The init_ccl factory for "nccl" (world id first, then one per group, in extra)."""
    return NcclCcl(ctx, extra)


_DTYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
           "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
           "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64"}
_OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "min": "NCCL_MIN", "max": "NCCL_MAX",
        "avg": "NCCL_SUM"}


class NcclCcl:
    """Collectives on CuPy arrays; the worker's device becomes cuda(device_ids[worker_id])."""

    name = "nccl"

    def __init__(self, ctx: WorkerContext, extra: tuple[int, ...]) -> None:
        import cupy
        self.nccl = _nccl()
        self.cupy = cupy
        self.ctx = ctx
        if len(extra) != _UID_LEN * (1 + ctx.num_groups):
            raise DiscoError(f"init_ccl('nccl'): expected {1 + ctx.num_groups} unique ids from "
                             f"the controller, got {len(extra) // _UID_LEN}")
        cupy.cuda.Device(ctx.device.device_id).use()
        start = _UID_LEN * (1 + ctx.group_id)
        self.world = self._communicator(ctx.num_workers, extra[:_UID_LEN], ctx.worker_id)
        self.group = self._communicator(ctx.group_size, extra[start:start + _UID_LEN],
                                        ctx.local_rank)

    def _communicator(self, size: int, uid: Sequence[int], rank: int) -> Any:
        """A communicator from a unique id sent as ints: CuPy 14 takes the id as bytes, earlier
        CuPy as a tuple of (signed) chars; a wrong type is a TypeError before NCCL is called."""
        try:
            return self.nccl.NcclCommunicator(size, bytes(v & 0xFF for v in uid), rank)
        except TypeError:
            return self.nccl.NcclCommunicator(size, tuple(uid), rank)

    def _array(self, value: Any, what: str) -> Any:
        native = getattr(value, "native", value)
        if not isinstance(native, self.cupy.ndarray):
            raise DiscoError(f"{what} on worker {self.ctx.worker_id}: ccl 'nccl' works on CuPy "
                             f"arrays, got {type(native).__name__}")
        return native

    def _dtype(self, array: Any) -> int:
        name = np.dtype(array.dtype).name
        if name not in _DTYPES:
            raise DiscoError(f"ccl 'nccl' does not support dtype {name}; supported: "
                             + ", ".join(_DTYPES))
        return int(getattr(self.nccl, _DTYPES[name]))

    def _comm(self, in_group: bool) -> Any:
        return self.group if in_group else self.world

    def _size(self, in_group: bool) -> int:
        return self.ctx.group_size if in_group else self.ctx.num_workers

    def _stream(self) -> int:
        return int(self.cupy.cuda.get_current_stream().ptr)

    def _finish(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()

    def allreduce(self, src: Any, dst: Any, op: str, in_group: bool) -> None:
        s = self._array(src, "allreduce src")
        d = self._array(dst, "allreduce dst")
        check_dst(d, s.shape, s.dtype, "allreduce")
        code = int(getattr(self.nccl, _OPS[op]))
        self._comm(in_group).allReduce(s.data.ptr, d.data.ptr, s.size, self._dtype(s), code,
                                       self._stream())
        if op == "avg":
            average_in_place(d, self._size(in_group), self.cupy)
        self._finish()

    def allgather(self, src: Any, dst: Any, in_group: bool) -> None:
        s = self._array(src, "allgather src")
        d = self._array(dst, "allgather dst")
        self._comm(in_group).allGather(s.data.ptr, d.data.ptr, s.size, self._dtype(s),
                                       self._stream())
        self._finish()

    def broadcast_from_worker0(self, src: Any, dst: Any, in_group: bool) -> None:
        d = self._array(dst, "broadcast dst")
        comm = self._comm(in_group)
        root = comm.rank_id() == 0
        s = self._array(src, "broadcast src") if root else d
        comm.broadcast(s.data.ptr, d.data.ptr, d.size, self._dtype(d), 0, self._stream())
        self._finish()

    def scatter_from_worker0(self, src: Any, dst: Any, in_group: bool) -> None:
        d = self._array(dst, "scatter dst")
        comm = self._comm(in_group)
        n = self._size(in_group)
        kind = self._dtype(d)
        self.nccl.groupStart()
        if comm.rank_id() == 0:
            s = self._array(src, "scatter src").reshape(n, -1)
            for rank in range(1, n):
                comm.send(s[rank].data.ptr, d.size, kind, rank, self._stream())
            d.reshape(-1)[...] = s[0]
        else:
            comm.recv(d.data.ptr, d.size, kind, 0, self._stream())
        self.nccl.groupEnd()
        self._finish()

    def gather_to_worker0(self, src: Any, dst: Any, in_group: bool) -> None:
        s = self._array(src, "gather src")
        comm = self._comm(in_group)
        n = self._size(in_group)
        kind = self._dtype(s)
        self.nccl.groupStart()
        if comm.rank_id() == 0:
            d = self._array(dst, "gather dst").reshape(n, -1)
            for rank in range(1, n):
                comm.recv(d[rank].data.ptr, s.size, kind, rank, self._stream())
            d[0] = s.reshape(-1)
        else:
            comm.send(s.data.ptr, s.size, kind, 0, self._stream())
        self.nccl.groupEnd()
        self._finish()

    def send(self, array: Any, peer: int) -> None:
        a = self._array(array, "send")
        self.world.send(a.data.ptr, a.size, self._dtype(a), peer, self._stream())
        self._finish()

    def recv(self, array: Any, peer: int) -> None:
        a = self._array(array, "recv")
        self.world.recv(a.data.ptr, a.size, self._dtype(a), peer, self._stream())
        self._finish()

    def close(self) -> None:
        for comm in (self.world, self.group):
            comm.destroy()
