"""Small Hugging Face transformers: graph_runtime (CPU) vs ONNX Runtime, in one process.

The models come from bench/transformers_models.py (run it first with a Python that has torch and
transformers). Each is imported with graph_runtime.frontend.from_onnx and run beside ONNX Runtime
with its default threads and with one thread; rounds interleave the contenders (bench/interleave.py)
and the table gives medians and the ratio to ONNX Runtime's faster setting (paired by round:
interleave.paired_ratio, with the lowest and highest round's). Also reports the import time and each model's first create+run
(chain compiles; fresh numba cache if the cache directory was empty) and the largest error
against ONNX Runtime. Run it with
`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` as on a user's machine, and say the load average.
--busy-core keeps one core busy with a spinning process meanwhile (issue 33's neighbour: every
contender runs beside it, and ONNX Runtime's one-thread setting is usually its faster one then).

Usage: python bench/transformers.py [--models vit_small bert_tiny ...] [--rounds 5]
                                    [--busy-core] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure the checkout this script sits in
import graph_runtime as gr  # noqa: E402
from interleave import interleaved_samples, round_ratios  # noqa: E402  (bench/)
from peers import (DEFAULT, ONE_THREAD, busy_core, machine_line,  # noqa: E402
                   onnxruntime_sessions, random_feeds, session_calls)

CACHE = Path.home() / ".cache" / "graph_runtime" / "bench_transformers"
MODELS = ["vit_small", "bert_tiny", "bert_tiny_dynamo", "distilbert_tiny", "whisper_encoder_tiny",
          "gpt2_tiny", "bert_base"]


def measure(name: str, folder: Path, rounds: int) -> dict[str, Any]:
    from graph_runtime.frontend import from_onnx
    path = folder / f"{name}.onnx"
    peers = onnxruntime_sessions(path)
    sessions = {"ort": peers[DEFAULT], "ort_1t": peers[ONE_THREAD]}
    feeds = random_feeds(sessions["ort"], pad_masks=True)
    start = time.perf_counter()
    graph_json, lib, params = from_onnx(str(path))
    import_s = time.perf_counter() - start
    start = time.perf_counter()
    module = gr.create(graph_json, lib, gr.cpu(0))
    module.load_params(params)
    module.run(**feeds)
    first_s = time.perf_counter() - start
    want = sessions["ort"].run(None, feeds)[0]
    got = module.get_output(0).numpy()
    error = float(np.abs(got.astype(np.float64) - want).max())

    def ours() -> None:
        module.run(**feeds)
        module.get_output(0).numpy()

    calls = {"graph_runtime": ours, **session_calls(sessions, feeds)}
    samples = interleaved_samples(calls, rounds=rounds, repeat=5, number=3)
    med = {k: statistics.median(v) for k, v in samples.items()}
    rounds = round_ratios(samples, "graph_runtime", ["ort", "ort_1t"], 5)
    return {"model": name, "import_s": import_s, "first_run_s": first_s, "max_abs_err": error,
            "ms": {k: v * 1e3 for k, v in med.items()},
            "ratio": statistics.median(rounds), "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--folder", type=Path, default=CACHE)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy with a spinning child process meanwhile")
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    with busy_core(opts.busy_core):
        rows = table(opts)
    if opts.json:
        from graph_runtime.lib.kernels.onednn.binding import describe
        opts.json.write_text(json.dumps({"rows": rows, "load": os.getloadavg(),
                                         "busy_core": opts.busy_core, "onednn": describe()},
                                        indent=1))


def table(opts: argparse.Namespace) -> list[dict[str, Any]]:
    """Measure and print each model's row; the rows."""
    rows = []
    print(machine_line() + (", one core kept busy" if opts.busy_core else ""))
    print(f"{'model':22} {'ours ms':>9} {'ort ms':>9} {'ort1t ms':>9} {'ratio':>6} "
          f"{'rounds':>11} {'import s':>8} {'1st run s':>9} {'max err':>8}")
    for name in opts.models:
        r = measure(name, opts.folder, opts.rounds)
        rows.append(r)
        ms = r["ms"]
        print(f"{name:22} {ms['graph_runtime']:9.3f} {ms['ort']:9.3f} {ms['ort_1t']:9.3f} "
              f"{r['ratio']:6.2f} {min(r['rounds']):5.2f}-{max(r['rounds']):<5.2f} "
              f"{r['import_s']:8.2f} {r['first_run_s']:9.2f} "
              f"{r['max_abs_err']:8.1e}", flush=True)
    small = [r["ratio"] for r in rows if r["model"] != "bert_base"]
    if small:
        print(f"geometric mean (without bert_base): "
              f"{math.exp(sum(math.log(x) for x in small) / len(small)):.2f}")
    print(machine_line())
    from graph_runtime.lib.kernels.onednn.binding import describe
    print(describe())  # the oneDNN threading mode this process ran in (auto decides per process)
    return rows


if __name__ == "__main__":
    main()
