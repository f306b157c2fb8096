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

import os
import platform
from pathlib import Path
from typing import Any, Callable, Mapping

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
    """What the numbers were measured on: CPU, cores, load, ONNX Runtime's version."""
    import onnxruntime as ort
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
            f"ONNX Runtime {ort.__version__} with default session options (spinning allowed) "
            "and with one thread")
