"""Collectives: reduce ops checked against NumPy, and the "cpu" ccl over a thread/shm exchange."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DiscoError

REDUCE_UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
                 "avg": np.add}


class Failed:
    """A collective argument whose register could not be read on this worker."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def reduce_into(parts: list[np.ndarray], op: str, out: np.ndarray) -> np.ndarray:
    """out = parts[0] op parts[1] op ... in worker order; avg divides the sum (// for ints)."""
    ufunc = REDUCE_UFUNCS[op]
    if len(parts) == 1:
        np.copyto(out, parts[0])
    else:
        ufunc(parts[0], parts[1], out=out)
        for part in parts[2:]:
            ufunc(out, part, out=out)
    if op == "avg":
        if np.issubdtype(out.dtype, np.integer):
            np.floor_divide(out, len(parts), out=out)
        else:
            np.true_divide(out, len(parts), out=out)
    return out


def host_tensor(value: Any, what: str, worker_id: int, allow_none: bool = False) -> Any:
    """The numpy array behind a register value (NDArray unwrapped); errors name the worker."""
    if isinstance(value, Failed):
        raise value.error
    if value is None and allow_none:
        return None
    native = getattr(value, "native", value)
    if not isinstance(native, np.ndarray):
        raise DiscoError(f"{what} on worker {worker_id}: the cpu ccl works on numpy arrays, got "
                         f"{type(native).__module__}.{type(native).__name__} (use ccl 'nccl' "
                         "for GPU tensors)")
    return native


def check_layout(parts: list[Any], what: str, members: list[int]) -> np.ndarray:
    """The first contribution, after checking every other one has its shape and dtype."""
    first = parts[0]
    for rank, part in enumerate(parts):
        if part is None:
            raise DiscoError(f"{what}: worker {members[rank]} gave no array")
        if part.shape != first.shape or part.dtype != first.dtype:
            raise DiscoError(f"{what}: workers disagree: worker {members[0]} has "
                             f"{first.shape} {first.dtype}, worker {members[rank]} has "
                             f"{part.shape} {part.dtype}")
    return first


def check_dst(dst: np.ndarray, shape: tuple, dtype: np.dtype, what: str) -> None:
    if tuple(dst.shape) != tuple(shape) or dst.dtype != dtype:
        raise DiscoError(f"{what}: dst is {tuple(dst.shape)} {dst.dtype}, expected "
                         f"{tuple(shape)} {dtype}")


