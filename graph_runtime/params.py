"""TVM's binary param-dict format (read and written byte-exactly) and .npz param files."""
from __future__ import annotations

import io
import math
import mmap
import os
import stat
import struct
import tokenize
import zipfile
import zlib
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from .dtypes import DLPACK_CODES
from .errors import ParamsError
from .graph.checks import SUPPORTED_DTYPES

if TYPE_CHECKING:
    from .nd import NDArray

# Layout (all little-endian), as TVM writes it (SaveParams, then Tensor/NDArray Save per array):
#   u64 LIST_MAGIC, u64 reserved, u64 name count, per name (u64 byte length, UTF-8 bytes),
#   u64 array count, per array:
#     u64 ARRAY_MAGIC, u64 reserved, DLDevice (i32 type, i32 id), i32 ndim,
#     DLDataType (u8 code, u8 bits, u16 lanes), i64 shape[ndim], i64 data byte size, data.
LIST_MAGIC = 0xF7E58D4F05049CB7  # kTVMNDArrayListMagic
ARRAY_MAGIC = 0xDD5E40F096B4A13F  # kTVMNDArrayMagic
MAX_NDIM = 32
KDL_CPU = 1
_HEADER = struct.Struct("<QQQ")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_RECORD = struct.Struct("<QQiiiBBH")
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a zip with entries, an empty zip

# DLDataType codes (dlpack.h).
_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "handle", 4: "bfloat", 5: "complex",
               6: "bool", 10: "float8_e4m3fn", 11: "float8_e4m3fnuz", 12: "float8_e5m2",
               13: "float8_e5m2fnuz", 14: "float8_e8m0fnu", 17: "float4_e2m1fn"}
# (code, bits) per supported dtype; bool is kDLBool with 8 bits, as TVM 0.27 writes it.
_DLTYPE_OF: dict[np.dtype, tuple[int, int]] = {
    np.dtype(name): (code, np.dtype(name).itemsize * 8)
    for code, names in ((0, ("int8", "int16", "int32", "int64")),
                        (1, ("uint8", "uint16", "uint32", "uint64")),
                        (2, ("float16", "float32", "float64")),
                        (6, ("bool",)))
    for name in names
}
_DLTYPE_OF.update({np.dtype(name): code for name, code in DLPACK_CODES.items()})
_DTYPE_OF: dict[tuple[int, int], np.dtype] = {dl: dtype for dtype, dl in _DLTYPE_OF.items()}
# Older TVM wrote bool as uint1 (one byte per element).
_DTYPE_OF[(1, 1)] = np.dtype("bool")
# The dtypes a params file may hold: the graph's own list (one list, in graph/checks.py).
assert all(np.dtype(d) in _DLTYPE_OF for d in SUPPORTED_DTYPES), "a graph dtype lacks a code"
_DTYPE_LIST = ", ".join(str(d) for d in _DLTYPE_OF)  # for messages, grouped by DLPack code


class _Reader:
    """A cursor over untrusted bytes: every read is bounds-checked and names its offset."""

    def __init__(self, data: bytes | bytearray | memoryview, source: str) -> None:
        try:
            self.buf = memoryview(data).cast("B")
        except TypeError as e:
            raise ParamsError(f"{source}: expected bytes, bytearray or memoryview, "
                              f"got {type(data).__name__}") from e
        self.pos = 0
        self.source = source

    @property
    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def error(self, at: int, what: str, expected: str, found: str) -> ParamsError:
        return ParamsError(f"{self.source}: byte {at}: {what}: expected {expected}, found {found}")

    def unpack(self, layout: struct.Struct, what: str) -> tuple[Any, ...]:
        if self.remaining < layout.size:
            raise self.error(self.pos, what, f"{layout.size} bytes",
                             f"{self.remaining} (file truncated)")
        values = layout.unpack_from(self.buf, self.pos)
        self.pos += layout.size
        return values

    def take(self, size: int, what: str) -> memoryview:
        if size > self.remaining:
            raise self.error(self.pos, what, f"{size} bytes", f"{self.remaining} (file truncated)")
        chunk = self.buf[self.pos:self.pos + size]
        self.pos += size
        return chunk


