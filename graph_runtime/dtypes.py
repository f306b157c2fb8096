"""The element types beyond NumPy's own (bfloat16, float8, 4- and 2-bit), from ml_dtypes."""
from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers the names below with NumPy's dtype lookup)

# TVM's names for them, which are ml_dtypes' names too: stored one element per byte (two for
# bfloat16), the data size TVM's params format records for every type (numel * ceil(bits / 8)).
# NOTE: TVM 0.27's tensors hold the 4- and 2-bit types packed (two or four per byte), so its
# writer fills that size from a buffer half as long and its loader overruns one: those values do
# not travel to or from TVM 0.27 through a params file (tests/test_params.py); bfloat16 and the
# float8 types do, byte for byte (tests/data/params/extended, written by TVM).
EXTENDED_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                   "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2",
                   "uint2")
# DLPack 1.1 type codes (dlpack.h DLDataTypeCode) with their bit widths, as TVM writes them.
DLPACK_CODES = {"bfloat16": (4, 16), "float8_e4m3fn": (10, 8), "float8_e4m3fnuz": (11, 8),
                "float8_e5m2": (12, 8), "float8_e5m2fnuz": (13, 8), "float8_e8m0fnu": (14, 8),
                "float4_e2m1fn": (17, 4), "int4": (0, 4), "uint4": (1, 4), "int2": (0, 2),
                "uint2": (1, 2)}
