"""One worker: its register file and the loop that executes controller commands on it."""
from __future__ import annotations

import queue
import threading
import traceback
from collections import deque
from typing import Any, Callable

import numpy as np

from ..errors import DiscoError
from ..nd import NDArray
from .ccl import Failed
from .globals import WorkerContext, get_global_func, set_current, swap_current
from .protocol import Command, DiscoAction, as_host_array, describe_command

A = DiscoAction
# plain ints: comparing against IntEnum members costs more on the per-command hot path
_CALL, _GET, _SYNC = int(A.CALL_PACKED), int(A.GET_GLOBAL_FUNC), int(A.SYNC_WORKER)
_EMPTY = object()


class Missing:
    """What a register holds after the command that should have set it failed."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<no value: {self.reason}>"


class Worker:
    """Executes commands on a register file; errors are replied, never raised out of the loop.

    Args:
        ctx: who this worker is.
        reply: sends (token, ok, value) to the controller.
        pack: turns a register value into something reply can carry (identity in-process).
        unpack: undoes the controller's packing of DEBUG_SET_REGISTER values.
    """

    def __init__(self, ctx: WorkerContext, reply: Callable[[tuple], None],
                 pack: Callable[[Any], Any] = lambda v: v,
                 unpack: Callable[[Any], Any] = lambda v: v) -> None:
        self.ctx = ctx
        self.reply = reply
        self.pack = pack
        self.unpack = unpack
        self.registers: dict[int, Any] = {}

    def read(self, reg_id: int) -> Any:
        """A register's value, or a DiscoError saying why it has none."""
        try:
            value = self.registers[reg_id]
        except KeyError:
            raise DiscoError(f"worker {self.ctx.worker_id}: register {int(reg_id)} is empty (never "
                             "set on this worker, or freed)") from None
        if isinstance(value, Missing):
            raise DiscoError(f"worker {self.ctx.worker_id}: register {int(reg_id)} has no value "
                             f"because {value.reason}")
        return value

    def _read_or_failed(self, reg_id: int) -> Any:
        try:
            return self.read(reg_id)
        except DiscoError as e:
            return Failed(e)

    def execute(self, cmd: Command) -> bool:
        """Run one command; False when it was SHUTDOWN."""
        action, frees, reg_id = cmd[0], cmd[1], cmd[2]
        regs = self.registers
        if frees:
            for r in frees:
                regs.pop(r, None)
        try:
            if action == _CALL:
                func = regs.get(cmd[3], _EMPTY)
                if func is _EMPTY or type(func) is Missing:
                    func = self.read(cmd[3])
                regpos = cmd[5]
                if not regpos:
                    regs[reg_id] = func(*cmd[4])
                    return True
                args = list(cmd[4])
                if getattr(func, "disco_collective", False):
                    # join the collective even with a bad argument, so peers abort, not hang
                    for i in regpos:
                        args[i] = self._read_or_failed(args[i])
                else:
                    for i in regpos:
                        value = regs.get(args[i], _EMPTY)
                        args[i] = self.read(args[i]) if value is _EMPTY or \
                            type(value) is Missing else value
                regs[reg_id] = func(*args)
            elif action == _GET:
                regs[reg_id] = get_global_func(cmd[3])
            elif action == _SYNC:
                self.reply((cmd[3], True, None))
            elif action == A.COPY_TO_WORKER0:
                self._copy_to(reg_id, cmd[3], cmd[4])
            elif action == A.COPY_FROM_WORKER0:
                self._copy_from(reg_id, cmd[3])
                self.reply((cmd[4], True, None))
            elif action == A.DEBUG_GET_FROM_REMOTE:
                self.reply((cmd[3], True, self.pack(self._snapshot(self.read(reg_id)))))
            elif action == A.DEBUG_SET_REGISTER:
                regs[reg_id] = self.unpack(cmd[3])
            elif action == A.SHUTDOWN:
                self.reply((cmd[3], True, None))
                return False
        except Exception as e:
            self._fail(cmd, e)
        return True

    def _fail(self, cmd: Command, e: BaseException) -> None:
        what = describe_command(cmd)
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        if cmd[0] in (A.CALL_PACKED, A.GET_GLOBAL_FUNC) and cmd[2]:
            self.registers[cmd[2]] = Missing(f"{what} failed with {type(e).__name__}: {e}")
        token = None
        if cmd[0] in (A.SYNC_WORKER, A.DEBUG_GET_FROM_REMOTE, A.SHUTDOWN):
            token = cmd[3]
        elif cmd[0] == A.COPY_FROM_WORKER0 or (cmd[0] == A.COPY_TO_WORKER0 and cmd[4] is not None):
            token = cmd[4]
        self.reply((token, False, f"worker {self.ctx.worker_id} failed in {what}:\n{text}"))

    def _copy_to(self, reg_id: int, host: np.ndarray, token: int | None) -> None:
        dst = self.read(reg_id)
        _check_same(host, dst, f"copy_to_worker_0 into register {reg_id}")
        if isinstance(dst, np.ndarray):
            np.copyto(dst, host)
        elif isinstance(dst, NDArray):  # it knows its device, which may not be the worker's
            dst.copyfrom(host)
        else:
            from ..backends import get_backend
            get_backend(self.ctx.device).from_host(host, dst)
        if token is not None:
            self.reply((token, True, None))

    def _copy_from(self, reg_id: int, host: np.ndarray) -> None:
        src = self.read(reg_id)
        array = as_host_array(src)
        if array is None:
            raise DiscoError(f"copy_from_worker_0: register {reg_id} holds a "
                             f"{type(src).__name__}, not a tensor")
        _check_same(host, array, f"copy_from_worker_0 from register {reg_id}")
        np.copyto(host, array)

    @staticmethod
    def _snapshot(value: Any) -> Any:
        array = as_host_array(value)
        if array is not None:
            return np.array(array, copy=True)
        return value