def _dtype_name(code: int, bits: int, lanes: int) -> str:
    base = f"{_CODE_NAMES.get(code, f'code{code}')}{bits}"
    return base if lanes == 1 else f"{base}x{lanes}"


def _read_names(r: _Reader) -> list[str]:
    at = r.pos
    (count,) = r.unpack(_U64, "name count")
    # NOTE: check the untrusted count against the bytes left before building anything from it.
    if count > r.remaining // _U64.size:
        raise r.error(at, "name count", f"at most {r.remaining // _U64.size} "
                      f"(8 bytes per name length, {r.remaining} bytes left)", str(count))
    names: list[str] = []
    first_index: dict[str, int] = {}
    for i in range(count):
        at = r.pos
        (length,) = r.unpack(_U64, f"length of name {i}")
        raw = r.take(length, f"name {i} ({length} bytes of UTF-8)")
        try:
            name = str(raw, "utf-8")
        except UnicodeDecodeError as e:
            raise r.error(at + 8 + e.start, f"name {i}", "UTF-8 text",
                          f"byte 0x{raw[e.start]:02x}") from e
        if name in first_index:
            raise r.error(at, f"name {i}", "unique names",
                          f"{name!r} again (name {first_index[name]})")
        first_index[name] = i
        names.append(name)
    return names


def _read_array(r: _Reader, what: str, copy: bool = True) -> np.ndarray:
    at = r.pos
    magic, _reserved, dev_type, _dev_id, ndim, code, bits, lanes = r.unpack(_RECORD,
                                                                           f"{what} header")
    if magic != ARRAY_MAGIC:
        raise r.error(at, f"{what} magic", f"0x{ARRAY_MAGIC:016X} (TVM NDArray)", f"0x{magic:016X}")
    if dev_type != KDL_CPU:
        raise r.error(at + 16, f"{what} device type", f"{KDL_CPU} (kDLCPU; TVM saves only CPU "
                      "tensors)", str(dev_type))
    if not 0 <= ndim <= MAX_NDIM:
        raise r.error(at + 24, f"{what} ndim", f"0..{MAX_NDIM}", str(ndim))
    dtype = _DTYPE_OF.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        raise r.error(at + 28, f"{what} dtype", "one of " + _DTYPE_LIST,
                      f"{_dtype_name(code, bits, lanes)} (code {code}, bits {bits}, "
                      f"lanes {lanes})")
    shape_at = r.pos
    shape = r.unpack(struct.Struct(f"<{ndim}q"), f"{what} shape ({ndim} int64)")
    if any(dim < 0 for dim in shape):
        raise r.error(shape_at, f"{what} shape", "non-negative dims", str(shape))
    size_at = r.pos
    (size,) = r.unpack(_I64, f"{what} data byte size")
    numel = math.prod(shape)
    if size != numel * dtype.itemsize:
        raise r.error(size_at, f"{what} data byte size", f"{numel * dtype.itemsize} "
                      f"({numel} x {dtype} of shape {shape})", str(size))
    data = r.take(size, f"{what} data")
    stored = np.uint8 if dtype == np.bool_ else dtype.newbyteorder("<")
    try:
        view = np.frombuffer(data, dtype=stored).reshape(shape)
    except ValueError as e:  # an empty array whose other dims overflow numpy's size limit
        raise r.error(shape_at, f"{what} shape", "dims numpy can hold", str(shape)) from e
    if not copy and view.dtype == dtype:
        return view  # a view of the data (unaligned where the file puts it so)
    # A fresh array owning its memory, not a view of the file; for bool any non-zero byte is true.
    return view.astype(dtype)


