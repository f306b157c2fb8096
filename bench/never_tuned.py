"""Models graph_runtime was never tuned for: graph_runtime (CPU) vs ONNX Runtime as users run it.

The models come from bench/never_tuned_models.py (run it first with a Python that has torch and
transformers): LLaMA, Qwen2, Mistral, Phi-3, a T5 encoder, ALBERT, ELECTRA, DeiT, CLIP's vision
tower, Swin, RegNet, ConvNeXt-v2, MobileViT, wav2vec2, Bloom, GPT-NeoX, OPT, EfficientNet-B0 and
DeBERTa-v2, each from both PyTorch exporters where they worked. Each is imported with
graph_runtime.frontend.from_onnx (passes named by --disable-pass are skipped) and timed beside ONNX
Runtime's default session and its one-thread session (bench/peers.py), the contenders interleaved
with a pause between them (bench/interleave.py); the table gives medians, ONNX Runtime's absolute
times, the ratio to its faster setting (paired by round: interleave.paired_ratio) with the lowest
and highest round's, and whether our output matches its (max abs error against a tolerance scaled
to the output). Run it with `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE` as on a user's machine;
it prints the load. --busy-core keeps one core busy with a spinning process meanwhile (issue 33's
neighbour).

Usage: python bench/never_tuned.py [--models llama_ts swin_dynamo ...] [--rounds 3]
                                   [--disable-pass NAME ...] [--busy-core] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure the checkout this script sits in
import graph_runtime as gr  # noqa: E402
from interleave import interleaved_samples, round_ratios  # noqa: E402  (bench/)
from peers import (DEFAULT, ONE_THREAD, busy_core, machine_line,  # noqa: E402
                   onnxruntime_sessions, random_feeds, session_calls)

CACHE = Path.home() / ".cache" / "graph_runtime" / "bench_never_tuned"


def measure(path: Path, rounds: int, disable: list[str]) -> dict[str, Any]:
    from graph_runtime.frontend import from_onnx
    peers = onnxruntime_sessions(path)
    feeds = random_feeds(peers[DEFAULT])
    graph_json, lib, params = from_onnx(str(path), disable=disable)
    module = gr.create(graph_json, lib, gr.cpu(0))
    module.load_params(params)
    module.run(**feeds)
    want = peers[DEFAULT].run(None, feeds)[0].astype(np.float64)
    got = module.get_output(0).numpy().astype(np.float64)
    error = float(np.abs(got - want).max()) if got.shape == want.shape else math.inf
    # scaled to the output itself: a floor of 1 let EfficientNet's 0.006-wide output pass with
    # any error of a sixth of it; an output of zeros only (a degenerate export) matches nothing
    largest = float(np.abs(want).max())
    tolerance = 1e-3 * largest if largest > 0 else -1.0

    def ours() -> None:
        module.run(**feeds)
        module.get_output(0).numpy()

    calls = {"graph_runtime": ours, **session_calls(peers, feeds)}
    samples = interleaved_samples(calls, rounds=rounds, repeat=3, number=2)
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    rounds = round_ratios(samples, "graph_runtime", [DEFAULT, ONE_THREAD], 3)
    return {"model": path.stem, "ms": med, "max_abs_err": error, "matches": error <= tolerance,
            "ratio": statistics.median(rounds), "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*")
    parser.add_argument("--folder", type=Path, default=CACHE)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--disable-pass", action="append", default=[])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy with a spinning child process meanwhile "
                             "(a neighbour holding a core, for every contender alike)")
    opts = parser.parse_args()
    with busy_core(opts.busy_core):
        _bench(opts)


def _bench(opts: argparse.Namespace) -> None:
    paths = [opts.folder / f"{m}.onnx" for m in opts.models] if opts.models \
        else sorted(opts.folder.glob("*.onnx"))
    missing = [p.stem for p in paths if not p.is_file()]
    if missing:
        have = ", ".join(sorted(p.stem for p in opts.folder.glob("*.onnx"))) or "none"
        sys.exit(f"never_tuned: no {', '.join(missing)} in {opts.folder} (run "
                 f"bench/never_tuned_models.py first); there: {have}")
    print(machine_line() + (", one core kept busy by a spinning process" if opts.busy_core
                            else ""))
    print(f"{'model':20} {'ort ms':>8} {'ort1t ms':>8} {'ours ms':>8} {'ratio':>6} "
          f"{'rounds':>11} {'max err':>8} matches")
    rows = []
    for path in paths:
        r = measure(path, opts.rounds, opts.disable_pass)
        rows.append(r)
        ms = r["ms"]
        print(f"{r['model']:20} {ms[DEFAULT]:8.2f} {ms[ONE_THREAD]:8.2f} "
              f"{ms['graph_runtime']:8.2f} {r['ratio']:6.2f} "
              f"{min(r['rounds']):5.2f}-{max(r['rounds']):<5.2f} {r['max_abs_err']:8.1e} "
              f"{'yes' if r['matches'] else 'NO'}", flush=True)
    if rows:
        ratios = [r["ratio"] for r in rows]
        print(f"geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}, "
              f"worst {max(ratios):.2f} ({max(rows, key=lambda r: r['ratio'])['model']})")
    print(machine_line())
    from graph_runtime.lib.kernels.onednn.binding import describe
    print(describe())  # the oneDNN threading mode this process ran in (auto decides per process)
    if opts.json:
        opts.json.write_text(json.dumps({"rows": rows, "load": os.getloadavg(),
                                         "busy_core": opts.busy_core, "onednn": describe()},
                                        indent=1))


if __name__ == "__main__":
    main()
