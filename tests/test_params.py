"""Tests for graph_runtime/params.py: TVM's param dict (checked on TVM-made golden files), .npz."""
from __future__ import annotations

import io
import os
import re
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from graph_runtime.errors import ParamsError
from graph_runtime.graph.checks import CORE_DTYPES, SUPPORTED_DTYPES
from graph_runtime.params import (ARRAY_MAGIC, LIST_MAGIC, MappedArrays, load_param_arrays,
                                  load_param_dict, load_params_file, read_params_into,
                                  save_param_dict, save_params_file)

GOLDEN = Path(__file__).parent / "data" / "params"
CASES = sorted(p.stem for p in GOLDEN.glob("*.params"))


def npz_dict(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def assert_same_arrays(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Same names in the same order, same dtype and shape, same bytes (so NaN and -0.0 count)."""
    assert list(got) == list(want)
    for name, array in want.items():
        assert isinstance(got[name], np.ndarray), name
        assert (got[name].dtype, got[name].shape) == (array.dtype, array.shape), name
        assert got[name].tobytes() == array.tobytes(), name


def record(code: int, bits: int, shape: tuple[int, ...], data: bytes, *, lanes: int = 1,
           device: tuple[int, int] = (1, 0), size: int | None = None) -> bytes:
    """One NDArray record laid out by hand."""
    return (struct.pack("<QQiiiBBH", ARRAY_MAGIC, 0, device[0], device[1], len(shape), code, bits,
                        lanes)
            + struct.pack(f"<{len(shape)}q", *shape)
            + struct.pack("<q", len(data) if size is None else size) + data)


def param_file(names: list[str], records: list[bytes]) -> bytes:
    """A whole param dict laid out by hand."""
    out = struct.pack("<QQQ", LIST_MAGIC, 0, len(names))
    for name in names:
        encoded = name.encode()
        out += struct.pack("<Q", len(encoded)) + encoded
    return out + struct.pack("<Q", len(records)) + b"".join(records)


# --- golden files written by TVM 0.27 (tests/data/params/make_golden.py) ---------------------

def test_golden_cases_present() -> None:
    assert {"dtypes", "scalars", "empty", "empty_inner", "names", "many", "large",
            "empty_dict"} <= set(CASES)
    for case in CASES:
        assert (GOLDEN / f"{case}.npz").exists(), case


@pytest.mark.parametrize("case", CASES)
def test_golden_file_loads_exactly(case: str) -> None:
    got = load_params_file(GOLDEN / f"{case}.params")
    assert_same_arrays(got, npz_dict(GOLDEN / f"{case}.npz"))
    for array in got.values():
        assert array.flags.writeable and array.flags.owndata and array.flags.c_contiguous


@pytest.mark.parametrize("case", CASES)
def test_writer_reproduces_golden_bytes(case: str, tmp_path: Path) -> None:
    golden = (GOLDEN / f"{case}.params").read_bytes()
    expected = npz_dict(GOLDEN / f"{case}.npz")
    assert save_param_dict(expected) == golden
    save_params_file(tmp_path / "out.params", expected)
    assert (tmp_path / "out.params").read_bytes() == golden


def test_golden_covers_every_supported_dtype() -> None:
    dtypes = {str(a.dtype) for a in npz_dict(GOLDEN / "dtypes.npz").values()}
    scalars = npz_dict(GOLDEN / "scalars.npz")
    assert dtypes == set(CORE_DTYPES)
    assert {str(a.dtype) for a in scalars.values()} == set(CORE_DTYPES)
    assert all(a.shape == () for a in scalars.values())
    assert "" in npz_dict(GOLDEN / "names.npz")
    assert len(npz_dict(GOLDEN / "many.npz")) == 500


def test_golden_values_are_the_intended_ones() -> None:
    got = load_params_file(GOLDEN / "dtypes.params")
    f16 = got["float16_edges"]
    assert f16[0] == 0 and np.signbit(f16[1]) and np.isnan(f16[6]) and f16[7] == 65504
    assert got["int64_edges"][0] == np.iinfo(np.int64).min
    assert got["uint64_edges"][1] == np.iinfo(np.uint64).max
    assert got["bool_edges"].tolist() == [True, False, False, True, True, False]
    names = list(load_params_file(GOLDEN / "names.params"))
    assert "日本語の名前" in names and "emoji 🧠➕" in names and "tab\tand\nnewline" in names


def test_load_param_dict_gives_cpu_ndarrays() -> None:
    from graph_runtime.device import cpu

    data = (GOLDEN / "dtypes.params").read_bytes()
    got = load_param_dict(data)
    want = npz_dict(GOLDEN / "dtypes.npz")
    assert list(got) == list(want)
    for name, nd in got.items():
        assert nd.device == cpu(0)
        assert nd.numpy().tobytes() == want[name].tobytes()
    assert save_param_dict(got) == data  # NDArrays are accepted through .numpy()


# --- layout built by hand ---------------------------------------------------------------------

def test_layout_of_a_tiny_dict() -> None:
    params = {"w": np.array([[1.0, -2.0]], "float32"), "flag": np.array(True)}
    expected = (struct.pack("<QQ", 0xF7E58D4F05049CB7, 0)
                + struct.pack("<Q", 2)
                + struct.pack("<Q", 1) + b"w" + struct.pack("<Q", 4) + b"flag"
                + struct.pack("<Q", 2)
                # float32 (code 2, 32 bits, 1 lane) on kDLCPU (1), id 0, shape (1, 2), 8 bytes
                + struct.pack("<QQiiiBBH", 0xDD5E40F096B4A13F, 0, 1, 0, 2, 2, 32, 1)
                + struct.pack("<qqq", 1, 2, 8) + struct.pack("<ff", 1.0, -2.0)
                # bool (kDLBool 6, 8 bits) 0-d: no shape, 1 byte
                + struct.pack("<QQiiiBBH", 0xDD5E40F096B4A13F, 0, 1, 0, 0, 6, 8, 1)
                + struct.pack("<q", 1) + b"\x01")
    assert save_param_dict(params) == expected
    assert_same_arrays(load_param_arrays(expected), params)


def test_reads_legacy_uint1_bool_and_any_nonzero_byte_as_true() -> None:
    data = param_file(["b"], [record(1, 1, (3,), b"\x00\x01\x07")])
    assert load_param_arrays(data)["b"].tolist() == [False, True, True]


def test_reserved_words_and_device_id_are_ignored_as_tvm_does() -> None:
    good = save_param_dict({"x": np.arange(3, dtype="int32")})
    data = bytearray(good)
    data[8] = 5  # list reserved word
    data[41 + 8] = 5  # array reserved word
    data[41 + 20] = 3  # device id
    assert_same_arrays(load_param_arrays(bytes(data)), load_param_arrays(good))


# --- round trips ------------------------------------------------------------------------------

class HasNumpy:
    """Any object with .numpy(), as NDArrays and framework tensors have."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def numpy(self) -> np.ndarray:
        return self.array


def test_round_trip_of_every_dtype_0d_empty_and_odd_names() -> None:
    params: dict[str, np.ndarray] = {}
    for i, dtype in enumerate(SUPPORTED_DTYPES):
        params[f"{dtype} full/{i}"] = (np.arange(12) % 3 == 1 if dtype == "bool"
                                       else np.arange(12).astype(dtype)).reshape(3, 4)
        params[f"{dtype}.0d"] = np.zeros((), dtype)
        params[f"{dtype} empty ünï"] = np.zeros((2, 0, 3), dtype)
    params[""] = np.array([1], "int8")
    params["nul\0inside"] = np.array([2], "int8")
    assert_same_arrays(load_param_arrays(save_param_dict(params)), params)


def test_writer_normalizes_inputs() -> None:
    base = np.arange(12, dtype="float32").reshape(3, 4)
    params = {
        "big_endian": base.astype(">f4"),
        "strided": base[:, ::2],
        "fortran": np.asfortranarray(base),
        "list": [[1, 2], [3, 4]],
        "float": 2.5,
        "numpy_scalar": np.uint16(7),
        "has_numpy": HasNumpy(base),
    }
    got = load_param_arrays(save_param_dict(params))
    assert got["big_endian"].dtype == np.dtype("float32")
    np.testing.assert_array_equal(got["big_endian"], base)
    np.testing.assert_array_equal(got["strided"], base[:, ::2])
    np.testing.assert_array_equal(got["fortran"], base)
    assert got["list"].dtype == np.int64 and got["list"].shape == (2, 2)
    assert got["float"].shape == () and got["float"] == 2.5
    assert got["numpy_scalar"].dtype == np.uint16 and got["numpy_scalar"].shape == ()
    np.testing.assert_array_equal(got["has_numpy"], base)


@pytest.mark.parametrize("params, message", [
    ({"c": np.zeros(2, "complex64")}, "param 'c': dtype complex64 is not supported; expected one "
                                      "of int8, int16, int32, int64, uint8"),
    ({"o": np.array([object()])}, "param 'o': dtype object is not supported"),
    ({"s": np.array(["text"])}, "param 's': dtype <U4 is not supported"),
    ({3: np.zeros(1)}, "param names must be str, got int 3"),
    ({"\udc80": np.zeros(1)}, "name is not encodable as UTF-8"),
    ([("a", np.zeros(1))], "params must be a mapping of name to array, got list"),
    ({"r": [[1, 2], [3]]}, "param 'r': cannot make a numpy array from list: setting an array"),
])
def test_writer_errors(params: object, message: str) -> None:
    with pytest.raises(ParamsError, match=re.escape(message)):
        save_param_dict(params)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(
    st.text(max_size=12),
    st.sampled_from(CORE_DTYPES).flatmap(lambda dtype: hnp.arrays(
        np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))),
    max_size=6))
