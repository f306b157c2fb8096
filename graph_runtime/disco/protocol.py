"""The control-plane protocol: the nine DiscoAction commands, argument checks and frame I/O."""
from __future__ import annotations

import os
import pickle
import select
import struct
import tempfile
import time
from enum import IntEnum
from typing import Any

import numpy as np

from ..device import Device
from ..errors import DiscoError


class DiscoAction(IntEnum):
    """The commands a controller sends (TVM's DiscoAction,
    include/tvm/runtime/disco/session.h, same numbers)."""

    SHUTDOWN = 0
    KILL_REG = 1
    GET_GLOBAL_FUNC = 2
    CALL_PACKED = 3
    SYNC_WORKER = 4
    COPY_FROM_WORKER0 = 5
    COPY_TO_WORKER0 = 6
    DEBUG_GET_FROM_REMOTE = 7
    DEBUG_SET_REGISTER = 8


# A command is a tuple (action, frees, reg_id, *payload): `frees` are register ids to kill before
# the command runs (frees ride along instead of costing a message), `reg_id` the register the
# command writes (0 when it writes none; register 0 is reserved). Payloads per action:
#   SHUTDOWN ()   KILL_REG ()   GET_GLOBAL_FUNC (name,)   CALL_PACKED (func_reg, args, regpos)
#   SYNC_WORKER (token,)   COPY_FROM_WORKER0 (host, token)   COPY_TO_WORKER0 (host, token|None)
#   DEBUG_GET_FROM_REMOTE (token,)   DEBUG_SET_REGISTER (value,)
# In CALL_PACKED, args[i] for every i in regpos is a register id the worker replaces by the
# register's value; commands hold only plain values so they pickle small and fast.
# A reply is (token, ok, value): token None marks an error of an asynchronous command.
Command = tuple


def describe_command(cmd: Command) -> str:
    """A short human description of a command for error messages."""
    action = DiscoAction(cmd[0])
    if action == DiscoAction.GET_GLOBAL_FUNC:
        return f"get_global_func({cmd[3]!r}) into register {cmd[2]}"
    if action == DiscoAction.CALL_PACKED:
        return f"call_packed(register {cmd[3]}) into register {cmd[2]}"
    return f"{action.name.lower()} (register {cmd[2]})"


_SCALARS = (bool, int, float, str, type(None), Device, np.dtype, np.integer, np.floating)


def check_arg(value: Any, index: int) -> Any:
    """A call_packed argument as it travels: scalars, dtypes, Devices, shape tuples, registers."""
    if isinstance(value, _SCALARS):
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            return float(value)
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, (int, np.integer)) and
                                                not isinstance(v, bool) for v in value):
        return tuple(int(v) for v in value)
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value)
    kind = type(value).__module__ + "." + type(value).__qualname__
    if isinstance(value, np.ndarray) or hasattr(value, "__dlpack__") or hasattr(value, "numpy"):
        raise DiscoError(f"call_packed argument {index} is a tensor ({kind}): tensors do not "
                         "travel on the control channel; put it on the workers with "
                         "sess.copy_to_worker_0(...), sess.broadcast(...) or sess.scatter(...) "
                         "and pass the DRef")
    raise DiscoError(f"call_packed argument {index} has unsupported type {kind}; expected int, "
                     "float, str, None, a dtype, a Device, a shape tuple of ints or a DRef")


# ---- frames on pipes: 4-byte little-endian length + pickle ------------------------------------

_LEN = struct.Struct("<I")


def encode_frame(obj: Any) -> bytes:
    """One frame: length prefix and pickled body."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(body)) + body


def _gil_holding_write() -> Any:
    """libc write(2) called without releasing the GIL, or None where ctypes cannot load libc."""
    try:
        import ctypes
        write = ctypes.PyDLL(None, use_errno=True).write
    except (ImportError, OSError, AttributeError):
        return None
    write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    write.restype = ctypes.c_ssize_t
    return write


# NOTE: os.write releases the GIL, and a worker-0 thread woken by the command just queued for it
# grabs it: every command then costs two thread switches. A write to a non-blocking pipe never
# blocks, so the fast path keeps the GIL; a full pipe falls back to write_all.
_WRITE = _gil_holding_write()


def send_frame(fd: int, frame: bytes, deadline: float, who: str) -> None:
    """Write one frame to a non-blocking fd: one write call when the pipe has room."""
    if _WRITE is not None:
        n = _WRITE(fd, frame, len(frame))
        if n == len(frame):
            return
        if n > 0:
            frame = frame[n:]
    write_all(fd, frame, deadline, who)


def write_all(fd: int, data: bytes, deadline: float, who: str) -> None:
    """Write all of data to a non-blocking fd, waiting at most until deadline."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            n = 0
        except (BrokenPipeError, OSError) as e:
            raise DiscoError(f"{who}: the channel is closed ({e}); the peer has exited") from e
        view = view[n:]
        if view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DiscoError(f"{who}: timed out writing to a full channel; the peer is "
                                 "not reading (stuck or dead)")
            select.select([], [fd], [], left)


