"""Data-plane transports for the "cpu" ccl: thread and shared-memory exchanges, barriers, p2p."""
from __future__ import annotations

import mmap
import os
import queue
import select
import socket
import struct
import threading
import time
from typing import Any, Sequence

import numpy as np

from ..errors import DiscoError

# Every exchange returns each member's contribution (None where a member gave none).
Parts = list  # list[np.ndarray | None]


class ThreadGroup:
    """State shared by the threads of one communicator: a barrier with an ok-flag and slots."""

    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.timeout = timeout
        self.cond = threading.Condition()
        self.count = 0
        self.generation = 0
        self.all_ok = True
        self.result = True
        self.broken: str | None = None
        self.slots: list[Any] = [None] * size

    def wait(self, ok: bool, who: str) -> bool:
        """Block until every member arrives; True when every member arrived with ok."""
        with self.cond:
            if self.broken:
                raise DiscoError(f"{who}: the communicator is broken: {self.broken}")
            generation = self.generation
            self.all_ok = self.all_ok and ok
            self.count += 1
            if self.count == self.size:
                self.result = self.all_ok
                self.count = 0
                self.all_ok = True
                self.generation += 1
                self.cond.notify_all()
                return self.result
            arrived = self.cond.wait_for(
                lambda: self.generation != generation or self.broken is not None, self.timeout)
            if self.generation != generation:
                return self.result
            if arrived:  # aborted: a member ended, or another one timed out
                raise DiscoError(f"{who}: the communicator is broken: {self.broken}")
            self.broken = f"{who} waited {self.timeout:g} s for the other workers"
            self.cond.notify_all()
            raise DiscoError(f"{who}: timed out after {self.timeout:g} s waiting for the "
                             "other workers to join the collective")

    def abort(self, reason: str) -> None:
        """Break the group: every member waiting now or later raises with reason."""
        with self.cond:
            if self.broken is None:
                self.broken = reason
            self.cond.notify_all()


class ThreadComm:
    """One worker's view of a ThreadGroup; contributions are shared by reference."""

    copies = False

    def __init__(self, group: ThreadGroup, rank: int, members: Sequence[int]) -> None:
        self.group = group
        self.rank = rank
        self.size = group.size
        self.members = list(members)

    def exchange(self, array: np.ndarray | None, ok: bool, who: str) -> Parts | None:
        """Publish array and return everyone's, or None when some member failed."""
        self.group.slots[self.rank] = array
        if not self.group.wait(ok, who):
            return None
        return list(self.group.slots)

    def done(self, who: str) -> None:
        """Wait until every member has finished reading the others' arrays."""
        self.group.wait(True, who)

    def close(self) -> None:
        """Nothing to release: the shared state dies with the session."""


_HEADER = struct.Struct("<qq16sq8q")  # nbytes (-1: none), fits, dtype str, ndim, shape
_HEADER_SLOT = 256
_CTRL_LINE = 64  # bytes of the control block per member: one cache line each
_SPIN_S = 50e-6  # how long a barrier spins on shared memory before it sleeps
# NOTE: after waking a sleeping peer, spin longer at the next barrier: that peer is late by a
# wake-up, and sleeping on it too would keep the two taking turns at sleeping.
_SPIN_AFTER_RING_S = 1e-3


