"""Dense, matmul and batch_matmul on the CPU as one candidate set (DENSE): OpenBLAS's call, GEMV
padding, the column split, a kept transposed weight, few rows on the OpenMP team, output tiles
and oneDNN's matmul, raced once per shape against one base."""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod
from typing import Any, Callable, Sequence

import numpy as np

from .... import settings
from ...._timing import Race, Source, Verdict, sampler
from ...library import InputVersion
from ...prepared import capabilities
from ...tunable import Candidate, TunableOp
from ...tuning import Choice, in_size_class_scope
from .. import replay
from ..threads import ONE_BLAS_THREAD
from .dense_tiles import SPREAD_FLOPS, DenseTiles, tilings, tiles
from .omp_team import wake_team
from .padded_gemv import PaddedGemv, padded_rows
from .split_dense import SplitDense, split_blocks
from .team_gemv import TeamGemv, applies as team_applies
from .transposed_dense import TransposedDense, transposes

PAUSE_S = 0.0005  # before a sample of a kernel timed as a graph holding OpenBLAS at one thread


@dataclass(frozen=True)
class DenseSpec:
    """out[b] (m x n) = op(a[b % a_batches]) @ op(b[b % b_batches]) (ops/linalg.py's Gemm), the
    arrays' shapes (inputs, then the output), and OpenBLAS's call for it (plain)."""

    batch: int
    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool
    a_batches: int
    b_batches: int
    dtype: str
    shapes: tuple[tuple[int, ...], ...]
    plain: Callable[[], Callable[..., None]]

    @property
    def weight(self) -> bool:
        """Whether this is x[m, k] @ w[n, k].T against a 2-D weight, dense's own strategies'
        form."""
        return (self.batch == 1 and self.trans_b and not self.trans_a
                and self.shapes[1] == (self.n, self.k))

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    def at(self, shapes: Sequence[tuple[int, ...]]) -> DenseSpec:
        """This product on arrays of other shapes (a, b, then whatever else its kernel reads,
        out last), with the same K and transposes: a 2-D weight's rows, else the batches."""
        a, b, out = (tuple(int(d) for d in shape) for shape in (shapes[0], shapes[1],
                                                                 shapes[-1]))
        if len(b) == 2 and self.batch == 1:
            m = a[-1] if self.trans_a else prod(a[:-1])
            lead = (m,) if self.trans_a else a[:-1]
            return replace(self, m=m, shapes=(a, b, lead + (self.n,)))
        return replace(self, batch=prod(out[:-2]), m=out[-2], n=out[-1],
                       a_batches=prod(a[:-2]), b_batches=prod(b[:-2]), shapes=(a, b, out))

    def key(self) -> str:
        from ..onednn.policy import mode_word
        return (f"{self.dtype} batch {self.batch} m {self.m} n {self.n} k {self.k} "
                f"trans_a {int(self.trans_a)} trans_b {int(self.trans_b)} a_batches "
                f"{self.a_batches} b_batches {self.b_batches} ({mode_word()}"
                f"{replay.timing_word()})")


def _tiled(s: DenseSpec) -> bool:
    # NOTE: where the tiles apply, the one tile on the caller ("whole") is OpenBLAS's call and
    # the transposed copy's rival; those two are offered only with the tiles off (or forced).
    return (s.weight and s.m > 1 and settings.word(settings.DENSE_TILES) != "off"
            and s.dtype in ("float32", "float64"))


def _onednn_applies(s: DenseSpec) -> bool:
    from ..onednn.matmul import matmul_applies
    return matmul_applies(s.dtype, s.batch, s.m, s.n, s.k)


def _items_apply(s: DenseSpec) -> bool:
    from ..onednn.matmul import MIN_SPLIT_FLOPS
    from ..onednn.policy import mode_word
    # NOTE: with OpenMP inside each primitive the one call is already spread over the cores
    # (onednn/choice.py says why items would then cost).
    return s.flops >= MIN_SPLIT_FLOPS and mode_word() == "workers" and _onednn_applies(s)


def _onednn(s: DenseSpec, split: bool) -> Any:
    from ..onednn.matmul import OnednnMatmul
    return OnednnMatmul(s.batch, s.m, s.n, s.k, s.trans_a, s.trans_b, s.a_batches, s.b_batches,
                        split=split)


