"""The benches judge ONNX Runtime as users run it: only bench/peers.py makes its sessions, with
default options and with one thread; no bench configures it below its defaults (issue 33)."""
from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
WEAKENING = re.compile(r"allow_spinning|spin_duration|graph_optimization_level|"
                       r"inter_op_num_threads|execution_mode|intra_op_num_threads")


def test_only_peers_configures_onnxruntime() -> None:
    found = [f"{path.name}:{n}: {line.strip()}"
             for path in sorted(BENCH.glob("*.py")) if path.name != "peers.py"
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if WEAKENING.search(line) or "ort.InferenceSession(" in line]
    assert found == [], "\n".join(found)


def test_peers_sets_only_the_thread_count() -> None:
    text = (BENCH / "peers.py").read_text()
    assert "allow_spinning" not in text.replace("allow_spinning=0, fewer", "")
    assert re.findall(r"\bone\.(\w+) =", text) == ["intra_op_num_threads"]
