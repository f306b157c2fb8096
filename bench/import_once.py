"""Import once, run any shape: every dynamic-shape export imported without --shape, checked.

For each model (default: every .onnx in bench/dynamic_models.py's cache folder, which its
--only/ARCHS options fill: LLaMA, Qwen2, Phi-3, Mistral, Bloom, Falcon, GPT-NeoX, OPT, T5
encoder, ALBERT, RoBERTa, MPNet, CLIP text, both exporters; the KV-cache decoder, a CNN with
dynamic height and width, wav2vec2), the model is imported once with no shapes given; then it runs
at several shapes (batch 1-3, lengths 1-77, a padded sequence, a KV past of 0-40) and every
output is compared with ONNX Runtime's. Prints a table: model, how the import went (propagation,
the probe fallback, or the refusal), import seconds, shapes checked, the largest difference.
Usage: python bench/import_once.py [--dir DIR] [MODEL.onnx ...]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure the checkout this script sits in
import graph_runtime as gr  # noqa: E402
from graph_runtime.errors import GraphRuntimeError  # noqa: E402
from graph_runtime.frontend import import_onnx  # noqa: E402
from peers import DEFAULT, machine_line, onnxruntime_sessions  # noqa: E402  (bench/)

CACHE = Path.home() / ".cache" / "graph_runtime" / "bench_dynamic"
# (batch, seq, past) per check; images and audio take their own sizes from these.
SHAPES = [(1, 9, 0), (2, 31, 7), (1, 1, 40), (3, 77, 3)]


def feeds(session: Any, batch: int, seq: int, past: int) -> dict[str, np.ndarray]:
    """Inputs for one check, each axis sized by what the input is (ids, mask, image...)."""
    rng = np.random.default_rng(batch * 100 + seq)
    out: dict[str, np.ndarray] = {}
    for inp in session.get_inputs():
        name = inp.name
        shape = []
        for axis, dim in enumerate(inp.shape):
            if isinstance(dim, int):
                shape.append(dim)
            elif axis == 0:
                shape.append(batch)
            elif name.startswith("past_key_values"):
                shape.append(past)
            elif name == "attention_mask" and any(i.name.startswith("past_key_values")
                                                   for i in session.get_inputs()):
                shape.append(past + seq)
            elif name == "x":  # an image: height and width
                shape.append(64 + 8 * seq if axis == 2 else 48 + 4 * seq)
            elif name == "audio":
                shape.append(3000 + 97 * seq)
            else:
                shape.append(seq)
        if name == "position_ids":
            out[name] = np.arange(past, past + seq, dtype=np.int64)[None].repeat(batch, 0)
        elif name == "attention_mask":
            mask = np.ones(shape, np.int64)
            if batch > 1 and shape[1] > 4:
                mask[1, shape[1] * 3 // 4:] = 0  # one padded sequence
            out[name] = mask
        elif "int" in inp.type:
            out[name] = rng.integers(0, 100, shape).astype(np.int64)
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def import_timed(path: Path) -> Any:
    """The model imported once without --shape (ImportResult), after the machine line; exits
    naming the export script when the model is missing (stream.py and generate.py start so)."""
    if not path.exists():
        sys.exit(f"{path} is missing: run bench/dynamic_models.py --only {path.stem} with a "
                 "Python that has torch and transformers")
    print(machine_line())
    start = time.perf_counter()
    result = import_onnx(path)
    print(f"imported {path.name} once without --shape in {time.perf_counter() - start:.1f} s")
    return result


def check(path: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"model": path.stem}
    start = time.perf_counter()
    try:
        result = import_onnx(path)
    except GraphRuntimeError as e:
        row.update(how="refused", why=str(e).splitlines()[0][:160])
        return row
    row["import_s"] = time.perf_counter() - start
    row["how"] = getattr(result, "symbolic_path", None) or "static"
    session = onnxruntime_sessions(path)[DEFAULT]
    module = gr.create(result.graph_json, result.module())
    module.load_params(result.params)
    worst, checked = 0.0, 0
    for batch, seq, past in SHAPES:
        inputs = feeds(session, batch, seq, past)
        try:
            want = session.run(None, inputs)
        except Exception:  # a shape the model itself does not take (ORT refuses it too)
            continue
        try:
            module.run(**inputs)
        except GraphRuntimeError as e:
            row.update(how=f"{row['how']}, run refused", why=str(e).splitlines()[0][:160])
            return row
        for i, w in enumerate(want):
            got = module.get_output(i).numpy()
            if got.shape != w.shape:
                row.update(how=f"{row['how']}, WRONG SHAPE",
                           why=f"output {i}: {got.shape} vs {w.shape}")
                return row
            scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
            worst = max(worst, float(np.max(np.abs(got - w))) / scale if w.size else 0.0)
        checked += 1
    row.update(shapes=checked, max_rel_diff=worst)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--dir", type=Path, default=CACHE)
    opts = parser.parse_args()
    paths = opts.models or sorted(opts.dir.rglob("*.onnx"))
    if not paths:
        sys.exit(f"no models in {opts.dir}: run bench/dynamic_models.py with a Python that has "
                 "torch and transformers")
    print(f"{'model':24s} {'import':28s} {'s':>5s} {'shapes':>6s} {'max rel diff':>12s}")
    bad = 0
    for path in paths:
        row = check(path)
        ok = row["how"] in ("propagation", "probes", "static") and row.get("shapes", 0) > 0 \
            and row.get("max_rel_diff", 1.0) < 1e-3
        bad += not ok
        print(f"{row['model']:24s} {row['how']:28s} {row.get('import_s', 0):5.1f} "
              f"{row.get('shapes', 0):6d} {row.get('max_rel_diff', float('nan')):12.2e}"
              + (f"  {row['why']}" if "why" in row else ""), flush=True)
    print(f"{len(paths) - bad} of {len(paths)} imported once and matched ONNX Runtime")


if __name__ == "__main__":
    main()
