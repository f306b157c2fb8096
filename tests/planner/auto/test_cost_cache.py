"""The profile cache file: its format checked on load."""
from __future__ import annotations

from pathlib import Path

import pytest

from graph_runtime.errors import PlanError
from graph_runtime.planner.auto.cost_cache import CostCache


def test_cache_file_of_another_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_text('{"format": "something else"}')
    with pytest.raises(PlanError, match=r"at \$.format: expected 'graph_runtime.profile_cache'"):
        CostCache.load(path)

