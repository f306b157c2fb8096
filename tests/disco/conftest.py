"""Disco fixtures: sessions of each kind and size, shared per module to keep the suite fast."""
from __future__ import annotations

import os
import shutil
import sys
from typing import Iterator

import pytest

from graph_runtime.disco import ProcessSession, Session, ThreadedSession

KINDS = {"threaded": ThreadedSession, "process": ProcessSession}
SIZES = (1, 2, 4)
HERE = os.path.dirname(os.path.abspath(__file__))


def make_session(kind: str, n: int, **kw: object) -> Session:
    sess = KINDS[kind](n, **kw)
    sess.import_python_module("disco_testfuncs")
    return sess


@pytest.fixture(scope="module", params=[(k, n) for k in KINDS for n in SIZES],
                ids=lambda p: f"{p[0]}{p[1]}")
def sess(request: pytest.FixtureRequest) -> Iterator[Session]:
    """A session with the cpu ccl started, one per kind x size, reused within a module."""
    kind, n = request.param
    session = make_session(kind, n, timeout=30.0)
    session.init_ccl("cpu")
    yield session
    session.shutdown()


def mpiexec() -> str | None:
    """mpiexec next to this Python (the venv's mpich), else on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(local, os.X_OK):
        return local
    return shutil.which("mpiexec")
