"""Where oneDNN kernels are offered to the CPU kernel choices: the conv strategy's candidate, and
oneDNN-or-today's choices for pools, matmuls and conv2d_transpose through the tuning service
(lib/tuning.py)."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .... import settings
from ...._timing import median_seconds
from ...conv_params import ConvParams
from ...library import InputVersion
from ...prepared import capabilities
from ...tuning import Choice
from ..cpu.conv_epilogue import Epilogue
from ..cpu.threads import ONE_BLAS_THREAD
from . import binding
from .policy import mode_word

ROUNDS = 9
PAUSE_S = 0.0005
MIN_SPEEDUP = 1.1  # what oneDNN must gain over today's kernel to be chosen


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


def onednn_or(op: str, key: str, applies: bool,
              make_onednn: Callable[[], Callable[..., None]],
              make_other: Callable[[], Callable[..., None]],
              shapes: Sequence[tuple[int, ...]]) -> Callable[..., None]:
    """The oneDNN kernel or today's for one op shape: forced by GRAPH_RUNTIME_ONEDNN=on|off,
    else the tuning service's choice "cpu.onednn_<op>" between "on" and "off" for key, measured
    once on float32 arrays of `shapes` (inputs, then outputs)."""
    if not applies:
        if binding.onednn_mode() == "on":
            binding.library()
        return make_other()
    made = make_onednn()
    if _reference(made):
        return make_other()
    if onednn_forced():
        return made
    timed = []

    def measure() -> Mapping[str, float]:
        timed.append(made)
        return _seconds(made, make_other(), shapes)

    choice = Choice(f"cpu.onednn_{op}", settings.ONEDNN)
    # timed channels-last (timed_call) where it can be, in this process's threading mode
    layout = "nhwc, " if capabilities(made).channels_last_positions() else ""
    key += f" ({layout}{mode_word()})"
    # NOTE: with OpenMP inside oneDNN's primitives, oneDNN is the base: today's kernels run on
    # the runtime's workers, which then share the cores with OpenMP threads still spinning
    # after the previous primitive, a cost a kernel timed alone does not show (ConvNeXt-tiny:
    # 62 ms with the choices so timed, 30 ms with oneDNN's matmuls throughout).
    base = "on" if mode_word() == "openmp" else "off"
    chosen = choice.choose("cpu", key, ("off", "on"), measure, base, MIN_SPEEDUP)
    if chosen == "off":
        return make_other()
    # NOTE: a timed kernel derived data (packed weights) from made-up arrays and was bound to a
    # constant version: the graph gets a fresh one.
    return make_onednn() if timed else made


def _reference(kernel: Any) -> bool:
    """Whether oneDNN picked its reference code (impl "ref:any", or "conv:any+ref:any" for a
    deconvolution over a reference convolution): its slow fallback for what no JIT kernel
    covers (dilated pools, odd strides), never worth taking."""
    impl = str(getattr(kernel, "impl", ""))
    return any(part.startswith("ref") for part in impl.split("+"))


def timed_call(kernel: Any, args: Sequence[np.ndarray]) -> Callable[[], None]:
    """A call of kernel on args, for timing. A kernel that can take channels-last arrays (a
    oneDNN conv or pool) is timed on them, as it runs between oneDNN neighbours
    (runtime/layouts.py): timed with the reorders it makes on NCHW arrays, oneDNN's conv lost
    to im2col on most shapes where it wins inside a conv net."""
    positions = set(capabilities(kernel).channels_last_positions())
    if positions:
        capabilities(kernel).use_channels_last(positions)
        args = [np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
                if i in positions else a for i, a in enumerate(args)]
    return lambda: kernel(*args)


def _seconds(onednn: Callable[..., None], other: Callable[..., None],
             shapes: Sequence[tuple[int, ...]]) -> Mapping[str, float]:
    """Both kernels' median times on arrays of the real shapes."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    steady = InputVersion()  # constant weights, as params are: derived data made once
    for kernel in (onednn, other):
        made = capabilities(kernel)
        made.bind_versions({pos: steady for pos in made.cached_inputs()})
    calls = {"on": timed_call(onednn, arrays), "off": timed_call(other, arrays)}
    # NOTE: timed with OpenBLAS at one thread, as a graph holding a oneDNN kernel runs (its
    # threads, spinning after a threaded call, stalled the next oneDNN call by milliseconds).
    with ONE_BLAS_THREAD:
        for call in calls.values():
            call()  # first calls compile, pack weights and fault pages in
        return median_seconds(calls, ROUNDS, pause_s=PAUSE_S)
