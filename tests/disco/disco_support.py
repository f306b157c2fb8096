"""Disco test helpers imported by name: session makers and the mpiexec finder."""
from __future__ import annotations

import os
import shutil
import sys

from graph_runtime.disco import ProcessSession, Session, ThreadedSession

# "-inline": worker-0 runs in the controller's thread (inline_worker0=True)
KINDS = {"threaded": ThreadedSession, "process": ProcessSession,
         "threaded-inline": ThreadedSession, "process-inline": ProcessSession}
SIZES = (1, 2, 4)
HERE = os.path.dirname(os.path.abspath(__file__))


def make_session(kind: str, n: int, **kw: object) -> Session:
    sess = KINDS[kind](n, inline_worker0=kind.endswith("-inline"), **kw)
    sess.import_python_module("disco_testfuncs")
    return sess


def mpiexec() -> str | None:
    """mpiexec next to this Python (the venv's mpich), else on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(local, os.X_OK):
        return local
    return shutil.which("mpiexec")
