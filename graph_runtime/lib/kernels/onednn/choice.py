"""Where oneDNN kernels are offered to the CPU kernel choices: the conv strategy's candidate, and
oneDNN-or-today's candidate sets for pools and conv2d_transpose through the tuning service
(lib/tuning.py); the matmul is a candidate of dense's one set (cpu/dense_choice.py)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .... import settings
from ...._timing import Race, Verdict, sampler
from ...conv_params import ConvParams
from ...library import InputVersion
from ...prepared import capabilities
from ...tunable import Candidate, TunableOp
from ...tuning import Choice
from .. import replay
from ..conv_epilogue import Epilogue
from ..threads import ONE_BLAS_THREAD
from .policy import mode_word

PAUSE_S = 0.0005


def onednn_conv(p: ConvParams, epilogue: Epilogue, silu_pass: Any = None) -> Any:
    """The oneDNN conv2d kernel (imported on first use: loading the library costs ~50 ms);
    silu_pass: conv.py's SiluPass for a last silu."""
    from .conv import OnednnConv
    return OnednnConv(p, epilogue, silu_pass)


Make = Callable[[], Callable[..., None]]


@dataclass(frozen=True)
class OnednnOr:
    """One op shape oneDNN may serve: whether it applies, and how each candidate is made."""

    applies: bool
    onednn: Make
    other: Make
    split: Make | None


def _split_offered(s: OnednnOr) -> bool:
    # NOTE: with OpenMP inside each primitive (policy.py) the one call is already spread over
    # the cores; splitting it into single-threaded items would change the calling thread's
    # OpenMP count back and forth (6-7 ms each time).
    return s.applies and s.split is not None and mode_word() == "workers"


# today's kernel, the oneDNN one, and the oneDNN one in work items for the runtime's workers
CANDIDATES: tuple[Candidate[OnednnOr], ...] = (
    Candidate("off", lambda s: s.other()),
    Candidate("on", lambda s: s.onednn(), lambda s: s.applies, onednn=True),
    Candidate("split", lambda s: s.split() if s.split else None, _split_offered, "spread",
              onednn=True),
)


@functools.cache
def _tunable(op: str) -> TunableOp[OnednnOr]:
    return TunableOp(Choice(f"cpu.onednn_{op}", settings.ONEDNN), CANDIDATES)


def onednn_or(op: str, key: str, applies: bool, make_onednn: Make, make_other: Make,
              shapes: Sequence[tuple[int, ...]], make_split: Make | None = None,
              base: str = "off") -> Callable[..., None]:
    """The oneDNN kernel or today's for one op shape: forced by GRAPH_RUNTIME_ONEDNN=on|off,
    else the tuning service's choice "cpu.onednn_<op>" between "on" and "off" (and "split",
    the oneDNN kernel in work items for the workers, when make_split is given) for key,
    measured once on float32 arrays of `shapes` (inputs, then outputs). The base candidate is
    kept unless another clearly gains what the speedup rule asks (_timing.min_speedup)."""
    spec = OnednnOr(applies, make_onednn, make_other, make_split)
    tunable = _tunable(op)
    names = tunable.offered(spec)
    if names == ["off"]:
        return make_other()

    def measure(race: Race) -> Verdict:
        kernels = {name: tunable.build(name, spec) for name in names if name != "off"}
        if is_reference(kernels["on"]):
            return race.known({name: 1.0 if name == "off" else float("inf") for name in names})
        return _race(race, kernels, make_other(), shapes)

    # NOTE: with OpenMP inside oneDNN's primitives, oneDNN is the base: today's kernels run on
    # the runtime's workers, which then share the cores with OpenMP threads still spinning
    # after the previous primitive, a cost a kernel timed alone does not show (ConvNeXt-tiny:
    # 62 ms with the choices so timed, 30 ms with oneDNN's matmuls throughout).
    if mode_word() == "openmp" and base == "off":
        base = "on"
    if base not in names:
        base = "on"
    # timed channels-last where the kernel can be (timed_call), in this process's mode
    chosen = tunable.choose(names, "cpu", f"{key} ({mode_word()}{replay.timing_word()})",
                            measure, base)
    if chosen == "off":
        return make_other()
    # NOTE: a timed kernel derived data (packed weights) from made-up arrays and was bound to a
    # constant version: the graph gets a fresh one (made, like every oneDNN kernel here, only
    # when it is first used, so that one passed over costs nothing).
    made = tunable.build(chosen, spec)
    return make_other() if is_reference(made) else made


# oneDNN's integer kernel where it applies, else the exact reference (float64 products)
INT8_CANDIDATES: tuple[Candidate[OnednnOr], ...] = (
    Candidate("onednn", lambda s: s.onednn(), lambda s: s.applies, onednn=True),
    Candidate("reference", lambda s: s.other()),
)


@functools.cache
def _int8_tunable(op: str) -> TunableOp[OnednnOr]:
    return TunableOp(Choice(f"cpu.int8_{op}", settings.ONEDNN), INT8_CANDIDATES)


def onednn_int8_or(op: str, applies: bool, make_onednn: Make,
                   make_reference: Make) -> Callable[..., None]:
    """oneDNN's int8 kernel for one op shape where it applies and GRAPH_RUNTIME_ONEDNN allows
    it (on: the library must load), else the reference. Not measured: the reference computes
    exact float64 products, never a rival worth a race at create()."""
    spec = OnednnOr(applies, make_onednn, make_reference, None)
    tunable = _int8_tunable(op)
    made: Callable[..., None] = tunable.build(tunable.first(tunable.offered(spec)), spec)
    return made


def is_reference(kernel: Any) -> bool:
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
    # a kernel whose calls a replayed module replays (kernels/replay.py) is timed so, as it
    # runs there: without the interpreter's few microseconds around each foreign call
    replayed = replay.replayed_call(kernel, args)
    return replayed if replayed is not None else (lambda: kernel(*args))


def _race(race: Race, onednn: Mapping[str, Callable[..., None]], other: Callable[..., None],
          shapes: Sequence[tuple[int, ...]]) -> Verdict:
    """The kernels raced on arrays of the real shapes (oneDNN's by variant name), one call a
    sample after a pause (a kernel a replay would run, as replayed: timed_call)."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    steady = InputVersion()  # constant weights, as params are: derived data made once
    kernels = {**onednn, "off": other}
    for kernel in kernels.values():
        made = capabilities(kernel)
        made.bind_versions({pos: steady for pos in made.cached_inputs()})
    calls = {name: timed_call(kernel, arrays) for name, kernel in kernels.items()}
    # NOTE: timed with OpenBLAS at one thread, as a graph holding a oneDNN kernel runs (its
    # threads, spinning after a threaded call, stalled the next oneDNN call by milliseconds).
    with ONE_BLAS_THREAD:
        return race({name: sampler(call, pause_s=PAUSE_S) for name, call in calls.items()})
