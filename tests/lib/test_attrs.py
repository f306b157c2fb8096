"""Attribute checks at load time: non-finite numbers, int64 overflow, windows and ranks bounded."""
from __future__ import annotations

from typing import Any

import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.loader import module_from_json


def _load(op: dict[str, Any]) -> None:
    module_from_json({"format": "graph_runtime.lib", "version": 1, "functions": {"f": op}})


@pytest.mark.parametrize("op, message", [
    ({"op": "clip", "a_min": 0.0, "a_max": float("nan")},
     r"clip: attribute 'a_max' = nan: expected a finite number"),
    ({"op": "leaky_relu", "alpha": float("inf")},
     r"attribute 'alpha' = inf: expected a finite number"),
    ({"op": "expand_dims", "axis": 0, "num_newaxis": 100_000_000},
     r"'num_newaxis' = 100000000: expected at most 32"),
    ({"op": "conv2d", "strides": [2 ** 63, 1]}, r"'strides' = \[9223372036854775808, 1\]: "
                                                r"expected at most 65536"),
    ({"op": "max_pool2d", "pool_size": [2, 2], "strides": [2 ** 40, 2 ** 40]},
     r"'strides' = \[1099511627776, 1099511627776\]: expected at most 65536"),
    ({"op": "reshape", "newshape": [2 ** 64]}, r"expected an integer within int64"),
    ({"op": "reshape", "newshape": list(range(5000))}, r"expected a flat list of at most 1024"),
])
def test_out_of_range_attributes_are_refused_at_load(op: dict[str, Any], message: str) -> None:
    with pytest.raises(LibraryError, match=message) as info:
        _load(op)
    assert len(str(info.value)) < 300


def test_clip_may_be_unbounded_with_infinity() -> None:
    _load({"op": "clip", "a_min": float("-inf"), "a_max": 6.0})
