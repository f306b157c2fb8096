"""examples/disco/tp_mlp.py matches the single-device MLP on Threaded and Process sessions."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from disco_support import HERE

EXAMPLE = os.path.join(HERE, "..", "..", "examples", "disco", "tp_mlp.py")


@pytest.mark.parametrize("session,workers", [("threaded", 2), ("process", 4)])
def test_tensor_parallel_mlp(session: str, workers: int) -> None:
    proc = subprocess.run([sys.executable, EXAMPLE, "--session", session, "--workers",
                           str(workers)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{session} x{workers}" in proc.stdout and "-> OK" in proc.stdout


@pytest.mark.parametrize("workers", ["0", "-3", "two"])
def test_bad_worker_counts_are_usage_errors(workers: str) -> None:
    proc = subprocess.run([sys.executable, EXAMPLE, "--workers", workers], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "argument --workers" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
