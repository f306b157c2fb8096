"""MPISession under `mpiexec -n 2` and `-n 4` (subprocesses with a timeout; never a hang)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from disco_support import HERE, mpiexec

pytestmark = pytest.mark.mpi
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "disco", "tp_mlp.py")


def run_mpi(n: int, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    exe = mpiexec()
    if exe is None:
        pytest.skip("mpiexec not found next to this Python or on PATH (pip install mpi4py mpich)")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py not installed (pip install mpi4py mpich)")
    return subprocess.run([exe, "-n", str(n), sys.executable, *args], capture_output=True,
                          text=True, timeout=timeout)


def result_of(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout + proc.stderr  # only rank 0 reports
    return json.loads(lines[0][len("RESULT "):])


@pytest.mark.parametrize("n,groups", [(2, 1), (4, 2)])
def test_mpi_session(n: int, groups: int) -> None:
    result = result_of(run_mpi(n, os.path.join(HERE, "disco_mpi_program.py"), str(groups)))
    assert result["num_workers"] == n
    assert result["worker_ids"] == list(range(n))
    assert result["allreduce_checked"] == 7 * 5 * n  # dtypes x ops x workers
    for key in ("broadcast_ok", "scatter_ok", "gather_ok", "allgather_ok"):
        assert result[key] is True, key
    assert result["group_sums"] == result["group_sums_expected"]
    assert result["error"].startswith("sync_worker_0: worker 0 failed in get_global_func(")


def test_example_under_mpiexec() -> None:
    proc = run_mpi(2, EXAMPLE, "--session", "mpi")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mpi x2" in proc.stdout and "-> OK" in proc.stdout