def load_param_arrays(data: bytes | bytearray | memoryview,
                      source: str = "<params>", copy: bool = True) -> dict[str, np.ndarray]:
    """Parse a TVM param dict into writable numpy arrays, in file order.

    Args:
        data: the whole file. Trailing bytes after the last array are an error.
        source: the file name (or other origin) that error messages start with.
        copy: False: views of data where the dtype allows (read-only when data is, and
            unaligned where the file's layout puts them), for a caller that copies them once.
    """
    r = _Reader(data, source)
    magic, _reserved = r.unpack(struct.Struct("<QQ"), "header")
    if magic != LIST_MAGIC:
        raise r.error(0, "magic", f"0x{LIST_MAGIC:016X} (TVM param dict)", f"0x{magic:016X}")
    names = _read_names(r)
    at = r.pos
    (count,) = r.unpack(_U64, "array count")
    if count != len(names):
        raise r.error(at, "array count", f"{len(names)} (one per name)", str(count))
    arrays = {name: _read_array(r, f"array {i} {name!r}", copy)
              for i, name in enumerate(names)}
    if r.remaining:
        raise r.error(r.pos, "end of data", f"end after {len(names)} arrays",
                      f"{r.remaining} more bytes")
    return arrays


def load_param_dict(data: bytes | bytearray | memoryview) -> dict[str, NDArray]:
    """Parse a TVM param dict (as TVM's load_param_dict does) into NDArrays on cpu(0)."""
    from .device import cpu
    from .nd import array as nd_array

    return {name: nd_array(value, device=cpu(0))
            for name, value in load_param_arrays(data).items()}


def _to_numpy(name: object, value: Any, noun: str = "param") -> tuple[str, np.ndarray]:
    """A param as (name, C-contiguous native-order array of a supported dtype).

    noun names what the array is in messages ("param", "input", "expected value").
    """
    if not isinstance(name, str):
        raise ParamsError(f"{noun} names must be str, got {type(name).__name__} {name!r}")
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as e:  # e.g. a CuPy array (no implicit copy), a ragged list
        raise ParamsError(f"{noun} {name!r}: cannot make a numpy array from "
                          f"{type(value).__name__}: {e}") from e
    dtype = array.dtype.newbyteorder("=")
    if dtype not in _DLTYPE_OF:
        raise ParamsError(f"{noun} {name!r}: dtype {array.dtype} is not supported; expected one "
                          "of " + _DTYPE_LIST)
    return name, np.asarray(array, dtype=dtype, order="C")  # ascontiguousarray makes 0-d 1-d


def save_param_dict(params: Mapping[str, Any]) -> bytes:
    """Serialize params exactly as TVM's save_param_dict does (CPU device, insertion order).

    Args:
        params: name -> numpy array, NDArray (anything with .numpy()) or array-like.
    """
    if not isinstance(params, Mapping):
        raise ParamsError(f"params must be a mapping of name to array, got {type(params).__name__}")
    items = [_to_numpy(name, value) for name, value in params.items()]
    parts: list[Any] = [_HEADER.pack(LIST_MAGIC, 0, len(items))]
    for name, _ in items:
        try:
            encoded = name.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ParamsError(f"param {name!r}: name is not encodable as UTF-8: {e.reason}") from e
        parts += [_U64.pack(len(encoded)), encoded]
    parts.append(_U64.pack(len(items)))
    for name, array in items:
        code, bits = _DLTYPE_OF[array.dtype]
        parts.append(_RECORD.pack(ARRAY_MAGIC, 0, KDL_CPU, 0, array.ndim, code, bits, 1))
        parts.append(struct.pack(f"<{array.ndim}qq", *array.shape, array.nbytes))
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        parts.append(little.reshape(-1).view(np.uint8))  # join takes buffers: no extra copy
    return b"".join(parts)


# Deflate never expands data more than ~1032 times: an .npy header claiming more than that many
# bytes per stored byte lies, and numpy would allocate it all before reading (1e11 floats).
_MAX_DEFLATE_RATIO = 1032
# numpy parses an .npy header with tokenize and ast: a mangled one raises their errors too.
_NPZ_ERRORS = (ValueError, OSError, EOFError, KeyError, IndexError, TypeError, OverflowError,
               zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, MemoryError,
               struct.error, SyntaxError, tokenize.TokenError)
# ... of which these come from the zip layer: a damaged or truncated file, not its arrays.
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError)


