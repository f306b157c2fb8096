"""numba's disk cache for this folder's compiled functions, keyed by all its numba sources.

numba keys a cached function by the hash of the file that defines it, but the loops here inline
helpers from sibling files (attention.py takes rows_jit.softmax_row, which takes fast_math's
exp): an edit to a helper left the callers' stale machine code in use until their own file
changed. install() puts locators in front of numba's that add a digest of every numba source
in this folder to that key, and the vector width (vector_width.py), for functions defined in
this folder only; any edit here then recompiles this folder's cached functions once. numba's
locator classes are internal API: where they are missing the cache keeps numba's own key.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import os
from typing import Any

from . import vector_width

FOLDER = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)
def sources_digest() -> str:
    """sha256 over the numba-using Python sources of this folder, by name and content."""
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(FOLDER, "*.py"))):
        with open(path, "rb") as f:
            data = f.read()
        if b"numba" in data:
            digest.update(os.path.basename(path).encode() + b"\0" + data)
    return digest.hexdigest()


def _stamped(base: Any) -> Any:
    """A subclass of numba locator `base` for this folder's files, whose source stamp holds
    sources_digest() besides the file's own."""

    class Stamped(base):  # type: ignore[misc, valid-type]
        def get_source_stamp(self) -> Any:
            # the machine code differs with the vector width too
            return (super().get_source_stamp(), sources_digest(), vector_width.stamp())

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if os.path.dirname(os.path.abspath(py_file)) != FOLDER:
                return None
            return super().from_function(py_func, py_file)

    Stamped.__name__ = Stamped.__qualname__ = f"FolderStamped{base.__name__}"
    return Stamped


def install() -> None:
    """Put the stamped locators first in numba's list (once; before this folder's
    cache=True functions are defined)."""
    try:
        from numba.core import caching
        impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
        bases = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator,
                 caching.UserWideCacheLocator)
    except (ImportError, AttributeError):  # another numba: its own keys
        return
    classes = impl._locator_classes
    if any(getattr(c, "__name__", "").startswith("FolderStamped") for c in classes):
        return
    impl._locator_classes = [_stamped(b) for b in bases] + list(classes)