class FrameReader:
    """Reads frames from a blocking-or-not fd, buffering so one read can yield many frames."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray()
        self._pos = 0

    def next_frame(self) -> Any:
        """The next complete frame if one is buffered, else the sentinel NO_FRAME."""
        buf = self._buf
        if len(buf) - self._pos >= 4:
            (size,) = _LEN.unpack_from(buf, self._pos)
            end = self._pos + 4 + size
            if len(buf) >= end:
                obj = pickle.loads(memoryview(buf)[self._pos + 4:end])
                self._pos = end
                if self._pos == len(buf):
                    buf.clear()
                    self._pos = 0
                return obj
        return NO_FRAME

    def next_frame_ready(self) -> bool:
        """Whether a complete frame is buffered."""
        left = len(self._buf) - self._pos
        return left >= 4 and left >= 4 + _LEN.unpack_from(self._buf, self._pos)[0]

    def fill(self) -> bool:
        """Read what is available (blocking if the fd blocks); False on end of file."""
        try:
            chunk = os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += chunk
        return True

    def read_frames(self) -> list | None:
        """Block for input, then every complete frame it completes; None on end of file."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            return None
        buf = self._buf
        if buf:
            buf += chunk
            data: Any = buf
        else:
            data = chunk  # the usual case: whole frames, no copy into the buffer
        view = memoryview(data)
        frames = []
        pos = 0
        end = len(data)
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(data, pos)
            stop = pos + 4 + size
            if stop > end:
                break
            frames.append(pickle.loads(view[pos + 4:stop]))
            pos = stop
        view.release()
        if data is buf:
            del buf[:pos]
        elif pos < end:
            buf += data[pos:]
        return frames


class _NoFrame:
    def __repr__(self) -> str:
        return "NO_FRAME"


NO_FRAME = _NoFrame()


# ---- register values crossing a process boundary (debug get/set only) ------------------------

class ShmArray:
    """A numpy array parked in a /dev/shm file so it never rides on the control channel."""

    def __init__(self, array: np.ndarray) -> None:
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self.path = tempfile.mkstemp(prefix="graph_runtime_disco_", dir=directory)
        with os.fdopen(fd, "wb") as f:
            f.write(np.ascontiguousarray(array).tobytes())
        self.dtype = array.dtype.str
        self.shape = tuple(array.shape)

    def take(self) -> np.ndarray:
        """Read the array back and delete the file."""
        try:
            data = np.fromfile(self.path, dtype=np.dtype(self.dtype))
        finally:
            os.unlink(self.path)
        return data.reshape(self.shape)


def pack_value(value: Any) -> Any:
    """A register value ready to cross processes: arrays via shared memory, the rest pickled."""
    array = as_host_array(value)
    if array is not None:
        return ShmArray(array)
    try:
        pickle.dumps(value)
    except Exception:
        return f"<unpicklable {type(value).__qualname__}: {value!r}>"
    return value


def unpack_value(value: Any) -> Any:
    """Undo pack_value."""
    if isinstance(value, ShmArray):
        return value.take()
    return value


def host_array(value: Any) -> np.ndarray | None:
    """A numpy array itself, an NDArray's (any .numpy() tensor's) host copy, else None."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "numpy") and callable(value.numpy):
        return np.asarray(value.numpy())
    return None


def as_host_array(value: Any) -> np.ndarray | None:
    """host_array, and also raw CuPy register values (nccl workers); None if not a tensor."""
    array = host_array(value)
    if array is None and type(value).__module__.startswith("cupy"):
        return value.get()
    return array
