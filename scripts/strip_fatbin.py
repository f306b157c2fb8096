"""Zero the device code of every GPU architecture but one in a shared library's .nv_fatbin
section, in place (sizes and offsets unchanged, so the library loads as before and the zeros
compress to nothing).

Why: onnxruntime-gpu's wheel (the CUDA peer of bench/cuda_models.py) is 256 MB, four times what
one call to a lent GPU machine may carry; its CUDA provider holds cubins for sm_75 to sm_120.
Kept to the GPU's own architecture it packs into two carries (scripts/onnxruntime_gpu_parts.sh).
A fatbin is a run of headers (magic 0xBA55ED50, version, header size, payload size), each over
entries (kind, version, header size, payload size; the SM architecture at byte 28).

Usage: python scripts/strip_fatbin.py LIBRARY.so SM   (SM as 90 for Hopper)
"""
from __future__ import annotations

import struct
import subprocess
import sys

MAGIC = 0xBA55ED50


def fatbin_section(path: str) -> tuple[int, int]:
    """(file offset, size) of the .nv_fatbin section, read from readelf."""
    listing = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True,
                             check=True).stdout
    for line in listing.splitlines():
        if ".nv_fatbin" in line:
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    raise SystemExit(f"{path}: no .nv_fatbin section")


def strip(path: str, keep: int) -> tuple[int, int]:
    """Zero the payloads of entries for other architectures; (bytes zeroed, bytes kept)."""
    offset, size = fatbin_section(path)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    section = memoryview(data)[offset:offset + size]
    pos, zeroed, kept = 0, 0, 0
    while pos + 16 <= size:
        magic, _, header, body = struct.unpack_from("<IHHQ", section, pos)
        if magic != MAGIC:
            pos += 8  # headers are 8-byte aligned
            continue
        entry, end = pos + header, pos + header + body
        while entry < end:
            _, _, entry_header, payload = struct.unpack_from("<HHIQ", section, entry)
            sm = struct.unpack_from("<I", section, entry + 28)[0]
            start = entry + entry_header
            if sm == keep:
                kept += payload
            else:
                section[start:start + payload] = bytes(payload)
                zeroed += payload
            entry = start + payload
        pos = end
    with open(path, "wb") as f:
        f.write(data)
    return zeroed, kept


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    zeroed, kept = strip(sys.argv[1], int(sys.argv[2]))
    print(f"{sys.argv[1]}: {zeroed >> 20} MiB of other architectures zeroed, {kept >> 20} MiB "
          f"kept for sm_{sys.argv[2]}")