class CpuCcl:
    """The "cpu" data plane: collectives over an exchange (threads or shared memory)."""

    name = "cpu"

    def __init__(self, worker_id: int, world: Any, group: Any, p2p: Any) -> None:
        self.worker_id = worker_id
        self.world = world
        self.group = group
        self.p2p = p2p

    def _run(self, what: str, in_group: bool, contribute: Any, finish: Any) -> None:
        """Contribute, exchange, then finish(parts, comm); every member takes part even after a
        local error, so a failure aborts the collective everywhere instead of hanging it."""
        comm = self.group if in_group else self.world
        who = f"{what} on worker {self.worker_id}"
        error: BaseException | None = None
        array = None
        try:
            array = contribute(comm)
        except Exception as e:
            error = e
        parts = comm.exchange(array, error is None, who)
        if error is not None:
            raise error
        if parts is None:
            raise DiscoError(f"{who}: aborted because another worker failed in this "
                             "collective (see its error)")
        post = None
        try:
            post = finish(parts, comm, who)
        except Exception as e:
            error = e
        comm.done(who)
        if error is not None:
            raise error
        if post is not None:
            post()

    def allreduce(self, src: Any, dst: Any, op: str, in_group: bool) -> None:
        if op not in REDUCE_UFUNCS:
            raise DiscoError(f"allreduce: unknown reduce op {op!r}; expected one of: "
                             + ", ".join(REDUCE_UFUNCS))
        comm = self.group if in_group else self.world
        if comm.copies and type(src) is np.ndarray and type(dst) is np.ndarray and \
                src.shape == dst.shape and src.dtype == dst.dtype:
            # NOTE: the usual case, without _run's closures: this worker's part cannot fail, and
            # each member reduces its own copies of the parts, so dst may alias src.
            who = f"allreduce on worker {self.worker_id}"
            parts = comm.exchange(src, True, who)
            if parts is None:
                raise DiscoError(f"{who}: aborted because another worker failed in this "
                                 "collective (see its error)")
            check_layout(parts, who, comm.members)
            reduce_into(parts, op, dst)
            return
        arrays: list[np.ndarray] = []

        def contribute(comm: Any) -> np.ndarray:
            s = host_tensor(src, "allreduce src", self.worker_id)
            d = host_tensor(dst, "allreduce dst", self.worker_id)
            check_dst(d, s.shape, s.dtype, f"allreduce on worker {self.worker_id}")
            arrays.extend([s, d])
            return s

        def finish(parts: list, comm: Any, who: str) -> Any:
            check_layout(parts, who, comm.members)
            s, d = arrays
            if comm.copies or not np.shares_memory(s, d):
                reduce_into(parts, op, d)
                return None
            # threads read each other's src: write an aliased dst only after they are done
            result = reduce_into(parts, op, np.empty_like(d))
            return lambda: np.copyto(d, result)

        self._run("allreduce", in_group, contribute, finish)

    def allgather(self, src: Any, dst: Any, in_group: bool) -> None:
        dsts: list[np.ndarray] = []

        def contribute(comm: Any) -> np.ndarray:
            s = host_tensor(src, "allgather src", self.worker_id)
            d = host_tensor(dst, "allgather dst", self.worker_id)
            _check_stacked(d, s, comm.size, f"allgather on worker {self.worker_id}")
            dsts.append(d)
            return s

        def finish(parts: list, comm: Any, who: str) -> None:
            first = check_layout(parts, who, comm.members)
            out = dsts[0].reshape((comm.size,) + first.shape)
            for rank, part in enumerate(parts):
                out[rank] = part

        self._run("allgather", in_group, contribute, finish)

    def broadcast_from_worker0(self, src: Any, dst: Any, in_group: bool) -> None:
        dsts: list[np.ndarray] = []

        def contribute(comm: Any) -> np.ndarray | None:
            dsts.append(host_tensor(dst, "broadcast dst", self.worker_id))
            if comm.rank == 0:
                return host_tensor(src, "broadcast src", self.worker_id)
            return None

        def finish(parts: list, comm: Any, who: str) -> None:
            root = parts[0]
            if root is None:
                raise DiscoError(f"{who}: worker {comm.members[0]} gave no source array")
            check_dst(dsts[0], root.shape, root.dtype, who)
            np.copyto(dsts[0], root)

        self._run("broadcast_from_worker0", in_group, contribute, finish)

    def scatter_from_worker0(self, src: Any, dst: Any, in_group: bool) -> None:
        dsts: list[np.ndarray] = []

        def contribute(comm: Any) -> np.ndarray | None:
            d = host_tensor(dst, "scatter dst", self.worker_id)
            dsts.append(d)
            if comm.rank != 0:
                return None
            s = host_tensor(src, "scatter src", self.worker_id)
            _check_stacked(s, d, comm.size, f"scatter_from_worker0 on worker {self.worker_id}")
            return s

        def finish(parts: list, comm: Any, who: str) -> None:
            root = parts[0]
            d = dsts[0]
            if root is None or root.size != comm.size * d.size or root.dtype != d.dtype:
                raise DiscoError(f"{who}: the source does not split into {comm.size} chunks "
                                 f"of {d.shape} {d.dtype}")
            chunk = root.reshape(comm.size, -1)[comm.rank]
            np.copyto(d, chunk.reshape(d.shape))

        self._run("scatter_from_worker0", in_group, contribute, finish)

    def gather_to_worker0(self, src: Any, dst: Any, in_group: bool) -> None:
        dsts: list[np.ndarray | None] = []

        def contribute(comm: Any) -> np.ndarray:
            s = host_tensor(src, "gather src", self.worker_id)
            if comm.rank == 0:
                d = host_tensor(dst, "gather dst", self.worker_id)
                _check_stacked(d, s, comm.size, f"gather_to_worker0 on worker {self.worker_id}")
                dsts.append(d)
            return s

        def finish(parts: list, comm: Any, who: str) -> None:
            first = check_layout(parts, who, comm.members)
            target = dsts[0] if dsts else None
            if comm.rank == 0 and target is not None:
                out = target.reshape((comm.size,) + first.shape)
                for rank, part in enumerate(parts):
                    out[rank] = part

        self._run("gather_to_worker0", in_group, contribute, finish)

    def send(self, array: Any, peer: int) -> None:
        self.p2p.send(host_tensor(array, "send", self.worker_id), peer)

    def recv(self, array: Any, peer: int) -> None:
        self.p2p.recv(host_tensor(array, "recv", self.worker_id), peer)

    def close(self) -> None:
        self.world.close()
        self.group.close()


def _check_stacked(big: np.ndarray, small: np.ndarray, n: int, what: str) -> None:
    """big must hold n copies of small's layout, stacked along axis 0, contiguously."""
    if big.size != n * small.size or big.dtype != small.dtype or not big.flags.c_contiguous:
        raise DiscoError(f"{what}: expected a contiguous {small.dtype} array of {n} x "
                         f"{small.shape} ({n * small.size} elements), got {big.shape} {big.dtype}")
