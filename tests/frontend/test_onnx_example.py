"""examples/onnx stays runnable: make_model.py rewrites cnn.onnx byte for byte, and the README's
import -> plan (convs on OpenCL) -> run (cpu + opencl) lines work and match ONNX Runtime."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("onnx", reason="the ONNX frontend tests need onnx (pip install .[test])")
pytest.importorskip("onnxruntime", reason="--reference needs onnxruntime (pip install .[test])")

from graph_runtime.cli import app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "onnx"


def test_make_model_writes_the_committed_file(tmp_path: Path) -> None:
    out = tmp_path / "cnn.onnx"
    subprocess.run([sys.executable, str(EXAMPLE / "make_model.py"), "-o", str(out)], check=True,
                   capture_output=True)
    assert out.read_bytes() == (EXAMPLE / "cnn.onnx").read_bytes(), (
        "examples/onnx/cnn.onnx differs from what make_model.py writes: rerun it")


@pytest.mark.opencl
def test_readme_lines(tmp_path: Path, opencl_available: None) -> None:
    folder = tmp_path / "cnn"
    runner = CliRunner()
    steps = [
        ["import", str(EXAMPLE / "cnn.onnx"), "-o", str(folder), "--reference"],
        ["plan", str(folder), "--place", "*conv2d*=opencl", "-o", str(folder / "planned.json")],
        ["run", str(folder / "planned.json"), "--lib", str(folder / "lib.json"), "--params",
         str(folder / "params"), "--inputs", str(folder / "inputs.npz"), "--expected",
         str(folder / "expected.npz"), "-d", "cpu", "-d", "opencl"],
    ]
    for args in steps:
        result = runner.invoke(app, args)
        assert result.exit_code == 0, f"graphrun {' '.join(args)}:\n{result.output}"
    assert "opencl" in result.output