def _read_npz(file: Any, source: str, noun: str = "param") -> dict[str, np.ndarray]:
    """The arrays of an .npz (a path or a file object); every failure is a ParamsError."""
    arrays: dict[str, np.ndarray] = {}
    key = None
    try:
        with zipfile.ZipFile(file) as zf:
            for info in zf.infolist():
                key = info.filename
                if info.flag_bits & 0x1:
                    raise ParamsError(f"member {key!r} is encrypted; numpy cannot read it")
                if not key.endswith(".npy"):
                    raise ParamsError(f"member {key!r} is not a .npy array (an .npz holds "
                                      "NAME.npy members)")
                with zf.open(info) as member:
                    arrays[key[:-4]] = _read_npy_member(member, info, key, noun)
    except ParamsError as e:
        raise ParamsError(f"{source}: {e}") from e
    except _NPZ_ERRORS as e:
        where = source if key is None else f"{source}: member {key!r}"
        found = f"{type(e).__name__}: {str(e)[:200] or 'no details'}"
        if isinstance(e, _ZIP_ERRORS):
            raise ParamsError(f"{where}: cannot read the .npz's zip (damaged, truncated, or a "
                              f"compression numpy does not read): {found}") from e
        raise ParamsError(f"{where}: expected a numpy .npz without pickled objects, "
                          f"found {found}") from e
    return arrays


def _read_npy_member(member: Any, info: zipfile.ZipInfo, key: str, noun: str) -> np.ndarray:
    """One .npy member, its header's size checked against the bytes the zip says it holds."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
    if dtype.hasobject:
        raise ParamsError(f"member {key!r} holds Python objects (pickled); not loaded")
    count = 1
    for dim in shape:
        count *= int(dim)
    nbytes = count * dtype.itemsize
    most = min(info.file_size, max(info.compress_size, 1) * _MAX_DEFLATE_RATIO)
    if nbytes > most:
        raise ParamsError(f"member {key!r}: its header declares shape {tuple(shape)} {dtype} "
                          f"({nbytes} bytes) but the member holds at most {most} bytes")
    data = member.read(nbytes)
    if len(data) != nbytes:
        raise ParamsError(f"member {key!r}: expected {nbytes} bytes of data, found {len(data)}")
    array = np.frombuffer(data, dtype=dtype)
    array = array.reshape(shape[::-1]).T if fortran else array.reshape(shape)
    return _to_numpy(key[:-4], array, noun)[1]


class MappedArrays(dict):
    """load_params_file(views=True)'s arrays: read-only views of the file at path mapped into
    memory, with offsets[name], where each view's data starts in the file (views only)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], offsets: Mapping[str, int],
                 path: str) -> None:
        super().__init__(arrays)
        self.offsets = dict(offsets)
        self.path = path


def read_params_into(path: str, arrays: MappedArrays, targets: Mapping[str, np.ndarray]) -> None:
    """Fill targets[name] with the bytes of the file's array name, by preadv straight into them.

    arrays are load_params_file(path, views=True) of the same file, which checked its layout;
    each target is C-contiguous, writable, of its array's dtype and shape, and the array is a
    view (in arrays.offsets). The file's bytes between the targets (headers, arrays not asked
    for) land in one scratch buffer, so a whole weight file is one system call per 1024
    buffers: the kernel copies it from the page cache into the module's storage while the GIL
    is free, with no copy in between. Where preadv is missing or reads short, the rest is
    copied from the views.
    """
    spans = sorted(((arrays.offsets[name], name) for name in targets), key=lambda s: s[0])
    done = 0
    if hasattr(os, "preadv") and spans:
        fd = os.open(path, os.O_RDONLY)
        try:
            done = _preadv_spans(fd, [(offset, targets[name]) for offset, name in spans])
        finally:
            os.close(fd)
    for _, name in spans[done:]:
        np.copyto(targets[name], arrays[name])


