"""Collectives: reduce ops checked against NumPy, and the "cpu" ccl over a thread/shm exchange."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import DiscoError

REDUCE_UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
                 "avg": np.add}
REDUCE_OPS = tuple(REDUCE_UFUNCS)


def check_reduce_op(op: str) -> None:
    """Raise unless op is one of REDUCE_OPS (the controller and every ccl accept the same ops)."""
    if op not in REDUCE_OPS:
        raise DiscoError(f"allreduce: unknown reduce op {op!r}; expected one of: "
                         + ", ".join(REDUCE_OPS))


def average_in_place(total: Any, n: int, xp: Any = np) -> None:
    """Turn an allreduce sum of n parts into "avg": // for integer dtypes, / otherwise."""
    divide = xp.floor_divide if np.issubdtype(total.dtype, np.integer) else xp.true_divide
    divide(total, n, out=total)


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
        average_in_place(out, len(parts))
    return out


def host_tensor(value: Any, what: str, worker_id: int) -> Any:
    """The numpy array behind a register value (NDArray unwrapped); errors name the worker."""
    if isinstance(value, Failed):
        raise value.error
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
        parts = _exchange(comm, array, error, who)
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
        comm = self.group if in_group else self.world
        if comm.copies and type(src) is np.ndarray and type(dst) is np.ndarray and \
                src.shape == dst.shape and src.dtype == dst.dtype:
            # NOTE: the usual case, without _run's closures: this worker's part cannot fail, and
            # each member reduces its own copies of the parts, so dst may alias src.
            who = f"allreduce on worker {self.worker_id}"
            parts = _exchange(comm, src, None, who)
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
        self._gather("allgather", "allgather", src, dst, in_group, everyone=True)

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
        self._gather("gather_to_worker0", "gather", src, dst, in_group, everyone=False)

    def _gather(self, what: str, short: str, src: Any, dst: Any, in_group: bool,
                everyone: bool) -> None:
        """Stack every member's src into dst: on every member, or only on rank 0."""
        dsts: list[np.ndarray] = []

        def contribute(comm: Any) -> np.ndarray:
            s = host_tensor(src, f"{short} src", self.worker_id)
            if everyone or comm.rank == 0:
                d = host_tensor(dst, f"{short} dst", self.worker_id)
                _check_stacked(d, s, comm.size, f"{what} on worker {self.worker_id}")
                dsts.append(d)
            return s

        def finish(parts: list, comm: Any, who: str) -> None:
            first = check_layout(parts, who, comm.members)
            if dsts:
                out = dsts[0].reshape((comm.size,) + first.shape)
                for rank, part in enumerate(parts):
                    out[rank] = part

        self._run(what, in_group, contribute, finish)

    def send(self, array: Any, peer: int) -> None:
        self.p2p.send(host_tensor(array, "send", self.worker_id), peer)

    def recv(self, array: Any, peer: int) -> None:
        self.p2p.recv(host_tensor(array, "recv", self.worker_id), peer)

    def close(self) -> None:
        self.world.close()
        self.group.close()


def _exchange(comm: Any, array: np.ndarray | None, error: BaseException | None,
              who: str) -> list:
    """Every member's contribution; raises this member's error, or says another one failed."""
    parts = comm.exchange(array, error is None, who)
    if error is not None:
        raise error
    if parts is None:
        raise DiscoError(f"{who}: aborted because another worker failed in this collective "
                         "(see its error)")
    return parts


def _check_stacked(big: np.ndarray, small: np.ndarray, n: int, what: str) -> None:
    """big must hold n copies of small's layout, stacked along axis 0, contiguously."""
    if big.size != n * small.size or big.dtype != small.dtype or not big.flags.c_contiguous:
        raise DiscoError(f"{what}: expected a contiguous {small.dtype} array of {n} x "
                         f"{small.shape} ({n * small.size} elements), got {big.shape} {big.dtype}")
