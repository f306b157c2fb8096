"""The benches judge ONNX Runtime as users run it: only bench/peers.py makes its sessions, with
default options and with one thread; no bench configures it below its defaults (issue 33)."""
from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

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


def test_ratios_are_paired_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spell that slows every contender 1.5x (docs/measurements.md: a VM's vCPUs far apart)
    falls on ours in two rounds of three and on the peer's in one: the whole medians read
    1.35x, the median of the rounds' own ratios the 0.9x of the rounds both spent alike."""
    monkeypatch.syspath_prepend(str(BENCH))
    from interleave import paired_ratio

    def rounds(*times: float) -> list[float]:
        return [t for t in times for _ in range(3)]  # three samples a round
    # ours far in rounds 1 and 2, the default in round 1 only; one thread is slow throughout
    samples = {"ours": rounds(0.9, 1.35, 1.35), "default": rounds(1.0, 1.5, 1.0),
               "one_thread": rounds(2.0, 2.0, 2.0)}
    whole = statistics.median(samples["ours"]) / statistics.median(samples["default"])
    assert round(whole, 2) == 1.35
    assert round(paired_ratio(samples, "ours", ["default", "one_thread"], 3), 2) == 0.9
