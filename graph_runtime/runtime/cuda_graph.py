"""A static module's run() on one GPU captured once as a CUDA graph and replayed after.

Each run() of a module on CUDA launches one or more kernels per step from Python, 10-20 us of
host work each: at batch 1 the GPU waits on the host (ResNet-50 ran 1.6x PyTorch's eager time
on an H200). A CUDA graph replays every launch of a run with one call. The first run runs
plainly (kernels compile, lazy buffers are made); the second is captured on the backend's
stream and launched; later runs launch the graph. Inputs and outputs keep their buffers, so
set_input's copies and get_output's reads are ordered with the replay on that stream.

Temporaries the kernels allocate while being captured come from a memory pool of the graph's
own, kept as long as the graph (their addresses are baked into it); nothing else allocates
from it. Anything a run does that a capture cannot hold (a read back to the host, a library
CuPy refuses during capture, a copy from host memory) makes the capture fail: the module then
runs plainly from there on and says why (`reason`). Modules whose kernels decide on the host
per run from an input (derived data redone when the input changes) are never captured, as a
replay would skip that decision; nor are modules over several devices.
GRAPH_RUNTIME_CUDA_GRAPHS=off turns it off.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from .. import settings

log = logging.getLogger("graph_runtime")


class CudaGraphRuns:
    """run() for one executor: plain, then captured, then replayed (or plain for good)."""

    def __init__(self, device_id: int, run_plain: Callable[[], None], source: str) -> None:
        self.device_id = device_id
        self.run_plain = run_plain
        self.source = source
        # warming -> capture -> replaying, or -> plain when the capture fails (reason says why)
        self.state = "warming"
        self.reason = ""
        self._graph: Any = None
        self._pool: Any = None

    def run(self) -> None:
        if self.state == "replaying":
            self._graph.launch(self._stream())
        elif self.state == "warming":
            self.run_plain()
            self.state = "capture"
        elif self.state == "capture":
            self._capture()
        else:
            self.run_plain()

    def invalidate(self) -> None:
        """Buffers the graph holds were rebound: capture again after one plain run."""
        if self.state != "plain":
            self._graph, self._pool, self.state = None, None, "warming"

    def _stream(self) -> Any:
        from ..backends import get_backend
        backend: Any = get_backend("cuda")  # the CUDA backend: one stream per GPU
        return backend.stream(self.device_id)

    def _capture(self) -> None:
        import cupy
        from cupy.cuda import runtime
        stream = self._stream()
        pool = cupy.cuda.MemoryPool()
        try:
            with cupy.cuda.Device(self.device_id), cupy.cuda.using_allocator(pool.malloc):
                # relaxed: a first allocation of the pool's may call cudaMalloc meanwhile
                stream.begin_capture(runtime.streamCaptureModeRelaxed)
                try:
                    self.run_plain()
                finally:
                    graph = stream.end_capture()
        except Exception as e:  # whatever a capture cannot hold: plain runs from here on
            self.state = "plain"
            self.reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.info("%s: run() is not captured as a CUDA graph (%s); it runs step by step",
                     self.source, self.reason)
            self.run_plain()  # the captured calls were recorded, not run
            return
        self._graph, self._pool, self.state = graph, pool, "replaying"
        graph.launch(stream)


def cuda_graph_runs(devices: list[Any], has_versions: bool, run_plain: Callable[[], None],
                    source: str) -> tuple[CudaGraphRuns | None, str]:
    """The capturing runner for an executor on these devices, or None and why not."""
    if settings.word(settings.CUDA_GRAPHS) == "off":
        return None, "GRAPH_RUNTIME_CUDA_GRAPHS=off"
    if len(devices) != 1 or devices[0].kind != "cuda":
        return None, "not on one GPU alone"
    if has_versions:
        return None, "kernels derive data from inputs on the host each run"
    return CudaGraphRuns(devices[0].device_id, run_plain, source), ""
