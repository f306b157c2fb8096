"""Which lib.json texts already passed lib.schema.json, remembered in the cache folder.

Checking a lib against its schema needs jsonschema, whose import alone was 26 ms of a warm
BERT-base `graphrun run` (about 1 s; the check itself 1 ms). A text that passed is recorded as
an empty file named by the SHA-256 of the schema's text and the lib's, so a changed lib or
schema is checked again; a folder that cannot be read or written only means checking each time.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from .. import settings
from ..graph.schema import schema_text

SCHEMA = "lib.schema.json"
# Rules the validator adds to the schema's text (graph/schema.py's strict "integer" refuses
# 64.0): part of the key, so texts that passed under older rules are checked again.
_RULES = b"strict integers"


def _marker(text: str) -> Path:
    digest = hashlib.sha256()
    digest.update(schema_text(SCHEMA).encode("utf-8"))
    digest.update(b"\0" + _RULES + b"\0")
    digest.update(text.encode("utf-8"))
    return settings.cache_dir() / "lib_schema" / digest.hexdigest()


def passed(text: str) -> bool:
    """Whether this exact lib text passed this exact schema before."""
    try:
        return _marker(text).is_file()
    except OSError:
        return False


def remember(text: str) -> None:
    """Record that text passed the schema (nothing when the cache folder is not writable)."""
    try:
        marker = _marker(text)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass
