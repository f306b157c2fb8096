"""Write the golden TVM param files with real TVM (run by hand; CI only reads the results).

Usage: pip install apache-tvm  (0.27, CPU build; not a dependency of graph_runtime), then
    python tests/data/params/make_golden.py
For each case it writes NAME.params with tvm.runtime.save_param_dict, checks that
tvm.runtime.load_param_dict reads it back, and writes the expected arrays as NAME.npz
(insertion order kept; names as .npz member names).
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import tvm

HERE = Path(__file__).resolve().parent
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float16", "float32", "float64"]
DTYPES = FLOATS + INTS + ["bool"]
SHAPES = [(4,), (2, 3), (3, 1, 2), (1, 2, 2, 2)]


def edge_values(dtype: str) -> np.ndarray:
    """Values at the edges of a dtype's range (signed zero, inf, nan, subnormals, extremes)."""
    if dtype == "bool":
        return np.array([True, False, False, True, True, False])
    if dtype in FLOATS:
        info = np.finfo(dtype)
        return np.array([0.0, -0.0, 1.5, -2.25, np.inf, -np.inf, np.nan, info.max, info.min,
                         info.tiny, info.smallest_subnormal, info.eps], dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([info.min, info.max, 0, 1, info.max - 1, info.min + 1], dtype=dtype)


def cases() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(20240601)
    dtypes = {}
    for i, dtype in enumerate(DTYPES):
        values = edge_values(dtype)
        dtypes[f"{dtype}_edges"] = values
        shape = SHAPES[i % len(SHAPES)]
        size = int(np.prod(shape))
        dtypes[f"{dtype}_{'x'.join(map(str, shape))}"] = np.resize(values, size).reshape(shape)
    scalars = {f"{dtype}_scalar": np.array(edge_values(dtype)[3], dtype=dtype) for dtype in DTYPES}
    empty = {
        "empty_f32_0": np.zeros((0,), "float32"),
        "empty_u8_0x2x5": np.zeros((0, 2, 5), "uint8"),
        "empty_f16_0x0": np.zeros((0, 0), "float16"),
        "not_empty_after": np.arange(3, dtype="int32"),
    }
    # Zero-size, but not in the first dim: TVM writes these, its reader rejects them (below).
    empty_inner = {
        "empty_i64_3x0": np.zeros((3, 0), "int64"),
        "empty_bool_2x0x0x1": np.zeros((2, 0, 0, 1), "bool"),
        "not_empty_after": np.arange(3, dtype="int32"),
    }
    names = {
        "conv1.weight": rng.standard_normal((2, 2)).astype("float32"),
        "layer/0/bias": np.arange(3, dtype="float32"),
        "with space": np.array([1], "int8"),
        "tab\tand\nnewline": np.array([2], "int8"),
        "ünïcödé": np.array([3], "int16"),
        "日本語の名前": np.array([4], "int32"),
        "emoji 🧠➕": np.array([5], "int64"),
        "": np.array([6], "uint8"),
        "quote'\"back\\slash": np.array([7], "uint16"),
        "p" * 300: np.array([8], "uint32"),
        "../relative/..": np.array([9], "uint64"),
    }
    many = {}
    for i in range(500):
        dtype = DTYPES[i % len(DTYPES)]
        shape = tuple(int(d) for d in rng.integers(1, 4, size=i % 4))
        raw = rng.integers(0, 100, size=shape)
        many[f"p{i:03d}"] = (raw % 2 == 1) if dtype == "bool" else raw.astype(dtype)
    large = {
        "weight": rng.standard_normal((32, 32, 16)).astype("float32"),
        "six_dims": rng.integers(-50, 50, size=(2, 1, 3, 1, 2, 2)).astype("int16"),
        "bias": rng.standard_normal(16).astype("float64"),
    }
    return {"dtypes": dtypes, "scalars": scalars, "empty": empty, "empty_inner": empty_inner,
            "names": names, "many": many, "large": large, "empty_dict": {}}


# TVM 0.27's load_param_dict fails ("Invalid DLTensor file format") on a zero-size tensor whose
# first dim is not 0, although its writer produces the same record layout as for any other
# tensor (data byte size 0, no data). Only the write side of these files is TVM's word.
WRITE_ONLY = {"empty_inner"}


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed, but for any name (numpy reserves 'file', 'allow_pickle') and
    with fixed member dates, so a rerun gives identical files."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, array in arrays.items():
            member_info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            member_info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(member_info, "w") as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def check_read_back(case: str, data: bytes, arrays: dict[str, np.ndarray]) -> None:
    back = tvm.runtime.load_param_dict(data)
    if list(back) != list(arrays):
        raise SystemExit(f"{case}: TVM read back names {list(back)}, wrote {list(arrays)}")
    for name, array in arrays.items():
        got = back[name].numpy()
        if got.dtype != array.dtype or not np.array_equal(got, array, equal_nan=True):
            raise SystemExit(f"{case}: TVM read back {name!r} as {got!r}, wrote {array!r}")


def main() -> None:
    print(f"tvm {tvm.__version__}")
    for case, arrays in cases().items():
        data = bytes(tvm.runtime.save_param_dict({k: tvm.runtime.tensor(v)
                                                  for k, v in arrays.items()}))
        if case not in WRITE_ONLY:
            check_read_back(case, data, arrays)
        (HERE / f"{case}.params").write_bytes(data)
        write_npz(HERE / f"{case}.npz", arrays)
        print(f"{case}: {len(arrays)} arrays, {len(data)} bytes")


if __name__ == "__main__":
    main()
