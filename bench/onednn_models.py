"""ONNX models on the CPU with and without oneDNN kernels, against ONNX Runtime in one process.

Each model file is imported once (graph_runtime.frontend.from_onnx) and created twice: with
GRAPH_RUNTIME_ONEDNN=off (NumPy/OpenBLAS/numba kernels), with the default auto (oneDNN where
timed faster per shape) and with on (oneDNN wherever it applies). ONNX Runtime runs the same
file with its default session options and with one thread, spinning allowed, as users run it
(bench/peers.py). Rounds interleave the contenders in a shuffled order (bench/interleave.py);
the table gives medians and the ratio to ONNX Runtime's faster setting (default threads or
one), plus how many nodes run on oneDNN, and the ratio paired by round (interleave.paired_ratio).
Run with the OpenBLAS core-type override removed, as on a user's machine:

  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/onednn_models.py \\
      tests/data/onnx/resnet_ts.onnx tests/data/onnx/mobilenetv2_ts.onnx [--batch 8] [--rounds 5]

The machine may be shared: report the load average (printed) with the numbers. --busy-core
runs the whole bench beside a child process spinning on one core (`while True: pass`), the
busy neighbour the thread policy must survive. --copy-residuals adds oneDNN (auto) made with
GRAPH_RUNTIME_IN_PLACE=off, its convs copying each residual into their output first: the
in-place sum (runtime/in_place.py) before and after, in the same rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure the checkout this script sits in
import graph_runtime as gr  # noqa: E402
from graph_runtime import settings  # noqa: E402
from interleave import interleaved_samples, paired_ratio  # noqa: E402  (bench/)
from peers import busy_core, machine_line, onnxruntime_calls  # noqa: E402  (bench/)


def _module(graph_json: str, lib: Any, params: dict, onednn: str,
            in_place: str = "on") -> tuple[Any, int]:
    """A GraphModule made with GRAPH_RUNTIME_ONEDNN=onednn (and GRAPH_RUNTIME_IN_PLACE), and
    its nodes on oneDNN."""
    with settings.overridden(settings.ONEDNN, onednn), \
            settings.overridden(settings.IN_PLACE, in_place):
        m = gr.create(graph_json, lib, gr.cpu())
    m.load_params(gr.save_param_dict(params))
    on_onednn = sum(1 for fn in _kernels(m) if "Onednn" in repr(fn))
    return m, on_onednn


def _kernels(m: Any) -> list[Any]:
    """Every prepared kernel of a module (chain steps included)."""
    from graph_runtime.lib.chain import PreparedChain
    found = []
    for step in m.executor.steps:
        fn = step.fn
        found += [f for f, _ in fn._steps] if isinstance(fn, PreparedChain) else [fn]
    return found


def contenders(path: Path, batch: int | None, copy_residuals: bool = False
               ) -> tuple[dict[str, Callable[[], Any]], dict]:

    from graph_runtime.frontend import from_onnx
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    first = model.graph.input[0]
    dims = [d.dim_value for d in first.type.tensor_type.shape.dim]
    shape = {first.name: (batch or dims[0] or 1, *dims[1:])}
    graph_json, lib, params = from_onnx(str(path), shape=shape)
    modules = {mode: _module(graph_json, lib, params, mode) for mode in ("off", "auto", "on")}
    if copy_residuals:
        modules["copy"] = _module(graph_json, lib, params, "auto", in_place="off")
    rng = np.random.default_rng(0)
    info = json.loads(graph_json)
    name = [info["nodes"][i]["name"] for i in info["arg_nodes"]
            if info["nodes"][i]["name"] not in params][0]
    eid = info["node_row_ptr"][[n["name"] for n in info["nodes"]].index(name)]
    x = rng.random(tuple(info["attrs"]["shape"][1][eid]), dtype=np.float32)

    def ours(m: Any) -> Callable[[], Any]:
        def call() -> list[np.ndarray]:
            m.set_input(name, x)
            m.run()
            return [m.get_output(i).numpy() for i in range(m.get_num_outputs())]
        return call

    calls: dict[str, Callable[[], Any]] = {
        "numpy/openblas": ours(modules["off"][0]),
        "onednn (auto)": ours(modules["auto"][0]),
        "onednn (on)": ours(modules["on"][0]),
        **onnxruntime_calls(path, {name: x}),
    }
    if copy_residuals:
        calls["onednn (auto), copy"] = ours(modules["copy"][0])
    want = calls["onnxruntime"]()
    for label in [k for k in calls if not k.startswith("onnxruntime")]:
        for i, (g, w) in enumerate(zip(calls[label](), want)):
            error = float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30))
            if error > 2e-4:
                raise SystemExit(f"{path.name} output {i}: {label} disagrees with ONNX Runtime "
                                 f"(max|diff| / max|ref| = {error:.1e})")
    kernels = len(_kernels(modules["auto"][0]))
    return calls, {"onednn_nodes": modules["auto"][1], "onednn_nodes_on": modules["on"][1],
                   "kernels": kernels, "in_place": len(modules["auto"][0].executor.in_place),
                   "input": list(x.shape)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--batch", type=int, default=None,
                        help="the input's batch (default: the file's, or 1 where symbolic)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--copy-residuals", action="store_true",
                        help="also run oneDNN (auto) with GRAPH_RUNTIME_IN_PLACE=off: each "
                             "conv copies its residual into its output first")
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy with a spinning child process meanwhile")
    args = parser.parse_args()
    with busy_core(args.busy_core):
        _bench(args)


def _bench(args: argparse.Namespace) -> None:
    results = []
    print(machine_line())
    for path in args.models:
        calls, info = contenders(path, args.batch, args.copy_residuals)
        samples = interleaved_samples(calls, args.rounds, repeat=3, number=3)
        times = {k: statistics.median(v) for k, v in samples.items()}
        base = min(times["onnxruntime"], times["onnxruntime 1 thread"])  # its faster setting
        load = os.getloadavg()[0]
        from graph_runtime.lib.kernels.onednn.policy import policy
        threads = policy().why
        print(f"{path.name} {info['input']}: {info['onednn_nodes']} of {info['kernels']} "
              f"kernels on oneDNN in auto, {info['onednn_nodes_on']} in on, "
              f"{info['in_place']} outputs written in place; oneDNN threads: "
              f"{threads}; load average {load:.2f}"
              f"{', one core kept busy' if args.busy_core else ''}")
        for name, seconds in times.items():
            print(f"  {name:22s} {seconds * 1e3:8.2f} ms  {seconds / base:5.2f}x")
        peers = ["onnxruntime", "onnxruntime 1 thread"]
        ratios = {name: paired_ratio(samples, name, peers, 3) for name in times
                  if name not in peers}
        print("  paired by round against ONNX Runtime's faster setting: " +
              ", ".join(f"{name} {ratio:.2f}x" for name, ratio in ratios.items()))
        results.append({"model": path.name, **info, "load": load, "busy_core": args.busy_core,
                        "onednn_threads": threads, "paired_ratio": ratios,
                        "ms": {k: v * 1e3 for k, v in times.items()}})
    print(machine_line())
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
