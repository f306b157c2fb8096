"""A tuning file written on a busy machine, then used on a quiet one: the same speed as a clean one?

Issue 33's case: the first runs on a machine happen while other work keeps the cores busy, and
the choices measured then must not slow every later process. This bench writes two tuning
caches with bench/onednn_models.py, each in a folder of its own (GRAPH_RUNTIME_TUNING_CACHE):
one beside a busy core (`--busy-core`: a child spinning on one CPU), one on the quiet machine.
Then, in alternated pairs of processes on the quiet machine, each starting from a pristine copy
of its cache, it runs the same bench with the busy-written cache and with the clean one, and
prints per model the kernels oneDNN runs (auto), our time, ONNX Runtime's (default session
options and one thread) and the ratio to its faster setting, median over the pairs. Also how
many entries the busy writer marked busy (the next process measures those again) and how many
the first quiet process left so. Your own tuning cache is not touched.

  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/busy_tuning.py \\
      ~/.cache/graph_runtime/bench_convnets/resnet50.onnx [more.onnx ...] [--pairs 2]

Writes bench/results/busy_tuning.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "onednn_models.py"
TUNING_FILE_GLOB = "tuning-*.json"


def run_bench(models: list[Path], cache: Path, busy: bool, rounds: int) -> list[dict[str, Any]]:
    """bench/onednn_models.py in a process of its own with this tuning cache; its results."""
    out = cache.parent / f"{cache.name}.result.json"
    env = dict(os.environ, GRAPH_RUNTIME_TUNING_CACHE=str(cache))
    command = [sys.executable, str(BENCH), *map(str, models), "--rounds", str(rounds),
               "--json", str(out)] + (["--busy-core"] if busy else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{BENCH.name} failed ({'busy' if busy else 'quiet'}, cache {cache}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def confidence(cache: Path) -> dict[str, int]:
    """How many entries of the cache's tuning file have each confidence."""
    counts: dict[str, int] = {}
    for path in cache.glob(TUNING_FILE_GLOB):
        for entry in json.loads(path.read_text()).get("entries", []):
            key = str(entry.get("confidence", "quiet"))
            counts[key] = counts.get(key, 0) + 1
    return counts


def fresh_copy(pristine: Path, work: Path) -> Path:
    """A copy of pristine's cache in work, replacing what an earlier pair left there."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(pristine, work)
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--pairs", type=int, default=2, help="alternated quiet pairs")
    parser.add_argument("--rounds", type=int, default=2, help="onednn_models.py --rounds")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" /
                        "busy_tuning.json")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="busy_tuning_") as tmp:
        base = Path(tmp)
        written = {"busy": base / "busy", "clean": base / "clean"}
        for label, cache in written.items():
            cache.mkdir()
            where = "beside a busy core" if label == "busy" else "quiet"
            print(f"writing the {label} cache ({where})", flush=True)
            run_bench(opts.models, cache, busy=label == "busy", rounds=1)
        marks = {label: confidence(cache) for label, cache in written.items()}
        runs: dict[str, list[list[dict[str, Any]]]] = {"busy": [], "clean": []}
        after_first: dict[str, int] = {}
        for pair in range(opts.pairs):
            order = ["busy", "clean"] if pair % 2 == 0 else ["clean", "busy"]
            for label in order:
                time.sleep(2)  # the other process's spinning threads settle
                work = fresh_copy(written[label], base / f"{label}_run")
                runs[label].append(run_bench(opts.models, work, busy=False, rounds=opts.rounds))
                if pair == 0 and label == "busy":
                    after_first = confidence(work)
                print(f"pair {pair + 1}: {label} cache done", flush=True)
    print(f"\nentries by confidence: busy-written {marks['busy']}, clean {marks['clean']}; "
          f"the busy-written file after its first quiet process: {after_first}")
    print(f"{'model':22s} {'cache':6s} {'oneDNN':>9s} {'ours ms':>8s} {'ort ms':>7s} "
          f"{'ort1t ms':>8s} {'ratio':>6s}  (ratio per pair)")
    table = []
    for index, model in enumerate(opts.models):
        for label in ("busy", "clean"):
            rows = [run[index] for run in runs[label]]
            ratios = [r["ms"]["onednn (auto)"] / min(r["ms"]["onnxruntime"],
                                                     r["ms"]["onnxruntime 1 thread"])
                      for r in rows]
            med = {k: statistics.median(r["ms"][k] for r in rows)
                   for k in ("onednn (auto)", "onnxruntime", "onnxruntime 1 thread")}
            kernels = sorted({f"{r['onednn_nodes']}/{r['kernels']}" for r in rows})
            print(f"{model.name:22s} {label:6s} {','.join(kernels):>9s} "
                  f"{med['onednn (auto)']:8.2f} {med['onnxruntime']:7.2f} "
                  f"{med['onnxruntime 1 thread']:8.2f} {statistics.median(ratios):6.2f}  "
                  f"({', '.join(f'{x:.2f}' for x in ratios)})")
            table.append({"model": model.name, "cache": label, "onednn_kernels": kernels,
                          "median_ms": med, "ratios": ratios,
                          "load": [r["load"] for r in rows]})
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps({"confidence": marks, "after_first_quiet": after_first,
                                     "table": table}, indent=1))
    print(f"wrote {opts.json}")


if __name__ == "__main__":
    main()
