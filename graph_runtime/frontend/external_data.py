"""External tensor data, read only from regular files inside the model's folder, as declared.

onnx.load would resolve external data itself (and some onnx versions `setup.cfg` allows let a
location escape the folder), and it skips sparse tensors, which constant folding then resolved
against the working directory. So the importer loads the proto without external data and this
module fills every external tensor in: initializers, sparse initializers, node attributes
(Constant values, subgraphs, local functions), each with the project's own checks.
"""
from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import FrontendError
from .ir import Unsupported
from .tensor_data import declared_bytes

_KEYS = ("location", "offset", "length", "checksum", "basepath")
_NUMBER = re.compile(r"[0-9]{1,19}")


def model_tensors(model: Any) -> Iterator[tuple[str, Any]]:
    """(where, TensorProto) for every tensor a model holds, subgraphs and functions included."""
    yield from _graph_tensors(model.graph, "graph")
    for f in model.functions:
        yield from _node_tensors(f.node, f"function {f.name!r}")


def _graph_tensors(graph: Any, where: str) -> Iterator[tuple[str, Any]]:
    for t in graph.initializer:
        yield f"{where} initializer {t.name!r}", t
    for s in graph.sparse_initializer:
        yield from _sparse_parts(s, f"{where} sparse initializer {s.values.name!r}")
    yield from _node_tensors(graph.node, where)


def _sparse_parts(sparse: Any, where: str) -> Iterator[tuple[str, Any]]:
    yield f"{where} values", sparse.values
    yield f"{where} indices", sparse.indices


def _node_tensors(nodes: Any, where: str) -> Iterator[tuple[str, Any]]:
    for i, node in enumerate(nodes):
        label = f"{where} node {i} {node.name or node.op_type!r}"
        for a in node.attribute:
            at = f"{label} attribute {a.name!r}"
            if a.HasField("t"):
                yield at, a.t
            for t in a.tensors:
                yield at, t
            if a.HasField("sparse_tensor"):
                yield from _sparse_parts(a.sparse_tensor, at)
            for s in a.sparse_tensors:
                yield from _sparse_parts(s, at)
            if a.HasField("g"):
                yield from _graph_tensors(a.g, at)
            for g in a.graphs:
                yield from _graph_tensors(g, at)


def has_external_data(model: Any) -> bool:
    from onnx import TensorProto
    return any(t.data_location == TensorProto.EXTERNAL for _, t in model_tensors(model))


def load_external_data(model: Any, folder: Path | None) -> None:
    """Read every external tensor of model (in place) from files confined to folder.

    Raises FrontendError naming the tensor when a location leaves the folder, is not a regular
    file, has more than one hard link, is shorter than declared, or when there is no folder (a
    ModelProto given alone).
    """
    from onnx import TensorProto
    for where, tensor in model_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        try:
            data = _read(tensor, where, folder)
        except Unsupported as e:
            raise FrontendError(str(e)) from None
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT
        tensor.raw_data = data


def _entries(tensor: Any, where: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for e in tensor.external_data:
        if e.key not in _KEYS:
            raise Unsupported(f"{where}: external_data key {e.key!r}; expected one of: "
                              + ", ".join(_KEYS))
        entries[e.key] = e.value
    return entries


def _number(entries: dict[str, str], key: str, where: str) -> int | None:
    text = entries.get(key)
    if text is None:
        return None
    if not _NUMBER.fullmatch(text):
        raise Unsupported(f"{where}: external_data {key} {text[:40]!r}; expected a byte count")
    return int(text)


def confined_path(location: str, folder: Path, where: str) -> Path:
    """location resolved inside folder; refuses '..', absolute paths and links leaving it."""
    parts = re.split(r"[/\\]", location)
    if not location or "\x00" in location:
        raise Unsupported(f"{where}: external data location {location!r}; expected a file "
                          "name relative to the model's folder")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or re.match(r"[A-Za-z]:",
                                                                                 location):
        raise Unsupported(f"{where}: external data location {location!r} is absolute; expected "
                          "a path relative to the model's folder")
    if ".." in parts:
        raise Unsupported(f"{where}: external data location {location!r} contains '..'; "
                          "expected a path inside the model's folder")
    base = Path(os.path.realpath(folder))
    path = Path(os.path.realpath(base / location))
    if path == base or base not in path.parents:
        raise Unsupported(f"{where}: external data location {location!r} resolves to {path}, "
                          f"outside the model's folder {base}")
    return path


def _read(tensor: Any, where: str, folder: Path | None) -> bytes:
    entries = _entries(tensor, where)
    location = entries.get("location", "")
    if folder is None:
        raise Unsupported(f"{where}: its data is in external file {location!r}, and a ModelProto "
                          "alone does not say which folder that is in; pass the model's path, "
                          "or the folder (from_onnx(model, base_dir=FOLDER))")
    need = declared_bytes(tensor, where)
    offset = _number(entries, "offset", where) or 0
    length = _number(entries, "length", where)
    if length is not None and length != need:
        raise Unsupported(f"{where}: external_data length {length}; its dims {list(tensor.dims)} "
                          f"need {need} bytes")
    path = confined_path(location, folder, where)
    try:
        info = os.stat(path)
    except OSError as e:
        raise Unsupported(f"{where}: external data file {location!r}: {e.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise Unsupported(f"{where}: external data {location!r} is not a regular file "
                          f"({_kind(info.st_mode)})")
    _refuse_hard_link(info, where, location)
    if offset + need > info.st_size:
        raise Unsupported(f"{where}: external data {location!r} holds {info.st_size} bytes; "
                          f"expected {need} from offset {offset}")
    return _read_exactly(path, offset, need, info, f"{where}: external data {location!r}")


def _refuse_hard_link(info: os.stat_result, where: str, location: str) -> None:
    """Refuse a file with more than one name: a hard link's other name may lie outside the folder.

    NOTE: realpath sees through symbolic links only. A hard link made inside the folder to a
    file elsewhere (another user's secrets, /etc/shadow on the same file system) is a regular
    file under the folder by every path check, and nothing on the file says where its other
    names are; so any file whose link count is not 1 is refused.
    """
    if info.st_nlink != 1:
        raise Unsupported(f"{where}: external data {location!r} has {info.st_nlink} hard links, "
                          "so its data may come from outside the model's folder; copy the file "
                          "into the folder (cp, not ln) so it has a single name")


def _read_exactly(path: Path, offset: int, need: int, info: os.stat_result, what: str) -> bytes:
    # NOTE: O_NONBLOCK and O_NOFOLLOW: if the file was swapped for a FIFO or a link after the
    # stat, the open neither blocks nor follows it, and the fstat below refuses it.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise Unsupported(f"{what}: {e.strerror}") from None
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (info.st_dev,
                                                                          info.st_ino):
            raise Unsupported(f"{what}: the file changed while being opened")
        if now.st_nlink != 1:
            raise Unsupported(f"{what}: the file gained a hard link while being opened")
        chunks = []
        got = 0
        while got < need:
            chunk = os.pread(fd, min(need - got, 1 << 24), offset + got)
            if not chunk:
                raise Unsupported(f"{what}: ended after {got} of {need} bytes")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise Unsupported(f"{what}: {e.strerror}") from None
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"