class ShmComm:
    """Processes exchanging through one growable memfd arena, double-buffered so one barrier
    per collective suffices.

    The barrier lives in the arena's control block: every member publishes its arrival there
    and spins briefly (a stream of collectives arrives nearly together, so most barriers end
    without a system call); a member that still waits then sleeps on its sockets to the peers,
    which a late arriver rings. A lost ring only delays the sleeper to its next poll, and a
    socket at end of file means that peer exited.
    """

    copies = True

    def __init__(self, rank: int, members: Sequence[int], arena_fd: int,
                 peer_socks: dict[int, socket.socket], timeout: float) -> None:
        self.rank = rank
        self.members = list(members)
        self.size = len(members)
        self.fd = arena_fd
        self.peer_socks = peer_socks  # member rank -> socket to that member
        for sock in peer_socks.values():
            sock.setblocking(False)
        self.timeout = timeout
        self.slot = 0
        self.map: mmap.mmap | None = None
        self.words: memoryview | None = None
        self.calls = 0
        self.generation = 0
        self._spin = _SPIN_S
        self._views: dict[tuple, np.ndarray] = {}  # (half, rank, header bytes) -> arena view
        self._writes: dict[tuple, tuple] = {}  # (half, dtype, shape) -> _prepare_write's answer
        self._remap(4096)

    def _layout_size(self, slot: int) -> int:
        return self.size * _CTRL_LINE + 2 * self.size * (_HEADER_SLOT + slot)

    def _remap(self, slot: int) -> None:
        size = self._layout_size(slot)
        # NOTE: every member grows the file to the same size, so order does not matter.
        if os.fstat(self.fd).st_size < size:
            os.ftruncate(self.fd, size)
        self.slot = slot
        self._views.clear()
        self._writes.clear()
        self.map = mmap.mmap(self.fd, size)
        # word 8*r + (generation & 1) holds member r's arrival at a barrier: generation * 2 + ok;
        # word 8*r + 2 the generation member r sleeps in (one aligned 8-byte store each)
        self.words = memoryview(self.map).cast("B")[:self.size * _CTRL_LINE].cast("q")

    # ---- barrier -------------------------------------------------------------------------------

    def barrier(self, ok: bool, who: str) -> bool:
        """Every member arrives; True when every member arrived with ok."""
        self.generation += 1
        g = self.generation
        words = self.words
        assert words is not None
        slots = range(g & 1, 8 * self.size, 8)
        words[8 * self.rank + (g & 1)] = 2 * g + int(ok)
        deadline = time.monotonic() + self._spin
        self._spin = _SPIN_S
        for r, sock in self.peer_socks.items():
            if words[8 * r + 2] == g:
                _ring(sock)
                self._spin = _SPIN_AFTER_RING_S
        spins = 0
        while True:
            arrived = True
            all_ok = True
            for i in slots:
                value = words[i]
                if value >> 1 != g:
                    arrived = False
                    break
                all_ok = all_ok and bool(value & 1)
            if arrived:
                return all_ok
            spins += 1
            if spins & 31 == 0 and time.monotonic() > deadline:
                return self._sleep_until_arrived(g, slots, who)

    def _sleep_until_arrived(self, g: int, slots: range, who: str) -> bool:
        words = self.words
        assert words is not None
        words[8 * self.rank + 2] = g
        deadline = time.monotonic() + self.timeout
        wait = 0.001
        socks = list(self.peer_socks.values())
        try:
            while True:
                values = [words[i] for i in slots]
                if all(v >> 1 == g for v in values):
                    return all(v & 1 for v in values)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DiscoError(f"{who}: timed out after {self.timeout:g} s waiting for "
                                     "the other workers to join the collective")
                ready, _, _ = select.select(socks, [], [], min(wait, left))
                wait = min(2 * wait, 0.05)
                for sock in ready:
                    self._drain(sock, who)
        finally:
            words[8 * self.rank + 2] = 0

    def _drain(self, sock: socket.socket, who: str) -> None:
        try:
            data = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            raise DiscoError(f"{who}: a peer worker is gone ({e})") from e
        if not data:
            rank = next(r for r, s in self.peer_socks.items() if s is sock)
            raise DiscoError(f"{who}: worker {self.members[rank]} has exited")

    # ---- the arena -----------------------------------------------------------------------------

    def _offsets(self, half: int, rank: int) -> tuple[int, int]:
        base = self.size * _CTRL_LINE + half * self.size * (_HEADER_SLOT + self.slot)
        header = base + rank * _HEADER_SLOT
        data = base + self.size * _HEADER_SLOT + rank * self.slot
        return header, data

    def _write(self, half: int, array: np.ndarray | None) -> None:
        assert self.map is not None
        key = (half, None, None) if array is None else (half, array.dtype, array.shape)
        entry = self._writes.get(key)
        if entry is None:
            entry = self._prepare_write(half, array)
            self._writes[key] = entry
        offset, head, out = entry
        self.map[offset:offset + len(head)] = head
        if out is not None and array is not None:
            np.copyto(out, array)

    def _prepare_write(self, half: int, array: np.ndarray | None) -> tuple:
        """(header offset, header bytes, arena view or None) for one layout; cached."""
        assert self.map is not None
        header, data = self._offsets(half, self.rank)
        if array is None:
            return header, _HEADER.pack(-1, 1, b"", 0, *([0] * 8)), None
        if array.ndim > 8:
            raise DiscoError(f"collectives support up to 8 dimensions, got {array.ndim}")
        fits = array.nbytes <= self.slot
        shape = list(array.shape) + [0] * (8 - array.ndim)
        head = _HEADER.pack(array.nbytes, int(fits), array.dtype.str.encode(), array.ndim, *shape)
        out = None
        if fits and array.nbytes:
            out = np.frombuffer(self.map, np.uint8, array.nbytes, data)
            out = out.view(array.dtype).reshape(array.shape)
        return header, head, out

    def _read(self, half: int) -> tuple[Parts, int, bool]:
        assert self.map is not None
        parts: Parts = []
        need = 0
        fits = True
        views = self._views
        for rank in range(self.size):
            header, data = self._offsets(half, rank)
            head = self.map[header:header + _HEADER.size]
            view = views.get((half, rank, head))
            if view is not None:
                parts.append(view)
                continue
            nbytes, fit, dtype, ndim, *shape = _HEADER.unpack(head)
            if nbytes < 0:
                parts.append(None)
                continue
            need = max(need, nbytes)
            fits = fits and bool(fit)
            if fit:
                dt = np.dtype(dtype.rstrip(b"\0").decode())
                view = np.frombuffer(self.map, np.uint8, nbytes, data).view(dt)
                view = view.reshape(shape[:ndim])
                views[(half, rank, head)] = view
                parts.append(view)
            else:
                parts.append(None)
        return parts, need, fits

    def exchange(self, array: np.ndarray | None, ok: bool, who: str) -> Parts | None:
        """Copy array into the arena and return every member's copy, or None on failure."""
        half = self.calls % 2
        self.calls += 1
        self._write(half, array if ok else None)
        if not self.barrier(ok, who):
            return None
        parts, need, fits = self._read(half)
        if not fits:
            slot = max(need, 2 * self.slot)
            slot = (slot + 63) // 64 * 64
            self.barrier(True, who)  # everyone has read the old headers before they change
            self._remap(slot)
            self._write(half, array)
            self.barrier(True, who)
            parts, need, fits = self._read(half)
        return parts

    def done(self, who: str) -> None:
        """Nothing to wait for: the next collective writes the other half of the arena."""

    def close(self) -> None:
        if self.words is not None:
            self.words.release()
        self.words = None
        self._views.clear()
        self._writes.clear()
        self.map = None