def _tiles(name: str) -> Candidate[DenseSpec]:
    return Candidate(name, lambda s: DenseTiles(s.m, s.n, s.k, tiles(name, s.m, s.n)),
                     lambda s: _tiled(s) and name in tilings(s.m, s.n, s.k),
                     "plain" if name == "whole" else "spread")


# Every way to compute the product, each with the setting that forces or removes it (FAMILY).
DENSE: TunableOp[DenseSpec] = TunableOp(Choice("cpu.gemm", settings.ONEDNN), (
    Candidate("blas", lambda s: s.plain(), lambda s: not _tiled(s)),
    Candidate("padded", lambda s: PaddedGemv(s.k, s.n, padded_rows(s.k, s.n, s.dtype), s.dtype),
              lambda s: s.weight and s.m == 1 and padded_rows(s.k, s.n, s.dtype) > 0,
              "padded"),
    Candidate("split", lambda s: SplitDense(s.m, s.n, s.k, split_blocks(s.m, s.n, s.k, s.dtype)),
              lambda s: s.weight and split_blocks(s.m, s.n, s.k, s.dtype) > 0, "split"),
    Candidate("transposed", lambda s: TransposedDense(s.m, s.n, s.k, s.dtype),
              lambda s: s.weight and transposes(s.m, s.n, s.k, s.dtype)),
    Candidate("team", lambda s: TeamGemv(s.m, s.n, s.k),
              lambda s: s.weight and team_applies(s.m, s.n, s.dtype)),
    _tiles("whole"), _tiles("cols"), _tiles("rows"),
    Candidate("onednn", lambda s: _onednn(s, False), _onednn_applies, onednn=True),
    Candidate("onednn_items", lambda s: _onednn(s, True), _items_apply, "spread", onednn=True)))
TILINGS = ("whole", "cols", "rows")
# The setting of each candidate that has one: off removes it, on (or the tiling's name) makes
# it OpenBLAS's side's only candidate, still raced against oneDNN's.
FAMILY = {"padded": settings.GEMV_PADDING, "split": settings.DENSE_SPLIT,
          "team": settings.TEAM_GEMV,
          "transposed": settings.DENSE_TRANSPOSE,
          **{name: settings.DENSE_TILES for name in TILINGS}}
# whose forcing wins where several are forced (the order today's stages were asked in)
PRECEDENCE = ("padded", "split", "transposed", "team", *TILINGS)


def offered(spec: DenseSpec) -> list[str]:
    """The candidates that apply to spec and that the settings allow (FAMILY), in DENSE's
    order; GRAPH_RUNTIME_ONEDNN filters oneDNN's as for every tunable op."""
    names = [name for name in DENSE.offered(spec)
             if name not in FAMILY or settings.word(FAMILY[name]) != "off"]
    for name in PRECEDENCE:
        if name in names and settings.word(FAMILY[name]) in ("on", name):
            return [name] + [other for other in names if DENSE.candidate(other).onednn]
    if any(name in names for name in TILINGS):
        # the tiles stand for OpenBLAS's call (see _tiled); a transposed copy only when forced
        names = [name for name in names if name != "transposed"]
    if "padded" in names and _beside_openmp(names):
        # NOTE: GEMV padding threads OpenBLAS; beside oneDNN's OpenMP threads, which hold every
        # core, its threads and theirs spin against each other (raced so, oneDNN's 1x512x512
        # product, 26 us alone, took 1.3 ms after a threaded sample, and OpenBLAS's call on one
        # thread was kept: 85-94 us in a LLaMA decode step, where oneDNN's takes about 36)
        names = [name for name in names if name != "padded"]
    return names


def _beside_openmp(names: Sequence[str]) -> bool:
    """Whether oneDNN's products are offered and run on OpenMP threads over every core."""
    from ..onednn.policy import mode_word
    return any(DENSE.candidate(name).onednn for name in names) and mode_word() == "openmp"


def base(spec: DenseSpec, names: Sequence[str]) -> str:
    """The candidate kept unless another clearly gains what its kind asks: a product of few rows
    on the OpenMP team (team_gemv.py: at the memory's speed where oneDNN's reads its weight at
    one core's), else oneDNN's (in work items for large products), else the column tiles for
    large products, else one tile, else OpenBLAS's call."""
    large = spec.flops >= SPREAD_FLOPS
    order = ["team"] + (["onednn_items"] if large else []) + ["onednn"] + \
        (["cols"] if large else [])
    for name in order + ["whole", "blas"]:
        if name in names:
            return name
    return names[0]


