"""Which CPU conv2d strategy runs a shape: the tuning service's choice (lib/tuning.py), or forced.

GRAPH_RUNTIME_CONV: auto (default: time every strategy that applies once per shape, keep the
fastest, remember it in the tuning cache), or one of im2col, im2col_rows (a batch-1 conv's output
rows split over the CPU workers), im2col_channels (its output channels split instead),
im2col_serial (images on this thread only), gemm1x1, gemm1x1_split (each image's 1x1 GEMM split
over the workers), depthwise (NumPy strided views), depthwise_jit (a compiled loop,
depthwise_jit.py), winograd (F(2x2,3x3)), winograd4 (F(4x4,3x3)), onednn (a oneDNN primitive:
kernels/onednn/conv.py) to force it wherever it applies (im2col elsewhere; it applies always).
GRAPH_RUNTIME_ONEDNN=on forces onednn wherever it applies; off never offers it.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace

import numpy as np

from .... import settings
from ...._timing import Race, Verdict, sampler
from ...conv_params import ConvParams
from .. import replay
from ...library import InputVersion
from ...tunable import Candidate, TunableOp
from ...tuning import Choice
from ..conv_kernel import ConvKernel
from .conv import DepthwiseConv, Gemm1x1Conv, Im2colChannelsConv, Im2colConv
from ..conv_epilogue import Epilogue
from .depthwise_jit import DepthwiseJitConv
from ..threads import ONE_BLAS_THREAD, num_threads
from .winograd import WinogradConv, winograd_applies
from ..onednn.choice import onednn_conv, timed_call
from .silu_pass import SiluBand
from ..onednn.policy import mode_word
from .omp_team import wake_team

PAUSE_S = 0.0005


@dataclass(frozen=True)
class ConvSpec:
    """What a strategy is chosen for: the conv's sizes and the epilogue it applies."""

    p: ConvParams
    epilogue: Epilogue


def _many_threads(s: ConvSpec) -> bool:
    return num_threads() > 1


def _few_images(s: ConvSpec) -> bool:
    return s.p.n < num_threads() and s.p.groups == 1


def _one_by_one(s: ConvSpec) -> bool:
    return s.p.kh == s.p.kw == 1 and s.p.strides == (1, 1) and not any(s.p.pad)


def _depthwise(s: ConvSpec) -> bool:
    return s.p.cg == 1 and s.p.groups > 1


def _winograd(s: ConvSpec) -> bool:
    return winograd_applies(s.p) and s.p.n > 0


def _onednn_applies(s: ConvSpec) -> bool:
    from ..onednn.conv import conv_applies
    return conv_applies(s.p, s.epilogue)


def _onednn_silu_last(s: ConvSpec) -> bool:
    """oneDNN's conv applies and its epilogue ends in silu (which the silu pass would take)."""
    return bool(s.epilogue.ops) and s.epilogue.ops[-1].kind == "silu" and _onednn_applies(s)


# The strategies (im2col computes every conv exactly; the rest where they apply), in the order
# they are raced; onednn, where it applies, is the base (see conv2d_cpu).
CONV2D: TunableOp[ConvSpec] = TunableOp(Choice("cpu.conv2d", settings.CONV), (
    Candidate("im2col", lambda s: Im2colConv(s.p, s.epilogue)),
    Candidate("im2col_rows", lambda s: Im2colConv(s.p, s.epilogue, split_rows=True),
              lambda s: s.p.n == 1 and s.p.oh > 1 and _many_threads(s), "spread"),
    Candidate("im2col_channels", lambda s: Im2colChannelsConv(s.p, s.epilogue),
              lambda s: _few_images(s) and s.p.o > 1, "spread"),
    # a busy machine's other cores may only stall the loop
    Candidate("im2col_serial", lambda s: Im2colConv(s.p, s.epilogue, serial=True),
              lambda s: s.p.n > 1 and _many_threads(s)),
    Candidate("gemm1x1", lambda s: Gemm1x1Conv(s.p, s.epilogue), _one_by_one),
    Candidate("gemm1x1_split", lambda s: Gemm1x1Conv(s.p, s.epilogue, split=True),
              lambda s: _one_by_one(s) and _few_images(s), "spread"),
    Candidate("depthwise", lambda s: DepthwiseConv(s.p, s.epilogue), _depthwise),
    Candidate("depthwise_jit", lambda s: DepthwiseJitConv(s.p, s.epilogue), _depthwise),
    Candidate("winograd", lambda s: WinogradConv(s.p, s.epilogue, 2), _winograd),
    Candidate("winograd4", lambda s: WinogradConv(s.p, s.epilogue, 4), _winograd),
    # a last silu as oneDNN's swish post-op, where the conv otherwise leaves it to the compiled
    # pass over its output (silu_pass.py): which is faster depends on the machine and the
    # threads (MobileViT on one thread of an Intel Xeon: 22.9 against 26.2 ms; on two OpenMP
    # threads alike; the pass was 2-2.5x faster on an AMD EPYC), so the two are raced. Before
    # onednn: GRAPH_RUNTIME_ONEDNN=on takes the last oneDNN candidate, the pass
    Candidate("onednn_swish", lambda s: onednn_conv(s.p, s.epilogue), _onednn_silu_last,
              onednn=True, otherwise="onednn"),  # forced: oneDNN for convs without a silu
    Candidate("onednn", lambda s: onednn_conv(s.p, s.epilogue, SiluBand), _onednn_applies,
              onednn=True),
), fallback="im2col")
# laid out alike: NHWC between oneDNN nodes (no reorders charged to them in the race)
ONEDNN_STRATEGIES = tuple(c.name for c in CONV2D.candidates if c.onednn)
STRATEGIES = settings.CONV.choices


