"""The element types beyond NumPy's own (bfloat16, float8, 4- and 2-bit), from ml_dtypes."""
from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers the names below with NumPy's dtype lookup)

# TVM's names for them, which are ml_dtypes' names too: stored one element per byte (two for
# bfloat16), as TVM's NDArray stores sub-byte integers.
EXTENDED_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                   "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2",
                   "uint2")
# DLPack 1.1 type codes (dlpack.h DLDataTypeCode) with their bit widths, as TVM writes them.
DLPACK_CODES = {"bfloat16": (4, 16), "float8_e4m3fn": (10, 8), "float8_e4m3fnuz": (11, 8),
                "float8_e5m2": (12, 8), "float8_e5m2fnuz": (13, 8), "float8_e8m0fnu": (14, 8),
                "float4_e2m1fn": (17, 4), "int4": (0, 4), "uint4": (1, 4), "int2": (0, 2),
                "uint2": (1, 2)}