def test_round_trip_property(params: dict[str, np.ndarray]) -> None:
    assert_same_arrays(load_param_arrays(save_param_dict(params)), params)


def test_writer_matches_tvm_when_installed() -> None:
    tvm = pytest.importorskip("tvm", reason="apache-tvm not installed (only the golden files "
                                            "are checked then)")
    rng = np.random.default_rng(0)
    for trial in range(20):
        params = {}
        for i in range(int(rng.integers(0, 5))):
            dtype = CORE_DTYPES[int(rng.integers(len(CORE_DTYPES)))]
            shape = tuple(int(d) for d in rng.integers(0, 4, size=int(rng.integers(0, 4))))
            params[f"t{trial}/p{i} é"] = rng.integers(0, 2, size=shape).astype(dtype)
        theirs = bytes(tvm.runtime.save_param_dict({k: tvm.runtime.tensor(v)
                                                     for k, v in params.items()}))
        assert save_param_dict(params) == theirs


# --- corrupt input ----------------------------------------------------------------------------

# A valid file for {"w": float32 (2, 3)}: name length at 24, name at 32, array count at 33,
# record at 41 (device type 57, id 61, ndim 65, dtype 69), shape at 73, data size at 89,
# data at 97, end at 121.
VALID = save_param_dict({"w": np.arange(6, dtype="float32").reshape(2, 3)})