def applicable(p: ConvParams) -> list[str]:
    """Strategies other than oneDNN's that compute this conv exactly (im2col always does)."""
    spec = ConvSpec(p, Epilogue((), (p.n, p.o, p.oh, p.ow)))
    return [c.name for c in CONV2D.candidates if not c.onednn and c.applies(spec)]


def candidates(p: ConvParams, epilogue: Epilogue) -> list[str]:
    """The strategies offered for p and its epilogue: applicable(p), plus onednn where a oneDNN
    primitive computes them and GRAPH_RUNTIME_ONEDNN allows it."""
    return CONV2D.offered(ConvSpec(p, epilogue))


def build(name: str, p: ConvParams, epilogue: Epilogue) -> ConvKernel:
    """The kernel of one named strategy (which must apply to p)."""
    kernel: ConvKernel = CONV2D.build(name, ConvSpec(p, epilogue))
    return kernel


def conv2d_cpu(p: ConvParams, epilogue: Epilogue, strategy: str | None = None) -> ConvKernel:
    """The conv2d kernel for p: strategy if given, else GRAPH_RUNTIME_CONV, else measured."""
    names = candidates(p, epilogue)
    if strategy is not None:
        return build(strategy if strategy in names else "im2col", p, epilogue)
    forced = CONV2D.forced(names)
    if forced is not None or len(names) == 1:
        return build(forced or names[0], p, epilogue)
    kinds = ",".join(op.kind for op in epilogue.ops) or "none"
    bias = " bias folded" if epilogue.channel_bias() is not None else ""
    # NOTE: whether oneDNN is offered is part of the key: it may be offered in one create() and
    # turned off (GRAPH_RUNTIME_ONEDNN=off) in the next, and each keeps its own entry.
    onednn = f" onednn(nhwc, {mode_word()}{replay.timing_word()})" if "onednn" in names \
        else ""
    key = f"{p.key()} epilogue {kinds}{bias}{onednn}"
    # The base stays unless another is clearly faster: on a busy machine a parallel candidate's
    # timing swings widely, and a lucky sample must not pick it. oneDNN's conv is the base where
    # it applies: timed alone, a conv is not charged for what its layout costs its neighbours
    # (one NCHW conv among oneDNN ones makes two reorders of its data), which favours the rest.
    base = "onednn" if "onednn" in names else (
        "im2col_serial" if "im2col_serial" in names else "im2col")
    chosen = CONV2D.choose(names, "cpu", key, lambda race: _race(race, p, epilogue, names), base)
    return build(chosen, p, epilogue)


def _race(race: Race, p: ConvParams, epilogue: Epilogue, names: list[str]) -> Verdict:
    """The strategies raced on arrays of the real shapes, one call a sample after a pause.

    oneDNN's conv is timed as it runs between oneDNN neighbours, channels-last (timed_call),
    and once more on NCHW arrays, with the reorders it then makes of its data and output. Every
    other strategy is charged that difference, round by round: among oneDNN convs it leaves
    both of its neighbours' entries NCHW, so they make those reorders instead.
    """
    rng = np.random.default_rng(0)
    data = rng.standard_normal((p.n, p.c, p.h, p.w)).astype(p.dtype)
    weight = rng.standard_normal((p.o, p.cg, p.kh, p.kw)).astype(p.dtype)
    extras = [rng.standard_normal(op.shape).astype(p.dtype)
              for op in sorted((o for o in epilogue.ops if o.kind == "add"),
                               key=lambda o: o.operand)]
    out = np.empty((p.n, p.o, p.oh, p.ow), p.dtype)
    kernels = {name: build(name, p, epilogue) for name in names}
    if "onednn" in kernels:
        kernels[_NCHW] = build("onednn", p, epilogue)
    steady = InputVersion()  # constant weights, as params are: derived weights made once
    for k in kernels.values():
        k.bind_versions({pos: steady for pos in k.cached_inputs()})
    args = [data, weight, *extras, out]
    calls = {name: (lambda k=k: k(*args)) if name == _NCHW else timed_call(k, args)
             for name, k in kernels.items()}
    # NOTE: in a graph other nodes run between two calls of this one, and helper threads have
    # gone to sleep; a pause before each timed call makes the timing include waking them.
    # NOTE: beside oneDNN, timed with OpenBLAS at one thread, as a graph holding a oneDNN
    # kernel runs: OpenBLAS's threads, spinning after a threaded im2col, stalled the OpenMP
    # threads of the next oneDNN call (MobileNetV2: 38 of its 54 convs went to NumPy so timed).
    with ONE_BLAS_THREAD if "onednn" in names else nullcontext():
        sources = {name: sampler(call, pause_s=PAUSE_S, wake=wake_team)
                   for name, call in calls.items()}
        return (replace(race, adjust=_charge_reorders) if _NCHW in calls else race)(sources)


def _charge_reorders(seconds: dict[str, float]) -> dict[str, float]:
    """One round's samples with the NCHW timing of oneDNN's conv turned into what its reorders
    cost, charged to every other strategy."""
    seconds = dict(seconds)
    reorders = max(0.0, seconds.pop(_NCHW) - seconds["onednn"])
    return {name: t if name in ONEDNN_STRATEGIES else t + reorders
            for name, t in seconds.items()}


_NCHW = "onednn on NCHW arrays"  # timed only to price the reorders (not a strategy)
