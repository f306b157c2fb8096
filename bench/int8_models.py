"""int8 models next to their float32 versions, here and on ONNX Runtime, in one process.

Each float32 model is quantized by ONNX Runtime's own tool (tests/frontend/quantize_models.py):
quantize_dynamic (MatMulInteger / ConvInteger, int8 weights) and quantize_static (QDQ, per
channel); quantized files are kept in the cache folder. Four contenders per model and mode run
interleaved in shuffled rounds (bench/interleave.py): int8 here, float32 here, ONNX Runtime int8
and ONNX Runtime float32 (intra-op threads = --threads, no spinning). The table gives medians,
the ratios int8/float32 here and int8 here / ONNX Runtime int8, and the largest difference from
ONNX Runtime's int8 output in steps of the output's quantisation scale (where the output is a
DequantizeLinear) or as max|diff| / max|ref|.

Default models: the cached Hugging Face exports (ResNet-50 in ~/.cache/graph_runtime/bench_convnets,
BERT-tiny from bench/transformers_models.py), else the committed small ones (tests/data/onnx).
Run with the OpenBLAS core-type override removed, as on a user's machine, and say the load:

  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/int8_models.py [--batch 8] \\
      [--models PATH ...] [--modes static_qdq dynamic] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "frontend"))  # quantize_models.py: feeds, quantization
from interleave import interleaved_samples  # noqa: E402  (bench/)
import peers  # noqa: E402  (bench/)
from quantize_models import MODES, feeds_for, quantized  # noqa: E402

CACHE = Path.home() / ".cache" / "graph_runtime"
DEFAULT = [CACHE / "bench_convnets" / "resnet50.onnx",
           CACHE / "bench_transformers" / "bert_tiny.onnx"]
SMALL = [ROOT / "tests" / "data" / "onnx" / "resnet_ts.onnx",
         ROOT / "tests" / "data" / "onnx" / "bert_ts.onnx"]


def ours(path: Path, feeds: dict[str, np.ndarray]) -> Callable[[], list[np.ndarray]]:
    import graph_runtime as gr
    from graph_runtime.frontend import from_onnx
    graph_json, lib, params = from_onnx(str(path), shape={k: v.shape for k, v in feeds.items()})
    module = gr.create(graph_json, lib, gr.device("cpu"))
    module.load_params(gr.save_param_dict(params))

    def run() -> list[np.ndarray]:
        module.run(**feeds)
        return [module.get_output(i).numpy() for i in range(module.get_num_outputs())]
    return run


def theirs(path: Path, feeds: dict[str, np.ndarray], threads: int
           ) -> Callable[[], list[np.ndarray]]:
    label = peers.ONE_THREAD if threads == 1 else peers.DEFAULT
    session = peers.onnxruntime_sessions(path)[label]
    return lambda: [np.asarray(v) for v in session.run(None, feeds)]


def output_steps(path: Path) -> dict[int, float]:
    """Output index -> quantisation scale, for outputs a DequantizeLinear with a constant scale
    makes."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(path))
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    made = {n.output[0]: n for n in m.graph.node if n.op_type == "DequantizeLinear"}
    steps = {}
    for i, out in enumerate(m.graph.output):
        node = made.get(out.name)
        if node is not None and node.input[1] in consts:
            steps[i] = float(np.max(consts[node.input[1]]))
    return steps


def difference(got: list[np.ndarray], want: list[np.ndarray], steps: dict[int, float]) -> str:
    worst = []
    for i, (g, w) in enumerate(zip(got, want)):
        diff = float(np.abs(g.astype(np.float64) - w).max())
        if i in steps:
            worst.append(f"{diff / steps[i]:.1f} steps")
        else:
            worst.append(f"{diff / max(float(np.abs(w).max()), 1e-30):.1e} rel")
    return ", ".join(worst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", type=Path, default=None)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--batch", type=int, default=1, help="for a symbolic batch dimension")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=CACHE / "bench_int8")
    args = parser.parse_args()
    models = args.models or [p for p in DEFAULT if p.exists()] or SMALL
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; threads "
          f"{args.threads}; batch {args.batch}; medians of {args.rounds}x{args.repeat} (ms)")
    print(f"{'model':<24} {'int8':>8} {'fp32':>8} {'ORT int8':>9} {'ORT fp32':>9} "
          f"{'int8/fp32':>10} {'int8/ORT':>9}  vs ORT int8")
    for source in models:
        feeds = feeds_for(source, 99, args.batch)
        for mode in args.modes:
            path = quantized(source, mode, args.out)
            calls: dict[str, Callable[[], Any]] = {
                "int8": ours(path, feeds), "fp32": ours(source, feeds),
                "ORT int8": theirs(path, feeds, args.threads),
                "ORT fp32": theirs(source, feeds, args.threads)}
            agree = difference(calls["int8"](), calls["ORT int8"](), output_steps(path))
            samples = interleaved_samples(calls, args.rounds, args.repeat, 1)
            ms = {k: 1000 * statistics.median(v) for k, v in samples.items()}
            label = f"{source.stem} {mode}"
            print(f"{label:<24} {ms['int8']:>8.2f} {ms['fp32']:>8.2f} {ms['ORT int8']:>9.2f} "
                  f"{ms['ORT fp32']:>9.2f} {ms['int8'] / ms['fp32']:>10.2f} "
                  f"{ms['int8'] / ms['ORT int8']:>9.2f}  {agree}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
