"""ONNX Runtime as users run it, for every bench: its default session options, and one thread.

Users create `InferenceSession(model)` and nothing else: intra-op threads one per physical core,
idle workers allowed to spin, every graph optimisation. Some also pin one thread. A bench that
configured the peer below that (allow_spinning=0, fewer optimisations) flattered us: BERT-tiny
measured 0.90x against a non-spinning ONNX Runtime and 1.27x against the default one in the
same run (issue 33). So the peer is built only here, and interleave.py pauses between contenders
so its spinning workers settle before the next one runs; tests/test_bench_peers.py holds the
benches to this module.
"""
from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from interleave import SETTLE_S  # (bench/)

DEFAULT = "onnxruntime"
ONE_THREAD = "onnxruntime 1 thread"


def onnxruntime_sessions(model: str | bytes | Path) -> dict[str, Any]:
    """{DEFAULT: a session with default options, ONE_THREAD: intra_op_num_threads=1 only}."""
    import onnxruntime as ort
    source = str(model) if isinstance(model, Path) else model
    one = ort.SessionOptions()
    one.intra_op_num_threads = 1
    return {DEFAULT: ort.InferenceSession(source, providers=["CPUExecutionProvider"]),
            ONE_THREAD: ort.InferenceSession(source, one, providers=["CPUExecutionProvider"])}


def profiled_session(model: str | bytes | Path) -> Any:
    """A default session with ONNX Runtime's profiler on, for its time by node (the profiler adds
    a few microseconds to each node: compare its sums, never its calls, with ours)."""
    import onnxruntime as ort
    source = str(model) if isinstance(model, Path) else model
    options = ort.SessionOptions()
    options.enable_profiling = True
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def profile_by_op(session: Any) -> dict[str, tuple[float, int]]:
    """op type -> (the sum over its nodes of each node's median seconds, nodes) from a
    profiled_session's runs so far (its first third left out: warm-up); ends its profiling."""
    import json
    path = session.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.remove(path)
    durations: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            durations.setdefault(event["name"], []).append(event["dur"] * 1e-6)
            ops[event["name"]] = event["args"].get("op_name", "?")
    found: dict[str, tuple[float, int]] = {}
    for name, seen in durations.items():
        total, count = found.get(ops[name], (0.0, 0))
        found[ops[name]] = (total + float(np.median(seen[len(seen) // 3:])), count + 1)
    return found


def cuda_session(model: str | bytes | Path, options: Mapping[str, str] | None = None) -> Any:
    """ONNX Runtime's CUDA execution provider with default options (issue 34's peer), or with
    the provider options given (use_tf32=0: its float32 products in full float32, to compare
    like with like); None where `onnxruntime-gpu` is not installed or cannot load CUDA."""
    import onnxruntime as ort
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    source = str(model) if isinstance(model, Path) else model
    provider: Any = ("CUDAExecutionProvider", dict(options)) if options else "CUDAExecutionProvider"
    session = ort.InferenceSession(source, providers=[provider])
    return session if "CUDAExecutionProvider" in session.get_providers() else None


def onnxruntime_calls(model: str | bytes | Path, feeds: Mapping[str, Any]
                      ) -> dict[str, Callable[[], Any]]:
    """Both settings as calls running the model on feeds."""
    return session_calls(onnxruntime_sessions(model), feeds)


def session_calls(sessions: Mapping[str, Any], feeds: Mapping[str, Any]
                  ) -> dict[str, Callable[[], Any]]:
    """{label: a call running that session on feeds} for sessions already made."""
    return {label: (lambda s=session: s.run(None, dict(feeds)))
            for label, session in sessions.items()}


def machine_line() -> str:
    """What the numbers were measured on: CPU, cores, load, the round trip between two CPUs of
    oneDNN's team (a VM's vCPUs placed far apart on the host make small models' runs 30-40%
    slower, and ONNX Runtime's differently: cpu/team_round_trip.py), ONNX Runtime's version."""
    import onnxruntime as ort
    from graph_runtime.lib.kernels.cpu.team_round_trip import round_trip_text
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    time.sleep(SETTLE_S)  # ONNX Runtime's threads spin after its last run: the probe's would wait
    return (f"{cpu}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
            f"{round_trip_text()}; "
            f"ONNX Runtime {ort.__version__} with default session options (spinning allowed) "
            "and with one thread")


def random_feeds(session: Any, pad_masks: bool = False,
                 dims: dict[str, int] | None = None) -> dict[str, Any]:
    """Seeded inputs of the shapes session declares: int64 token ids in [0, 1000) and masks of
    ones (with pad_masks, every sequence after the first padded from 3/4 of its length on),
    float32 normals for the rest. dims: the values of the symbolic dims (a model exported with
    dynamic axes); one not given is refused, naming it."""
    rng = np.random.default_rng(0)
    dims = dims or {}
    feeds: dict[str, Any] = {}
    for inp in session.get_inputs():
        shape = []
        for axis, d in enumerate(inp.shape):
            if isinstance(d, int):
                shape.append(d)
            elif d in dims:
                shape.append(int(dims[d]))
            else:
                raise SystemExit(f"input {inp.name!r} dim {axis} is symbolic ({d!r}): give its "
                                 f"value with --dim {d}=N")
        if "int64" not in inp.type:
            feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
        elif "mask" not in inp.name:
            feeds[inp.name] = rng.integers(0, 1000, shape).astype(np.int64)
        else:
            mask = np.ones(shape, np.int64)
            if pad_masks and shape[0] > 1:
                mask[1:, shape[1] * 3 // 4:] = 0
            feeds[inp.name] = mask
    return feeds


@contextlib.contextmanager
def busy_core(on: bool = True) -> Iterator[None]:
    """A child process spinning on one CPU meanwhile (pinned to the last one this process may
    use), as a neighbour holding a core does to every contender alike; nothing when not on."""
    if not on:
        yield
        return
    cpu = max(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c",
                             f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        yield
    finally:
        spin.kill()
        spin.wait()
