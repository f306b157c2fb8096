"""A server's run after an idle pause: each call timed alone after a pause, ours and ONNX Runtime's.

Requests rarely arrive back to back. Each model (bench/transformers.py's, exported by
bench/transformers_models.py, and any ONNX files given) runs once warm, then, per pause length,
every contender in turn (shuffled each round): a call, the pause, the timed call. ONNX Runtime
runs with its default session options and with one thread (bench/peers.py); the ratio is to its
faster setting at that pause. GRAPH_RUNTIME_ONEDNN_PIN=off in the environment measures the team
threads unpinned (lib/kernels/cpu/team_pinning.py). Run as users' machines are:

  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/idle_gaps.py [--models gpt2_tiny ...]
      [--files model.onnx ...] [--pauses 0 0.01 0.1 0.5] [--rounds 9]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure the checkout this script sits in
import graph_runtime as gr  # noqa: E402
from peers import (DEFAULT, ONE_THREAD, machine_line, onnxruntime_sessions,  # noqa: E402
                   random_feeds, session_calls)
from transformers import CACHE, MODELS  # noqa: E402  (bench/transformers.py)


def contenders(path: Path) -> dict[str, Callable[[], Any]]:
    """graph_runtime's run_with and both ONNX Runtime settings on the same seeded feeds."""
    from graph_runtime.frontend import from_onnx
    sessions = onnxruntime_sessions(path)
    feeds = random_feeds(sessions[DEFAULT], pad_masks=True)
    graph_json, lib, params = from_onnx(str(path))
    module = gr.create(graph_json, lib, gr.cpu(0))
    module.load_params(params)
    calls = {"graph_runtime": lambda: module.run_with(**feeds),
             **session_calls(sessions, feeds)}
    for call in calls.values():  # warm: compiled, tuned, caches filled
        for _ in range(5):
            call()
    return calls


def after_pauses(calls: dict[str, Callable[[], Any]], pauses: list[float],
                 rounds: int) -> dict[float, dict[str, float]]:
    """Per pause, each contender's median seconds for a call made that long after its last."""
    samples: dict[float, dict[str, list[float]]] = {p: {k: [] for k in calls} for p in pauses}
    order = list(calls)
    for _ in range(rounds):
        random.shuffle(order)
        for pause in pauses:
            for name in order:
                time.sleep(0.2)  # the previous contender's threads settle first
                calls[name]()
                time.sleep(pause)
                start = time.perf_counter()
                calls[name]()
                samples[pause][name].append(time.perf_counter() - start)
    return {p: {k: statistics.median(v) for k, v in by.items()} for p, by in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=[m for m in MODELS if m != "bert_base"])
    parser.add_argument("--files", nargs="*", type=Path, default=[])
    parser.add_argument("--pauses", nargs="*", type=float, default=[0.0, 0.01, 0.1, 0.5])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "idle_gaps.json")
    opts = parser.parse_args()
    paths = [CACHE / f"{m}.onnx" for m in opts.models] + list(opts.files)
    missing = [p for p in paths if not p.exists()]
    if missing:
        sys.exit(f"missing: {', '.join(map(str, missing))} (bench/transformers_models.py "
                 "exports the named models)")
    print(machine_line())
    print(f"team threads pinned: {os.environ.get('GRAPH_RUNTIME_ONEDNN_PIN', 'on')}")
    print(f"{'model':22s} {'pause':>7s} {'ours ms':>8s} {'ort ms':>8s} {'ort1t ms':>8s} "
          f"{'ratio':>6s}")
    results = []
    for path in paths:
        medians = after_pauses(contenders(path), opts.pauses, opts.rounds)
        for pause, med in medians.items():
            best = min(med[DEFAULT], med[ONE_THREAD])
            ratio = med["graph_runtime"] / best
            print(f"{path.stem:22s} {pause * 1e3:5.0f} ms {med['graph_runtime'] * 1e3:8.2f} "
                  f"{med[DEFAULT] * 1e3:8.2f} {med[ONE_THREAD] * 1e3:8.2f} {ratio:6.2f}")
            results.append({"model": path.stem, "pause_s": pause, "ratio": ratio,
                            "ms": {k: v * 1e3 for k, v in med.items()}})
    print(f"load average {os.getloadavg()[0]:.2f}")
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps({"machine": machine_line(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