def patched(offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(VALID)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


CORRUPT = [
    ("empty", b"", "byte 0: header: expected 16 bytes, found 0 (file truncated)"),
    ("bad magic", patched(0, "<Q", 0x1234), "byte 0: magic: expected 0xF7E58D4F05049CB7 (TVM "
                                            "param dict), found 0x0000000000001234"),
    ("npy file", b"\x93NUMPY\x01\x00" + b"\0" * 20, "byte 0: magic: expected 0xF7E58D4F05049CB7"),
    ("truncated header", VALID[:20], "byte 16: name count: expected 8 bytes, found 4"),
    ("2^60 names in 40 bytes", patched(16, "<Q", 1 << 60)[:40],
     "byte 16: name count: expected at most 2 (8 bytes per name length, 16 bytes left), "
     f"found {1 << 60}"),
    ("name longer than file", patched(24, "<Q", 1 << 60),
     f"byte 32: name 0 ({1 << 60} bytes of UTF-8): expected {1 << 60} bytes, found 89"),
    ("name not UTF-8", patched(32, "<B", 0xFF), "byte 32: name 0: expected UTF-8 text, "
                                                "found byte 0xff"),
    ("array count differs", patched(33, "<Q", 2), "byte 33: array count: expected 1 (one per "
                                                  "name), found 2"),
    ("array count missing", VALID[:36], "byte 33: array count: expected 8 bytes, found 3"),
    ("record truncated", VALID[:50], "byte 41: array 0 'w' header: expected 32 bytes, found 9"),
    ("bad array magic", patched(41, "<Q", 7), "byte 41: array 0 'w' magic: expected "
                                              "0xDD5E40F096B4A13F (TVM NDArray), found 0x00000"),
    ("cuda device", patched(57, "<i", 2), "byte 57: array 0 'w' device type: expected 1 (kDLCPU"),
    ("ndim 33", patched(65, "<i", 33), "byte 65: array 0 'w' ndim: expected 0..32, found 33"),
    ("ndim negative", patched(65, "<i", -1), "byte 65: array 0 'w' ndim: expected 0..32, "
                                             "found -1"),
    ("complex64", patched(69, "<H", 5 | 64 << 8), "byte 69: array 0 'w' dtype: expected one of "
                                                 "int8, int16, int32, int64, uint8, uint16"),
    ("complex64 named", patched(69, "<H", 5 | 64 << 8), "found complex64 (code 5, bits 64, lanes 1)"),
    ("int24", patched(69, "<H", 0 | 24 << 8), "found int24 (code 0, bits 24, lanes 1)"),
    ("unknown code", patched(69, "<H", 99 | 8 << 8), "found code998 (code 99, bits 8, lanes 1)"),
    ("4 lanes", patched(71, "<H", 4), "found float32x4 (code 2, bits 32, lanes 4)"),
    ("shape truncated", VALID[:80], "byte 73: array 0 'w' shape (2 int64): expected 16 bytes, "
                                    "found 7"),
    ("negative dim", patched(73, "<q", -2), "byte 73: array 0 'w' shape: expected non-negative "
                                            "dims, found (-2, 3)"),
    ("huge dim", patched(73, "<q", 1 << 62), "byte 89: array 0 'w' data byte size: expected "
                                             f"{(1 << 62) * 3 * 4} ({(1 << 62) * 3} x float32 of "
                                             f"shape ({1 << 62}, 3)), found 24"),
    ("size not prod(shape)*itemsize", patched(89, "<q", 20),
     "byte 89: array 0 'w' data byte size: expected 24 (6 x float32 of shape (2, 3)), found 20"),
    ("negative data size", patched(89, "<q", -1), "data byte size: expected 24 (6 x float32 of "
                                                  "shape (2, 3)), found -1"),
    ("data truncated", VALID[:-1], "byte 97: array 0 'w' data: expected 24 bytes, found 23 "
                                   "(file truncated)"),
    ("trailing garbage", VALID + b"\0\0\0", "byte 121: end of data: expected end after 1 "
                                            "arrays, found 3 more bytes"),
    ("duplicate name", param_file(["w", "w"], [record(0, 8, (), b"\1")] * 2),
     "byte 33: name 1: expected unique names, found 'w' again (name 0)"),
    ("empty but too big for numpy", param_file(["z"], [record(2, 32, (0, 1 << 62, 1 << 62), b"")]),
     f"byte 73: array 0 'z' shape: expected dims numpy can hold, found (0, {1 << 62}, {1 << 62})"),
]


@pytest.mark.parametrize("data, message", [pytest.param(d, m, id=i) for i, d, m in CORRUPT])
def test_corrupt_input_names_offset_and_expectation(data: bytes, message: str) -> None:
    with pytest.raises(ParamsError) as info:
        load_param_arrays(data, source="model.params")
    assert str(info.value).startswith("model.params: byte ")
    assert message in str(info.value)


def test_corrupt_file_error_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(VALID[:-1])
    with pytest.raises(ParamsError, match=re.escape(f"{path}: byte 97: array 0 'w' data")):
        load_params_file(path)


def test_non_bytes_input() -> None:
    with pytest.raises(ParamsError, match="expected bytes, bytearray or memoryview, got str"):
        load_param_arrays("not bytes")  # type: ignore[arg-type]


def test_accepts_bytearray_and_memoryview() -> None:
    want = load_param_arrays(VALID)
    assert_same_arrays(load_param_arrays(bytearray(VALID)), want)
    assert_same_arrays(load_param_arrays(memoryview(VALID)), want)
    wide = np.frombuffer(VALID + b"\0" * (-len(VALID) % 8), dtype=np.uint64)  # not a byte view
    with pytest.raises(ParamsError, match="trailing|end of data"):
        load_param_arrays(wide.data)  # a memoryview of format "Q"; the padding is trailing


def test_huge_counts_fail_without_big_allocation() -> None:
    attacks = [patched(16, "<Q", 1 << 60)[:40], patched(24, "<Q", 1 << 60),
               patched(73, "<q", 1 << 40), patched(89, "<q", 1 << 40),
               param_file(["z"], [record(2, 64, (1 << 31,) * 32, b"", size=1 << 40)])]
    tracemalloc.start()
    try:
        for data in attacks:
            with pytest.raises(ParamsError):
                load_param_arrays(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["dtypes", "names", "empty", "scalars"]), st.data())
