"""The package version (one place: the package, its tuning file names and setup.cfg agree)."""
from __future__ import annotations

__version__ = "0.1.0"