def _ring(sock: socket.socket) -> None:
    """Wake a peer sleeping in a barrier (a full buffer means it has wake-ups pending)."""
    try:
        sock.send(b"!")
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:
        pass  # the peer is gone; its death shows up where someone waits for it


class ThreadP2P:
    """Point-to-point between worker threads: one queue per (sender, receiver) pair; a recv
    also stops when the world group is aborted (a worker thread ended)."""

    def __init__(self, worker_id: int, queues: dict[tuple[int, int], queue.Queue],
                 timeout: float, world: ThreadGroup) -> None:
        self.worker_id = worker_id
        self.queues = queues
        self.timeout = timeout
        self.world = world

    def send(self, array: np.ndarray, peer: int) -> None:
        self.queues[(self.worker_id, peer)].put(np.array(array, copy=True))

    def recv(self, array: np.ndarray, peer: int) -> None:
        source = self.queues[(peer, self.worker_id)]
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                data = source.get(timeout=max(min(deadline - time.monotonic(), 0.05), 0.0))
                break
            except queue.Empty:
                pass
            if self.world.broken is not None:
                raise DiscoError(f"worker {self.worker_id}: recv from worker {peer} aborted: "
                                 f"{self.world.broken}") from None
            if time.monotonic() >= deadline:
                raise DiscoError(f"worker {self.worker_id}: recv from worker {peer} timed out "
                                 f"after {self.timeout:g} s (no matching send)") from None
        _check_p2p(data.shape, data.dtype, array, peer, self.worker_id)
        np.copyto(array, data)


class SocketP2P:
    """Point-to-point between worker processes over one socketpair per pair of workers."""

    def __init__(self, worker_id: int, socks: dict[int, socket.socket], timeout: float) -> None:
        self.worker_id = worker_id
        self.socks = socks
        self.timeout = timeout
        for sock in socks.values():
            sock.settimeout(timeout)

    def send(self, array: np.ndarray, peer: int) -> None:
        array = np.asarray(array, order="C")  # keeps a 0-d array 0-d
        shape = list(array.shape) + [0] * (8 - array.ndim)
        head = _HEADER.pack(array.nbytes, 1, array.dtype.str.encode(), array.ndim, *shape)
        try:
            sock = self.socks[peer]
            sock.sendall(head)
            sock.sendall(array.view(np.uint8).reshape(-1).data)
        except (socket.timeout, TimeoutError):
            raise DiscoError(f"worker {self.worker_id}: send to worker {peer} timed out after "
                             f"{self.timeout:g} s (no matching recv)") from None

    def recv(self, array: np.ndarray, peer: int) -> None:
        try:
            sock = self.socks[peer]
            head = _recv_exact(sock, _HEADER.size)
            if head is None:
                raise DiscoError(f"worker {self.worker_id}: recv from worker {peer}: worker "
                                 f"{peer} has exited")
            nbytes, _, dtype, ndim, *shape = _HEADER.unpack(head)
            data = np.empty(nbytes, np.uint8)
            view = data.data
            while view:
                n = sock.recv_into(view)
                if n == 0:
                    raise DiscoError(f"worker {self.worker_id}: worker {peer} exited mid-send")
                view = view[n:]
        except (socket.timeout, TimeoutError):
            raise DiscoError(f"worker {self.worker_id}: recv from worker {peer} timed out "
                             f"after {self.timeout:g} s (no matching send)") from None
        dt = np.dtype(dtype.rstrip(b"\0").decode())
        _check_p2p(tuple(shape[:ndim]), dt, array, peer, self.worker_id)
        np.copyto(array, data.view(dt).reshape(shape[:ndim]))


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """n bytes from sock, or None when the peer hung up first."""
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _check_p2p(shape: tuple, dtype: np.dtype, array: np.ndarray, peer: int, me: int) -> None:
    if tuple(shape) != tuple(array.shape) or np.dtype(dtype) != array.dtype:
        raise DiscoError(f"worker {me}: recv from worker {peer} got {tuple(shape)} {dtype}, "
                         f"but the receive buffer is {tuple(array.shape)} {array.dtype}")
