"""Where oneDNN kernels are offered to the CPU kernel choices (kept small until the tuning
service takes the choices over): the candidate names, and the setting that forces them."""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from ...._timing import fastest_by_median
from ...conv_params import ConvParams
from ...library import CachesInputs, InputVersion
from ..cpu.conv_epilogue import Epilogue
from ..cpu.threads import ONE_BLAS_THREAD
from . import binding


def onednn_forced() -> bool:
    """GRAPH_RUNTIME_ONEDNN=on: oneDNN wherever it applies, no timing; the library must load."""
    if binding.onednn_mode() != "on":
        return False
    binding.library()  # LibraryError with the reason when it cannot run
    return True


def onednn_conv_names(p: ConvParams, epilogue: Epilogue) -> list[str]:
    """["onednn"] where a oneDNN primitive computes this conv2d and its epilogue, else []."""
    from .conv import conv_applies
    if binding.onednn_mode() == "on":
        binding.library()
    return ["onednn"] if conv_applies(p, epilogue) else []


def onednn_conv(p: ConvParams, epilogue: Epilogue) -> Any:
    """The oneDNN conv2d kernel (imported on first use: loading the library costs ~50 ms)."""
    from .conv import OnednnConv
    return OnednnConv(p, epilogue)


ROUNDS = 9
MIN_SPEEDUP = 1.1  # what oneDNN must gain over today's kernel to be chosen
_chosen: dict[tuple, bool] = {}
_lock = threading.Lock()


def onednn_or(key: tuple, applies: bool, make_onednn: Callable[[], Callable[..., None]],
              make_other: Callable[[], Callable[..., None]],
              shapes: Sequence[tuple[int, ...]]) -> Callable[..., None]:
    """The oneDNN kernel or today's for one op shape: forced by GRAPH_RUNTIME_ONEDNN=on|off,
    else timed once per key for the process (float32 arrays of `shapes`: inputs, then outputs).
    """
    if not applies:
        if binding.onednn_mode() == "on":
            binding.library()
        return make_other()
    forced = onednn_forced()
    with _lock:
        verdict = _chosen.get((key, forced))
        if verdict is None:
            made = make_onednn()
            # NOTE: oneDNN's reference code (impl "ref:any") is its slow fallback for what no
            # JIT kernel covers (dilated pools, odd strides): never worth taking.
            if getattr(made, "impl", "").startswith("ref"):
                verdict = False
            elif forced:
                verdict = True
            else:
                # NOTE: the timed kernels derived data (packed weights) from made-up arrays
                # and are bound to a constant version: the graph gets a fresh one.
                verdict = _faster(made, make_other(), shapes)
            _chosen[(key, forced)] = verdict
            if verdict and forced:
                return made
    return make_onednn() if verdict else make_other()


def _faster(onednn: Callable[..., None], other: Callable[..., None],
            shapes: Sequence[tuple[int, ...]]) -> bool:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    steady = InputVersion()  # constant weights, as params are: derived data made once
    for kernel in (onednn, other):
        if isinstance(kernel, CachesInputs):
            kernel.bind_versions({pos: steady for pos in kernel.cached_inputs()})
    calls = {"onednn": lambda: onednn(*arrays), "other": lambda: other(*arrays)}
    # NOTE: timed with OpenBLAS at one thread, as a graph holding a oneDNN kernel runs (its
    # threads, spinning after a threaded call, stalled the next oneDNN call by milliseconds).
    with ONE_BLAS_THREAD:
        for call in calls.values():
            call()  # first calls compile, pack weights and fault pages in
        winner = fastest_by_median(calls, "other", ROUNDS, MIN_SPEEDUP, pause_s=0.0005)
    return winner == "onednn"