def _check_same(host: np.ndarray, remote: Any, what: str) -> None:
    shape = tuple(getattr(remote, "shape", ()))
    dtype = np.dtype(getattr(remote, "dtype", "float32"))
    if tuple(host.shape) != shape or host.dtype != dtype:
        raise DiscoError(f"{what}: the host array is {tuple(host.shape)} {host.dtype}, the "
                         f"worker's tensor is {shape} {dtype}; they must match")


class LocalWorker:
    """A worker on a thread of this process (all workers of ThreadedSession; worker-0 elsewhere).

    Args:
        ctx: who this worker is.
        on_death: called with the reason when the thread ends without SHUTDOWN, so peers
            waiting for it in the data plane stop at once.
    """

    def __init__(self, ctx: WorkerContext,
                 on_death: Callable[[str], None] | None = None) -> None:
        self.ctx = ctx
        self.on_death = on_death
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.replies: queue.SimpleQueue = queue.SimpleQueue()
        self.worker = Worker(ctx, self.replies.put)
        self.death: str | None = None
        self.submit = self.commands.put
        self.thread = threading.Thread(target=self._loop, name=f"disco-worker-{ctx.worker_id}",
                                       daemon=True)
        self.thread.start()

    def next_reply(self, timeout: float) -> tuple | None:
        """The next reply, waiting up to timeout seconds (0: only one already there), or None."""
        if timeout <= 0:
            # NOTE: the controller is the only reader, so not empty means get_nowait succeeds.
            return None if self.replies.empty() else self.replies.get_nowait()
        try:
            return self.replies.get(timeout=timeout)
        except queue.Empty:
            return None

    def has_reply(self) -> bool:
        return not self.replies.empty()

    def check_alive(self) -> None:
        """Raise DiscoError when this worker's thread has ended."""
        if self.death is not None:
            raise DiscoError(f"worker {self.ctx.worker_id} thread ended ({self.death})")

    def stop(self) -> None:
        """Ask the thread to end (a SHUTDOWN nobody waits for) when it is still running."""
        if self.thread.is_alive():
            self.commands.put((int(A.SHUTDOWN), (), 0, None))

    def join(self, timeout: float) -> None:
        self.thread.join(timeout=timeout)

    def _loop(self) -> None:
        set_current(self.ctx)
        try:
            self._serve()
        except BaseException as e:  # SystemExit / KeyboardInterrupt in user code end the thread
            self.death = f"{type(e).__name__}: {e}"
            self.replies.put((None, False, f"worker {self.ctx.worker_id} thread ended by "
                                           f"{self.death}"))
            if self.on_death is not None:
                self.on_death(f"worker {self.ctx.worker_id} thread ended ({self.death})")
        finally:
            ccl = self.ctx.ccl
            if ccl is not None:
                ccl.close()

    def _serve(self) -> None:
        """Execute queued commands until SHUTDOWN."""
        get = self.commands.get
        execute = self.worker.execute
        while execute(get()):
            pass


class InlineWorker:
    """Worker-0 run in the controller's own thread: submit(cmd) executes cmd before returning.

    Replies wait in a deque for the controller, exactly as a thread's replies would; a
    BaseException in a command (SystemExit in user code, Ctrl-C) ends this worker like it would
    end a thread, and a KeyboardInterrupt still reaches the caller.
    """

    def __init__(self, ctx: WorkerContext,
                 on_death: Callable[[str], None] | None = None) -> None:
        self.ctx = ctx
        self.on_death = on_death
        self.replies: deque = deque()
        self.worker = Worker(ctx, self.replies.append)
        self.death: str | None = None

    def submit(self, cmd: Command) -> None:
        """Run cmd now, with this worker's context current on the calling thread."""
        if self.death is not None:
            return  # like a thread that ended: its commands are never run
        previous = swap_current(self.ctx)
        try:
            if not self.worker.execute(cmd):
                self.stop()
        except BaseException as e:
            self.death = f"{type(e).__name__}: {e}"
            self.replies.append((None, False, f"worker {self.ctx.worker_id} ended by "
                                              f"{self.death} (it runs in the controller's "
                                              "thread)"))
            self.stop()
            if self.on_death is not None:
                self.on_death(f"worker {self.ctx.worker_id} ended ({self.death})")
            if isinstance(e, KeyboardInterrupt):
                raise
        finally:
            swap_current(previous)

    def next_reply(self, timeout: float) -> tuple | None:
        """The next reply, or None: every reply is in before submit returns, so never wait."""
        return self.replies.popleft() if self.replies else None

    def has_reply(self) -> bool:
        return bool(self.replies)

    def check_alive(self) -> None:
        """Raise DiscoError when a command ended this worker."""
        if self.death is not None:
            raise DiscoError(f"worker {self.ctx.worker_id} ended ({self.death})")

    def stop(self) -> None:
        """Release the data plane (a thread would on ending); idempotent."""
        ccl = self.ctx.ccl
        self.ctx.ccl = None
        if ccl is not None:
            ccl.close()

    def join(self, timeout: float) -> None:
        """Nothing to wait for: no thread."""