def choose(spec: DenseSpec) -> str:
    """The candidate for spec: forced, the only one offered, or the tuning service's ("cpu.gemm":
    one race of every candidate offered, measured once per key)."""
    names = offered(spec)
    return DENSE.choose(names, "cpu", spec.key(), lambda race: _race(race, spec, names),
                        base(spec, names))


def dense_cpu(spec: DenseSpec) -> Callable[..., None]:
    """The kernel for spec (choose's candidate)."""
    name = choose(spec)
    made: Callable[..., None] = DENSE.build(name, spec)
    if DENSE.candidate(name).onednn and _reference(made):
        # NOTE: its reference code (remembered by another process's race, or forced): never
        # worth taking over OpenBLAS.
        return spec.plain()
    from ..onednn.matmul import OnednnMatmul
    if isinstance(made, OnednnMatmul) and made.any:
        made.chosen_at = lambda shapes: _chosen_at(spec, shapes, name)
    return made


def _chosen_at(spec: DenseSpec, shapes: Sequence[tuple[int, ...]], name: str) -> bool:
    """Whether choose() picks name for spec on arrays of these shapes: asked only where nothing
    is measured (a symbolic module's new shape, tuning.by_size_class), else no. The answer is
    kept for the build (settings.held): a decoder's layers ask it of the same product, and a
    stream's new shape asked it 29 times (3.5 ms of its 13 ms build)."""
    if not in_size_class_scope():
        return False
    key = ("dense chosen_at", name, spec.dtype, spec.n, spec.k, spec.trans_a, spec.trans_b,
           spec.batch, spec.a_batches, spec.b_batches,
           *(tuple(shapes[i]) for i in (0, 1, -1)))
    return settings.held_value(key, lambda: choose(spec.at(shapes)) == name)


def _reference(kernel: Any) -> bool:
    from ..onednn.choice import is_reference
    return is_reference(kernel)


def _race(race: Race, spec: DenseSpec, names: Sequence[str]) -> Verdict:
    """Every candidate timed on arrays of the real shapes as it runs in a graph: GEMV padding
    with OpenBLAS free to use its threads (8 calls a sample, the weight in its buffer), and the
    plain call it pads the same way where it is offered (a GEMV below OpenBLAS's threading
    threshold, one thread either way); every other with OpenBLAS at one thread, as a graph
    holding a kernel on the runtime's workers or oneDNN's runs (one call after a pause).
    oneDNN's reference code is not timed (never taken)."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(spec.dtype) for shape in spec.shapes]
    steady = InputVersion()  # constant weights, as params are: derived data made once
    sources: dict[str, Source] = {}
    skipped = []
    for name in names:
        kernel = DENSE.build(name, spec)
        if DENSE.candidate(name).onednn and _reference(kernel):
            skipped.append(name)
            continue
        made = capabilities(kernel)
        made.bind_versions({pos: steady for pos in made.cached_inputs()})
        threaded = name == "padded" or (name == "blas" and "padded" in names)
        sources[name] = _source(kernel, arrays, threaded)
    if not skipped:
        return race(sources)
    kept = race if race.base in sources else replace(race, base=base(spec, list(sources)))
    verdict = kept(sources) if len(sources) > 1 else kept.known({n: 1.0 for n in sources})
    rounds = verdict.rounds
    return Verdict(verdict.chosen, race.base,
                   {**verdict.samples, **{n: (float("inf"),) * rounds for n in skipped}},
                   verdict.outcome, verdict.busy)


def _source(kernel: Any, arrays: Sequence[np.ndarray], threaded: bool) -> Source:
    """kernel's timing source: threaded, 8 calls a sample with OpenBLAS's threads free (a
    PaddedGemv on its own buffer); else one call after a pause with OpenBLAS at one thread, as
    a replayed module would run it (kernels/replay.py)."""
    if threaded:
        args = list(arrays)
        if isinstance(kernel, PaddedGemv):
            np.copyto(kernel.weight, arrays[1].reshape(kernel.weight.shape))
            args[1] = kernel.weight
        return sampler(lambda: kernel(*args), number=8)
    replayed = replay.replayed_call(kernel, arrays)  # as a replayed module runs it
    timed = sampler(replayed if replayed is not None else (lambda: kernel(*arrays)),
                    pause_s=PAUSE_S, wake=wake_team)

    def held() -> float:
        with ONE_BLAS_THREAD:
            return timed()
    return held