def test_truncation_and_bit_flips_never_raise_anything_else(case: str, data: st.DataObject) -> None:
    blob = bytearray((GOLDEN / f"{case}.params").read_bytes())
    cut = data.draw(st.integers(0, len(blob)), label="length")
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(blob) - 1), st.integers(0, 7)),
                               max_size=6), label="flips")
    for pos, bit in flips:
        blob[pos] ^= 1 << bit
    try:
        got = load_param_arrays(bytes(blob[:cut]))
    except ParamsError:
        return
    assert all(isinstance(name, str) and isinstance(a, np.ndarray) for name, a in got.items())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_after_valid_magic_never_raise_anything_else(tail: bytes) -> None:
    try:
        load_param_arrays(struct.pack("<Q", LIST_MAGIC) + tail)
    except ParamsError:
        pass


# --- files: kind by magic, .npz ---------------------------------------------------------------

def test_params_file_kind_is_found_by_magic(tmp_path: Path) -> None:
    want = load_param_arrays(VALID)
    for name in ("model.params", "weights.bin", "no_extension", "odd.npz.params"):
        (tmp_path / name).write_bytes(VALID)
        assert_same_arrays(load_params_file(tmp_path / name), want)
    save_params_file(tmp_path / "x.npz", want)
    (tmp_path / "x.npz").rename(tmp_path / "zip_named.params")
    assert_same_arrays(load_params_file(str(tmp_path / "zip_named.params")), want)


