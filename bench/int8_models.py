"""int8 models next to their float32 versions and next to ONNX Runtime running the same int8 model.

The committed BERT and ResNet exports (tests/data/onnx) are quantized with ONNX Runtime's own
tool: quantize_dynamic (MatMulInteger / ConvInteger, weights int8) and quantize_static (QDQ, per
channel). Each model runs on graph_runtime's CPU and on ONNX Runtime's CPU provider with the
same thread count; the median of `--repeat` timed runs after one warm-up is printed, with the
largest output difference between the two.

Usage: python bench/int8_models.py [--repeat 20] [--threads 2] [--models bert_ts resnet_ts]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data" / "onnx"


def feeds_for(path: Path, seed: int) -> dict[str, np.ndarray]:
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in session.get_inputs():
        if info.type == "tensor(int64)":
            high = 2 if "mask" in info.name else 100
            feeds[info.name] = rng.integers(1 if high == 2 else 0, high, info.shape)
        else:
            feeds[info.name] = rng.standard_normal(info.shape).astype(np.float32)
    return feeds


def quantized(source: Path, mode: str, folder: Path) -> Path:
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)
    out = folder / f"{source.stem}_{mode}.onnx"
    if mode == "dynamic":
        quantize_dynamic(str(source), str(out), weight_type=QuantType.QInt8)
    else:
        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.batches = iter([feeds_for(source, seed) for seed in range(4)])

            def get_next(self):  # type: ignore[no-untyped-def]
                return next(self.batches, None)
        quantize_static(str(source), str(out), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True)
    return out


def median_ms(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def ours(path: Path, feeds: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    import graph_runtime as gr
    from graph_runtime.frontend import from_onnx
    graph_json, lib, params = from_onnx(str(path))
    module = gr.create(graph_json, lib, gr.device("cpu"))
    module.load_params(gr.save_param_dict(params))
    for name, value in feeds.items():
        module.set_input(name, value)

    def run() -> list[np.ndarray]:
        module.run()
        return [module.get_output(i).numpy() for i in range(module.get_num_outputs())]
    return run


def theirs(path: Path, feeds: dict[str, np.ndarray], threads: int):  # type: ignore[no-untyped-def]
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda: [np.asarray(v) for v in session.run(None, feeds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["bert_ts", "resnet_ts"])
    args = parser.parse_args()
    print(f"{'model':<22} {'ours ms':>9} {'ORT ms':>9} {'ours/ORT':>9} {'max|ours-ORT|':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            source = DATA / f"{name}.onnx"
            feeds = feeds_for(source, 99)
            for mode in ("float32", "dynamic", "static_qdq"):
                path = source if mode == "float32" else quantized(source, mode, Path(tmp))
                mine, ort_run = ours(path, feeds), theirs(path, feeds, args.threads)
                diff = max(float(np.abs(a.astype(np.float64) - b).max())
                           for a, b in zip(mine(), ort_run()))
                t_ours, t_ort = median_ms(mine, args.repeat), median_ms(ort_run, args.repeat)
                print(f"{name + ' ' + mode:<22} {t_ours:>9.2f} {t_ort:>9.2f} "
                      f"{t_ours / t_ort:>9.2f} {diff:>14.3g}", flush=True)


if __name__ == "__main__":
    main()
