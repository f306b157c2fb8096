"""CUDA speed: ResNet-50, BERT-base 1x128 and a LLaMA-style decoder at batch 1 and 32 (issue 34).

Each model is built in PyTorch (random weights, seeded), exported with the TorchScript exporter
(opset 17, dynamic batch) into a cache folder, imported with graph_runtime.frontend.from_onnx at
each batch and run on `cuda(0)`. One call = inputs from host arrays, run, every output back to
the host: what a user of `set_input`/`run`/`get_output` pays. The peers, in the same process and
interleaved rounds: ONNX Runtime's CUDA execution provider where `onnxruntime-gpu` is installed
(the issue's peer), and PyTorch eager on the same GPU (TF32 off, so both compute float32) as a
reference that is always there on a GPU machine. Outputs are checked against PyTorch.

Ours runs three ways: as by default (run() replayed as a CUDA graph from its second call,
float32 products on TF32 tensor cores, as ONNX Runtime's CUDA provider does by default), with
GRAPH_RUNTIME_CUDA_TF32=off (full float32) and with GRAPH_RUNTIME_CUDA_GRAPHS=off (each kernel
launched from Python); ONNX Runtime by default and with use_tf32=0. The line under each model
says whether the graph was captured, or why not, and each contender's error against PyTorch's
float32. --profile N prints where our stepped module's time goes. Also measured: host<->device
copy bandwidth through the backend (pageable NumPy arrays) against CuPy's pinned-memory copies
of the same size.

Needs a CUDA GPU, CuPy, torch, torchvision, transformers, onnx. Usage:
  python bench/cuda_models.py [--models resnet50 bert_base llama] [--batch 1 32] [--rounds 5]
                              [--json OUT.json]
  python bench/cuda_models.py --copies [--rounds 5]   (the copy rates alone, the upward copy
                              step's parts: where it loses against a bare pinned copy)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# bench/transformers.py would shadow the transformers package: bench/ goes last on the path.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT / "tests" / "data" / "onnx"))  # make_models.py: BERT
sys.path.insert(0, str(ROOT))  # measure the checkout this script sits in
sys.path.append(str(ROOT / "bench"))  # last: bench/transformers.py must not shadow the package
import graph_runtime as gr  # noqa: E402
from graph_runtime.lib.chain import kernel_note  # noqa: E402
from onnx_models import end_to_end_call, make_inputs  # noqa: E402  (bench/: seeded inputs)
from peers import cuda_session  # noqa: E402  (bench/)

SEQ = 128
COPY_BYTES = 64 << 20
COPY_REPEAT = 9  # copies timed; their median is the rate


def _resnet50() -> Any:
    import torch
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).eval()


def _bert_base() -> Any:
    import make_models
    model, _ = make_models.build("bert", hidden=768, layers=12, heads=12, max_positions=SEQ)
    return model


def _llama() -> Any:
    import dynamic_models
    return dynamic_models._Logits(dynamic_models._llama()).eval()


# name -> (builder, input names, output names, shapes at batch b)
MODELS: dict[str, tuple[Callable[[], Any], list[str], list[str],
                        Callable[[int], dict[str, tuple[int, ...]]]]] = {
    "resnet50": (_resnet50, ["data"], ["logits"], lambda b: {"data": (b, 3, 224, 224)}),
    "bert_base": (_bert_base, ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"],
                  lambda b: {"input_ids": (b, SEQ), "attention_mask": (b, SEQ)}),
    "llama": (_llama, ["input_ids", "attention_mask"], ["logits"],
              lambda b: {"input_ids": (b, SEQ), "attention_mask": (b, SEQ)}),
}


def export(name: str, model: Any, cache: Path) -> Path:
    """The model exported once (TorchScript exporter, opset 17, dynamic batch)."""
    import torch
    path = cache / f"{name}.onnx"
    if path.exists():
        return path
    _, inputs, outputs, shapes = MODELS[name]
    args = tuple(torch.from_numpy(v) for v in make_inputs(shapes(1)).values())
    axes = {n: {0: "batch"} for n in inputs + outputs}
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    return path


def ours(path: Path, inputs: dict[str, np.ndarray], graphs: bool = True, tf32: bool = True,
         cudnn: str = "auto") -> tuple[Callable[[], list], Any, float]:
    """graph_runtime's end-to-end call on cuda(0), its module, and the import seconds; graphs:
    run() replayed as a CUDA graph (the default) or each kernel launched (the setting off);
    tf32: float32 products on TF32 tensor cores (the default) or in full float32; cudnn:
    GRAPH_RUNTIME_CUDA_CUDNN (auto: cuDNN where it measures faster than im2col + cuBLAS)."""
    from graph_runtime.frontend import from_onnx
    from graph_runtime.settings import CUDA_CUDNN, CUDA_GRAPHS, CUDA_TF32, overridden
    start = time.perf_counter()
    graph_json, lib, params = from_onnx(str(path), shape={k: v.shape for k, v in inputs.items()})
    imported = time.perf_counter() - start
    with overridden(CUDA_GRAPHS, "on" if graphs else "off"), \
            overridden(CUDA_TF32, "on" if tf32 else "off"), \
            overridden(CUDA_CUDNN, cudnn):
        m = gr.create(graph_json, lib, gr.cuda(0))
    m.load_params(gr.save_param_dict(params))
    return end_to_end_call(m, inputs), m, imported


def torch_call(model: Any, inputs: dict[str, np.ndarray]) -> Callable[[], list]:
    """PyTorch eager on the GPU: host inputs in, host outputs out."""
    import torch
    model = model.cuda()

    def call() -> list[np.ndarray]:
        with torch.no_grad():
            args = [torch.from_numpy(v).cuda() for v in inputs.values()]
            out = model(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        return [o.cpu().numpy() for o in out]
    return call


def ort_cuda_call(path: Path, inputs: dict[str, np.ndarray], tf32: bool = True
                  ) -> Callable[[], list] | None:
    """ONNX Runtime's CUDA execution provider, default options (TF32 on) or use_tf32=0; None
    where it is not installed."""
    session = cuda_session(path, None if tf32 else {"use_tf32": "0"})
    if session is None:
        return None
    return lambda: session.run(None, dict(inputs))


def worst_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30))
               for g, w in zip(got, want))


def medians(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """name -> median seconds per call; rounds interleave the contenders after a warm-up, each
    sample as many calls as fill about 50 ms."""
    number = {}
    for name, call in calls.items():
        for _ in range(2):
            call()
        start = time.perf_counter()
        call()
        number[name] = max(1, int(0.05 / (time.perf_counter() - start)))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(number[name]):
                call()
            samples[name].append((time.perf_counter() - start) / number[name])
    return {name: statistics.median(s) for name, s in samples.items()}


def copy_rate(call: Callable[[], Any], before: Callable[[], Any] = lambda: None) -> float:
    """GB/s of call copying COPY_BYTES: the median of COPY_REPEAT calls, before() untimed ahead
    of each (a warm-up call first)."""
    call()
    times = []
    for _ in range(COPY_REPEAT):
        before()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return COPY_BYTES / statistics.median(times) / 1e9


def copy_bandwidth() -> dict[str, float]:
    """GB/s for COPY_BYTES host->device and back: the backend's copies vs CuPy pinned, each
    the median of COPY_REPEAT copies, as copy_node_bandwidth's profile counts them.
    pinned_h2d_written: pinned data the host has just written (untimed), as a __copy node's
    source always is; on an H200 host (300 MiB L3) it moves 5-10% slower than pinned data
    left alone, its lines still dirty in the host's cache."""
    import cupy
    from graph_runtime.backends import get_backend
    backend = get_backend("cuda")
    host = np.ones(COPY_BYTES // 4, np.float32)
    dst = backend.empty(0, host.shape, np.dtype(np.float32))
    out = np.empty_like(host)
    pinned = cupy.cuda.alloc_pinned_memory(COPY_BYTES)
    pinned_host = np.frombuffer(pinned, np.float32, host.size)
    stream = backend.stream(0)

    def pinned_up() -> None:
        dst.set(pinned_host, stream=stream)
        stream.synchronize()

    def pinned_down() -> None:
        dst.get(stream=stream, out=pinned_host)
        stream.synchronize()
    return {"backend_h2d": copy_rate(lambda: backend.from_host(host, dst)),
            "backend_d2h": copy_rate(lambda: backend.to_host(dst, out)),
            "pinned_h2d": copy_rate(pinned_up), "pinned_d2h": copy_rate(pinned_down),
            "pinned_h2d_written": copy_rate(pinned_up,
                                            lambda: np.negative(host, out=pinned_host))}


def copy_node_bandwidth(breakdown: bool = False) -> dict[str, float]:
    """GB/s of a graph's __copy nodes moving COPY_BYTES from the host to the GPU and back (their
    host ends page-locked by the executor), from graph_runtime's profile (device-synchronised);
    breakdown: the upward step's parts too (_h2d_breakdown)."""
    from graph_runtime.graph.model import Graph
    n = COPY_BYTES // 4
    ref = [[0, 0, 0]]
    nodes = [{"op": "null", "name": "x", "inputs": []},
             {"op": "tvm_op", "name": "host_relu", "inputs": ref,
              "attrs": {"func_name": "relu", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}},
             {"op": "tvm_op", "name": "__copy_up", "inputs": [[1, 0, 0]],
              "attrs": {"func_name": "__copy", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}},
             {"op": "tvm_op", "name": "gpu_relu", "inputs": [[2, 0, 0]],
              "attrs": {"func_name": "relu", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}},
             {"op": "tvm_op", "name": "__copy_down", "inputs": [[3, 0, 0]],
              "attrs": {"func_name": "__copy", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}},
             {"op": "tvm_op", "name": "host_neg", "inputs": [[4, 0, 0]],
              "attrs": {"func_name": "negative", "num_inputs": "1", "num_outputs": "1", "flatten_data": "0"}}]
    graph = Graph.build(nodes, [[5, 0, 0]], shapes=[[n]] * 6, dtypes="float32",
                        device_index=[1, 1, 2, 2, 1, 1])
    m = gr.create(graph, None, [gr.cpu(0), gr.cuda(0)], strict=True)
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    m.run(x=x)
    np.testing.assert_array_equal(m.get_output(0).numpy(), -np.maximum(x, 0))
    rows = m.profile(repeat=COPY_REPEAT)
    up = next(t.seconds for t in rows if "__copy_up" in t.label)
    down = next(t.seconds for t in rows if "__copy_down" in t.label)
    rates = {"copy_node_h2d": COPY_BYTES / up / 1e9, "copy_node_d2h": COPY_BYTES / down / 1e9}
    return {**rates, **(_h2d_breakdown(m) if breakdown else {})}


def _h2d_breakdown(m: Any) -> dict[str, float]:
    """Where the upward copy step's time goes (issue 34: it moved 86-89% of a pinned copy's
    bytes a second on an H200, 91-94% of pinned data the host had just written): the step
    (its copy and the device sync) and CuPy's bare copy between the same two arrays, each on
    a clean source, after the host step that writes it and after NumPy writing it."""
    import cupy
    steps = m.executor.steps
    up = next(s for s in steps if "__copy_up" in s.label)
    writer = next(s for s in steps if "host_relu" in s.label)
    src, dst = up.args
    from graph_runtime.backends import get_backend
    backend = get_backend("cuda")
    stream = backend.stream(0)

    def step() -> None:
        up.fn(*up.args)
        backend.sync(0)

    def bare() -> None:
        dst.set(src, stream=stream)
        stream.synchronize()
    fresh = np.ones(src.shape, src.dtype)
    sources = {"clean": lambda: None, "after_step": lambda: writer.fn(*writer.args),
               "after_numpy": lambda: np.negative(fresh, out=src)}
    found = {f"h2d_step_{name}": copy_rate(step, before) for name, before in sources.items()}
    found.update({f"h2d_bare_{name}": copy_rate(bare, before)
                  for name, before in sources.items()})
    attrs = cupy.cuda.runtime.pointerGetAttributes(src.ctypes.data)
    host_type = getattr(cupy.cuda.runtime, "memoryTypeHost", 1)  # cudaMemoryTypeHost
    found["h2d_source_page_locked"] = float(attrs.type == host_type)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also print our module's N costliest kernels (by func_name)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir())
                        / "graph_runtime_bench_cuda", help="where the exports are kept")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "cuda.json")
    parser.add_argument("--copies", action="store_true",
                        help="only the copy rates, --rounds times, with the upward copy step's "
                             "parts (no models, no torch)")
    args = parser.parse_args()
    if args.copies:
        for _ in range(args.rounds):
            rates = {**copy_bandwidth(), **copy_node_bandwidth(breakdown=True)}
            print("GB/s: " + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()), flush=True)
        return
    args.cache.mkdir(parents=True, exist_ok=True)
    import torch
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(0)
    try:
        from graph_runtime.lib.kernels.cuda_cudnn import version
        cudnn = str(version())
    except Exception as exc:  # noqa: BLE001 (reported: the convolutions then run im2col)
        cudnn = f"not loaded ({exc})"
    print(f"{props['name'].decode()}, driver {cupy.cuda.runtime.driverGetVersion()}, "
          f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, CuPy {cupy.__version__}, "
          f"cuDNN {cudnn}, torch {torch.__version__}", flush=True)
    bandwidth = {**copy_bandwidth(), **copy_node_bandwidth()}
    print("copies of 64 MiB, GB/s: " + ", ".join(f"{k} {v:.1f}" for k, v in bandwidth.items()),
          flush=True)
    results: list[dict[str, Any]] = [{"copies_GBps": bandwidth}]
    print(f"{'model':<10} {'batch':>5} {'import s':>8} {'contender':<14} {'median ms':>10} "
          f"{'vs torch':>8}", flush=True)
    for name in args.models:
        builder, _, _, shapes = MODELS[name]
        model = builder()
        path = export(name, model, args.cache)
        for batch in args.batch:
            try:
                results.append(measure(name, model, path, batch, args.rounds, args.profile))
            except Exception as exc:  # one model's failure is reported; the others still run
                print(f"{name:<10} {batch:>5} FAILED: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:300] if str(exc) else ''}", flush=True)
                results.append({"model": name, "batch": batch, "failed": repr(exc)[:500]})
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))


