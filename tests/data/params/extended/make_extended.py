"""Write extended.params with real TVM 0.27 (run by hand: pip install apache-tvm ml_dtypes, then
python tests/data/params/extended/make_extended.py); CI only reads the result.

bfloat16 and the float8 types, each a (2, 3) tensor of extended_arrays()'s values, written by
tvm.runtime.save_param_dict and read back by its load_param_dict. The 4- and 2-bit types are
left out: TVM 0.27 cannot make such a tensor from data (tvm.runtime.tensor: "arr_size == nbytes
(3 vs. 6)": it holds them packed) and its writer records one byte per element from that packed
buffer, so no file of TVM's holds their values (tests/test_params.py says what we write).
"""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

NAMES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
         "float8_e8m0fnu")


def extended_arrays() -> dict[str, np.ndarray]:
    """Name -> (2, 3) array of values every one of the types holds exactly (powers of two)."""
    values = np.array([[1.0, 2.0, 0.5], [4.0, 0.25, 8.0]], np.float32)
    return {name: values.astype(getattr(ml_dtypes, name)) for name in NAMES}


if __name__ == "__main__":
    import tvm
    arrays = extended_arrays()
    data = bytes(tvm.runtime.save_param_dict({k: tvm.runtime.tensor(v) for k, v in arrays.items()}))
    back = tvm.runtime.load_param_dict(data)
    for name, array in arrays.items():
        assert str(back[name].dtype) == name
        np.testing.assert_array_equal(back[name].numpy().astype(np.float32),
                                      array.astype(np.float32))
    (Path(__file__).resolve().parent / "extended.params").write_bytes(data)