@pytest.mark.parametrize("content, message", [
    (b"", "expected TVM param dict (magic 0xF7E58D4F05049CB7) or .npz (zip, 'PK'), "
          "found an empty file"),
    (b"{\"nodes\": []}", "found 7b 22 6e 6f 64 65 73 22"),
])
def test_unknown_file_kind(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "graph.json"
    path.write_bytes(content)
    with pytest.raises(ParamsError, match=re.escape(f"{path}: byte 0: file kind: ") + ".*"
                       + re.escape(message)):
        load_params_file(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ParamsError, match="nope.params: cannot read the params file: No such file"):
        load_params_file(tmp_path / "nope.params")
    with pytest.raises(ParamsError, match="cannot write params file"):
        save_params_file(tmp_path / "no_dir" / "x.params", {"a": np.zeros(1)})


def test_npz_round_trip_keeps_order_dtypes_and_odd_names(tmp_path: Path) -> None:
    params = npz_dict(GOLDEN / "names.npz") | npz_dict(GOLDEN / "dtypes.npz")
    params["file"] = np.array(1.5)  # np.savez would take this as its own argument
    params["allow_pickle"] = np.zeros((0, 2), "int8")
    params["big_endian"] = np.arange(3, dtype=">i4")
    for name in ("p.npz", "P.NPZ"):
        save_params_file(tmp_path / name, params)
        with zipfile.ZipFile(tmp_path / name) as zf:
            assert zf.testzip() is None
        got = load_params_file(tmp_path / name)
        assert_same_arrays(npz_dict(tmp_path / name), got)  # numpy reads what we wrote
        assert got["big_endian"].dtype == np.dtype("int32")  # stored in native order
        got["big_endian"] = got["big_endian"].astype(">i4")
        assert_same_arrays(got, params)
    assert (tmp_path / "p.npz").read_bytes() == (tmp_path / "P.NPZ").read_bytes()


def test_npz_written_by_numpy_loads(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", w=np.ones((2, 2), "float16"), b=np.array([True]))
    np.savez_compressed(tmp_path / "b.npz", w=np.ones((2, 2), "float16"), b=np.array([True]))
    for name in ("a.npz", "b.npz"):
        got = load_params_file(tmp_path / name)
        assert list(got) == ["w", "b"] and got["w"].dtype == np.float16


def test_npz_errors(tmp_path: Path) -> None:
    with pytest.raises(ParamsError, match=r"param 'nul\\x00': .npz member names cannot "):
        save_params_file(tmp_path / "n.npz", {"nul\0": np.zeros(1)})
    np.savez(tmp_path / "c.npz", ok=np.zeros(1), c=np.zeros(2, "complex128"))
    with pytest.raises(ParamsError, match=re.escape(f"{tmp_path / 'c.npz'}: param 'c': dtype "
                                                    "complex128 is not supported")):
        load_params_file(tmp_path / "c.npz")
    np.savez(tmp_path / "o.npz", o=np.array([{}], dtype=object))
    with pytest.raises(ParamsError, match=re.escape(f"{tmp_path / 'o.npz'}: member 'o.npy' holds "
                                                    "Python objects (pickled); not loaded")):
        load_params_file(tmp_path / "o.npz")
    good = (tmp_path / "c.npz").read_bytes()
    (tmp_path / "t.npz").write_bytes(good[:len(good) // 2])
    with pytest.raises(ParamsError, match=re.escape(f"{tmp_path / 't.npz'}: cannot read the "
                                                    ".npz's zip (damaged, truncated, or a "
                                                    "compression numpy does not read): "
                                                    "BadZipFile")):
        load_params_file(tmp_path / "t.npz")
    with zipfile.ZipFile(tmp_path / "raw.npz", "w") as zf:
        zf.writestr("notes.txt", "not an array")
    with pytest.raises(ParamsError,
                       match=re.escape("member 'notes.txt' is not a .npy array")):
        load_params_file(tmp_path / "raw.npz")


# ---- hostile files (issue 13): refused before they are read, every failure a ParamsError --------

def test_non_regular_files_are_refused_without_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it would hang
    for path in (fifo, Path("/dev/zero")):  # /dev/zero never ends (15.5 GB RSS before)
        with pytest.raises(ParamsError, match="not a regular file"):
            load_params_file(path)
    with pytest.raises(ParamsError, match="is a directory"):
        load_params_file(tmp_path)
    with pytest.raises(ParamsError, match="cannot read the inputs file"):
        load_params_file(tmp_path / "none.npz", what="inputs")


def _zip_member(path: Path, name: str, data: bytes, method: int = zipfile.ZIP_STORED) -> None:
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        zf.writestr(name, data)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array)
    return buffer.getvalue()


def test_npz_hostile_members_are_params_errors(tmp_path: Path) -> None:
    # An .npy header claiming 1e11 floats over a few bytes of data.
    lie = _npy_bytes(np.zeros(2, "float32")).replace(b"(2,)", b"(100000000000,)")
    _zip_member(tmp_path / "big.npz", "x.npy", lie)
    with pytest.raises(ParamsError, match=r"member 'x.npy': its header declares shape "
                                          r"\(100000000000,\) float32 \(400000000000 bytes\)"):
        load_params_file(tmp_path / "big.npz")
    # Corrupt deflate data: zlib.error.
    good = tmp_path / "good.npz"
    _zip_member(good, "x.npy", _npy_bytes(np.arange(1000, dtype="float32")), zipfile.ZIP_DEFLATED)
    raw = bytearray(good.read_bytes())
    raw[60:90] = b"\xff" * 30
    (tmp_path / "bad.npz").write_bytes(bytes(raw))
    with pytest.raises(ParamsError, match=r"bad.npz"):
        load_params_file(tmp_path / "bad.npz")
    # Unsupported compression (method 99 in the headers): NotImplementedError in zipfile.
    raw = bytearray(good.read_bytes())
    raw[8:10] = (99).to_bytes(2, "little")
    cd = raw.rfind(b"PK\x01\x02")
    raw[cd + 10:cd + 12] = (99).to_bytes(2, "little")
    (tmp_path / "method.npz").write_bytes(bytes(raw))
    with pytest.raises(ParamsError, match=r"method.npz"):
        load_params_file(tmp_path / "method.npz")
    # An encrypted member (flag bit 0).
    raw = bytearray(good.read_bytes())
    raw[6] |= 1
    raw[cd + 8] |= 1
    (tmp_path / "enc.npz").write_bytes(bytes(raw))
    with pytest.raises(ParamsError, match=r"enc.npz: member 'x.npy' is encrypted"):
        load_params_file(tmp_path / "enc.npz")


def test_npz_round_trip_still_works(tmp_path: Path) -> None:
    params = {"w": np.arange(6, dtype="float32").reshape(2, 3), "f": np.asfortranarray(
        np.arange(6, dtype="int64").reshape(2, 3)), "e": np.zeros((0, 4), "float16")}
    np.savez_compressed(tmp_path / "p.npz", **params)
    got = load_params_file(tmp_path / "p.npz")
    for name, value in params.items():
        np.testing.assert_array_equal(got[name], value)
        assert got[name].dtype == value.dtype


def test_a_mangled_npy_header_is_a_params_error(tmp_path: Path) -> None:
    # Found by tests/test_fuzz.py: numpy tokenizes the header, so an unclosed bracket raised
    # tokenize.TokenError out of the loader.
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2,"
    header += b" " * (63 - len(header) % 64) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\x00" * 8
    _zip_member(tmp_path / "h.npz", "x.npy", npy)
    with pytest.raises(ParamsError, match=r"h.npz: member 'x.npy'"):
        load_params_file(tmp_path / "h.npz")


# -- mapped views and reads straight into place (load_params_file(views=True), read_params_into)

def _mixed_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"w": rng.standard_normal((33, 7)).astype(np.float32), "flag": np.array([True, False]),
            "b": rng.standard_normal(5), "odd name é": np.arange(11, dtype=np.int16),
            "empty": np.zeros((0, 3), np.float32), "last": np.arange(6, dtype=np.int64)}


def test_views_are_read_only_views_of_the_file(tmp_path: Path) -> None:
    want = _mixed_params()
    path = tmp_path / "params"
    path.write_bytes(save_param_dict(want))
    got = load_params_file(path, views=True)
    assert isinstance(got, MappedArrays) and got.path == str(path)
    assert list(got) == list(want)
    data = path.read_bytes()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)
        assert got[name].dtype == value.dtype
        if name in got.offsets:
            assert not got[name].flags.writeable
            assert data[got.offsets[name]:][:value.nbytes] == value.tobytes()
    assert "empty" not in got.offsets and "w" in got.offsets


@pytest.mark.parametrize("iov_max", [1024, 3, 2])  # one call, and batches of one or two targets
def test_read_params_into_fills_targets_past_gaps(tmp_path: Path, monkeypatch,
                                                  iov_max: int) -> None:
    want = _mixed_params()
    path = tmp_path / "params"
    path.write_bytes(save_param_dict(want))
    mapped = load_params_file(path, views=True)
    monkeypatch.setattr(os, "sysconf", lambda name: iov_max)
    names = ["w", "odd name é", "last"]  # "flag" and "b" lie between them, unread
    targets = {n: np.full(want[n].shape, 99, want[n].dtype) for n in names}
    read_params_into(str(path), mapped, targets)
    for name in names:
        np.testing.assert_array_equal(targets[name], want[name])


def test_read_params_into_copies_after_a_short_read(tmp_path: Path, monkeypatch) -> None:
    want = _mixed_params()
    path = tmp_path / "params"
    path.write_bytes(save_param_dict(want))
    mapped = load_params_file(path, views=True)
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: 0)
    targets = {n: np.zeros_like(want[n]) for n in ("w", "b")}
    read_params_into(str(path), mapped, targets)
    for name, target in targets.items():
        np.testing.assert_array_equal(target, want[name])


# --- the types beyond NumPy's (graph_runtime/dtypes.py) ---------------------------------------

def _extended() -> dict[str, np.ndarray]:
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_extended",
                                                  GOLDEN / "extended" / "make_extended.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.extended_arrays()


def test_bfloat16_and_float8_match_tvms_own_file() -> None:
    """TVM 0.27 wrote extended.params (make_extended.py): the same bytes from our writer, the
    same arrays from our reader (DLPack 1.1 codes 4, 10-14)."""
    golden = (GOLDEN / "extended" / "extended.params").read_bytes()
    arrays = _extended()
    assert save_param_dict(arrays) == golden
    got = load_param_dict(golden)
    for name, array in arrays.items():
        back = got[name].numpy()
        assert back.dtype == array.dtype
        np.testing.assert_array_equal(back.view(np.uint8), array.view(np.uint8))


@pytest.mark.parametrize("dtype,code,bits", [("int4", 0, 4), ("uint4", 1, 4), ("int2", 0, 2),
                                             ("uint2", 1, 2), ("float4_e2m1fn", 17, 4)])
def test_sub_byte_records_carry_tvms_header(dtype: str, code: int, bits: int) -> None:
    """The header TVM 0.27's writer gives a (2, 3) tensor of these types (code, bits, 6 data
    bytes: one per element, its loader's numel * ceil(bits / 8)), with our data one element per
    byte. NOTE: TVM itself holds them packed (3 bytes here), so its writer fills those 6 bytes
    from a 3-byte buffer and its loader reads 6 into one: these values do not travel to or from
    TVM 0.27 correctly in either direction, whatever we write; between graph_runtime's writer
    and reader they do."""
    import ml_dtypes
    array = (np.arange(6) % 2).reshape(2, 3).astype(np.float32).astype(getattr(ml_dtypes, dtype))
    data = save_param_dict({"x": array})
    at = data.index(b"x") + 1 + 8  # past the name and the array count
    fields = struct.unpack_from("<QQiiiBBH", data, at)
    assert fields[4:] == (2, code, bits, 1)
    assert struct.unpack_from("<3q", data, at + 32) == (2, 3, 6)
    assert data[at + 56:] == array.view(np.uint8).tobytes()
    assert load_param_dict(data)["x"].numpy().view(np.uint8).tolist() == \
        array.view(np.uint8).tolist()