def measure(name: str, model: Any, path: Path, batch: int, rounds: int, profile: int = 0
            ) -> dict[str, Any]:
    """One model at one batch: the contenders' medians, our error and the graph-capture probe."""
    inputs = make_inputs(MODELS[name][3](batch))
    ref = torch_call(model, inputs)
    call, m, imported = ours(path, inputs)
    want = ref()
    error = worst_error(call(), want)
    plain, stepped, _ = ours(path, inputs, graphs=False)
    exact, _, _ = ours(path, inputs, tf32=False)
    calls = {"graph_runtime": call, "gr float32": exact, "gr no graphs": plain, "torch": ref}
    errors = {"graph_runtime": error, "gr float32": worst_error(exact(), want)}
    notes = [kernel_note(step.kernel) for step in m.executor.steps]
    convs = sum("conv2d" in step.func_name for step in m.executor.steps)
    if convs:
        for label, word in (("gr cudnn on", "on"), ("gr im2col", "off")):
            other, _, _ = ours(path, inputs, cudnn=word)
            calls[label] = other
            errors[label] = worst_error(other(), want)
        fused = sum(n.startswith("cuDNN") and n.endswith("relu") for n in notes)
        print(f"  {sum(n.startswith('cuDNN') for n in notes)} of {convs} conv steps on cuDNN "
              f"({fused} with bias/residual/relu fused)", flush=True)
    for label, tf32 in (("ort_cuda", True), ("ort float32", False)):
        ort = ort_cuda_call(path, inputs, tf32)
        if ort is not None:
            calls[label] = ort
            errors[label] = worst_error(ort(), want)
    times = medians(calls, rounds)
    for who, seconds in times.items():
        print(f"{name:<10} {batch:>5} {imported:>8.1f} {who:<14} {seconds * 1e3:>10.3f} "
              f"{seconds / times['torch']:>8.2f}", flush=True)
    graph = m.executor.cuda_graph
    state = graph.state if graph is not None else "none"
    why = (graph.reason if graph is not None else m.executor.cuda_graph_reason) or "-"
    replayed = worst_error(call(), want)
    print(f"  error vs torch {error:.1e} (first run), {replayed:.1e} (replayed); CUDA graph "
          f"{state} ({why}); " + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()),
          flush=True)
    if profile:
        print_profile(stepped, profile)
    return {"model": name, "batch": batch, "import_s": imported,
            "ms": {k: v * 1e3 for k, v in times.items()}, "error_vs_torch": error,
            "error_replayed": replayed, "errors": errors, "cuda_graph": state, "why": why}


def print_profile(m: Any, top: int) -> None:
    """Our module's steps run one by one, each synchronised (median of 5): time per func_name,
    the top ones, to say where the time goes."""
    per: dict[str, list[float]] = {}
    for t in m.executor.profile(repeat=5):
        per.setdefault(t.func_name, []).append(t.seconds)
    total = sum(sum(v) for v in per.values())
    print(f"  profile, steps synchronised: {total * 1e3:.2f} ms in {sum(map(len, per.values()))}"
          " steps", flush=True)
    for func, secs in sorted(per.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"    {sum(secs) * 1e3:8.3f} ms {100 * sum(secs) / total:5.1f}% {len(secs):4d}x "
              f"{func}", flush=True)


if __name__ == "__main__":
    main()
