"""The auto/on/off environment switches of the CPU kernels (GEMV padding, split dense)."""
from __future__ import annotations

import os

from ....errors import LibraryError

MODES = ("auto", "on", "off")


def auto_on_off(name: str, default: str) -> str:
    """Environment variable name as auto, on or off (default when unset or empty)."""
    mode = os.environ.get(name, default).strip().lower() or default
    if mode not in MODES:
        raise LibraryError(f"{name} must be auto, on or off, got {mode!r}")
    return mode