def _preadv_spans(fd: int, spans: list[tuple[int, np.ndarray]]) -> int:
    """Read each (file offset, target) in file order with preadv; how many were filled."""
    iov_max = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024
    gaps = [nxt[0] - (cur[0] + cur[1].nbytes) for cur, nxt in zip(spans, spans[1:])]
    scratch = memoryview(bytearray(max(gaps, default=0)))
    done = 0
    while done < len(spans):
        buffers: list[Any] = [spans[done][1].reshape(-1).view(np.uint8)]
        count = 1
        while done + count < len(spans) and len(buffers) + 2 <= iov_max:
            gap = gaps[done + count - 1]
            if gap:
                buffers.append(scratch[:gap])
            buffers.append(spans[done + count][1].reshape(-1).view(np.uint8))
            count += 1
        want = sum(len(b) if isinstance(b, memoryview) else b.nbytes for b in buffers)
        if os.preadv(fd, buffers, spans[done][0]) != want:
            return done  # a short read: the caller copies the rest from the mapped file
        done += count
    return done


def _mapped_arrays(f: Any, source: str) -> MappedArrays:
    """The TVM params file f, mapped read-only, parsed into views and their file offsets."""
    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    arrays = load_param_arrays(memoryview(mapped), source, copy=False)
    base = np.frombuffer(mapped, np.uint8)
    offsets = {name: int(a.ctypes.data) - int(base.ctypes.data) for name, a in arrays.items()
               if a.size and np.may_share_memory(a, base)}
    return MappedArrays(arrays, offsets, source)


def load_params_file(path: str | os.PathLike[str], what: str = "params",
                     views: bool = False) -> dict[str, np.ndarray]:
    """Read a params file: TVM binary (any file name, found by its magic) or numpy .npz.

    The file must be a regular file (a FIFO would hang, /dev/zero never end); its magic is
    checked before the rest is read, and a TVM file's declared sizes against its size.
    what names the file's role in messages ("params", "inputs", "expected values").
    views: a TVM file's arrays are read-only views of the file mapped into memory
    (MappedArrays), which GraphModule.load_params reads straight into its storage
    (read_params_into): the weights then pass through memory once instead of three times
    (read, a copy per array, the copy into the module).
    """
    source = os.fspath(path)
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise ParamsError(f"{source}: is a directory; give a {what} file")
        if not stat.S_ISREG(info.st_mode):
            raise ParamsError(f"{source}: not a regular file (a FIFO or a device); give a "
                              f"{what} file")
        with open(path, "rb") as f:
            head = f.read(8)
            if head.startswith(_ZIP_MAGICS):
                f.seek(0)
                noun = {"inputs": "input", "expected values": "expected value"}.get(what, "param")
                return _read_npz(f, source, noun)
            if len(head) == 8 and _U64.unpack(head)[0] == LIST_MAGIC:
                f.seek(0)
                if views:
                    return _mapped_arrays(f, source)
                data = f.read(info.st_size)
                return load_param_arrays(data, source)
    except OSError as e:
        raise ParamsError(f"{source}: cannot read the {what} file: {e.strerror or e}") from e
    found = head.hex(" ") or "an empty file"
    raise ParamsError(f"{source}: byte 0: file kind: expected TVM param dict (magic "
                      f"0x{LIST_MAGIC:016X}) or .npz (zip, 'PK'), found {found}")


def _npz_bytes(items: list[tuple[str, np.ndarray]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, array in items:
            # NOTE: zip truncates member names at NUL, so such a name would come back different.
            if "\0" in name:
                raise ParamsError(f"param {name!r}: .npz member names cannot contain NUL; "
                                  "save as TVM binary instead")
            # A fixed date makes the file a function of the params alone.
            member_info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(member_info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
    return buffer.getvalue()


def save_params_file(path: str | os.PathLike[str], params: Mapping[str, Any]) -> None:
    """Write params as .npz when the path ends in .npz, else as TVM's binary param dict."""
    if os.fspath(path).lower().endswith(".npz"):
        if not isinstance(params, Mapping):
            raise ParamsError(f"params must be a mapping of name to array, "
                              f"got {type(params).__name__}")
        data = _npz_bytes([_to_numpy(name, value) for name, value in params.items()])
    else:
        data = save_param_dict(params)
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:
        raise ParamsError(f"{os.fspath(path)}: cannot write params file: {e.strerror or e}") from e
