"""Disco fixtures: sessions of each kind and size, shared per module to keep the suite fast."""
from __future__ import annotations

from typing import Iterator

import pytest
from disco_support import KINDS, SIZES, make_session

from graph_runtime.disco import Session


@pytest.fixture(scope="module", params=[(k, n) for k in KINDS for n in SIZES],
                ids=lambda p: f"{p[0]}{p[1]}")
def sess(request: pytest.FixtureRequest) -> Iterator[Session]:
    """A session with the cpu ccl started, one per kind x size, reused within a module."""
    kind, n = request.param
    session = make_session(kind, n, timeout=30.0)
    session.init_ccl("cpu")
    yield session
    session.shutdown()
