"""The `graphrun` command line: the click app and what only the CLI uses (job, info, ...)."""
from __future__ import annotations

from .app import app, main

__all__ = ["app", "main"]
