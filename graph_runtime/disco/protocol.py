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
    """The commands a controller sends (seed 000's DiscoAction, same numbers)."""

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
#   SHUTDOWN ()   KILL_REG ()   GET_GLOBAL_FUNC (name,)   CALL_PACKED (func_reg, args)
#   SYNC_WORKER (token,)   COPY_FROM_WORKER0 (host, token)   COPY_TO_WORKER0 (host, token|None)
#   DEBUG_GET_FROM_REMOTE (token,)   DEBUG_SET_REGISTER (value,)
# A reply is (token, ok, value): token None marks an error of an asynchronous command.
Command = tuple


class Reg(int):
    """A register id inside call_packed's arguments: the worker substitutes the register's value."""

    def __repr__(self) -> str:
        return f"Reg({int(self)})"

    def __reduce__(self) -> tuple:
        return (Reg, (int(self),))


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
        """The next complete frame if one is buffered, else a sentinel _NONE."""
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
        return _NONE

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


class _NoneType:
    def __repr__(self) -> str:
        return "_NONE"


_NONE = _NoneType()
NO_FRAME = _NONE


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


def as_host_array(value: Any) -> np.ndarray | None:
    """A host numpy copy-source for a tensor-like register value, or None if not a tensor."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "numpy") and callable(value.numpy):
        return np.asarray(value.numpy())
    if type(value).__module__.startswith("cupy"):
        return value.get()
    return None
