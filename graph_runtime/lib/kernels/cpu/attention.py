"""Multi-head attention on the CPU: strided head views into BLAS, one compiled softmax pass.

q, k and v are (batch, tokens, width) arrays whose columns [offset, offset + heads * head_dim)
hold the heads side by side, as the projections (or one packed QKV GEMM) wrote them. Each
head is a strided view of them, never a transposed copy: NumPy's matmul hands every (tokens x
head_dim) view to BLAS with its row stride, the scores land in one workspace, a compiled pass
applies scale, additive mask and softmax (and zeroes NaN rows when the model did) row by row in
cache, and the second matmul writes each head's columns of the output directly. With products
"onednn" the two products are oneDNN matmuls over the same strided views instead
(onednn/attention_products.py; the tuning service picks per shape, ops/attention.py). Large
ones go to the runtime's workers in blocks of heads, or of query rows when the heads are few
(threads.py), each on one BLAS (or oneDNN, for blocks of whole heads) thread, where that
measured faster once per shape (the tuning service; GRAPH_RUNTIME_ATTENTION_SPLIT forces it);
oneDNN with OpenMP threads inside makes one call. Grouped-query attention (kv_heads below heads)
reads each kv head once per group of query heads: matmul broadcasts it over the group in one
call, or a block of heads is done one group at a time; nothing is repeated in memory.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from numba import carray

from .... import settings
from ...._timing import Race, Verdict, sampler
from ...prepared import PreparedKernel
from ...tunable import Candidate, TunableOp
from ...tuning import Choice
from . import jit_setup
from .block_site import DimsMemo, float32_dims
from .loops_jit import compiled, inlined, lane_dot
from .. import replay
from .omp_team import (block, float32_at, float_bits, my_rows, recording_here, run_here,
                       run_on_team, team_arrays, team_kernel)
from .rows_jit import OtherPath, _exp_sum32, _exp_sum32_wide, on_team, softmax_row
from .vector_width import wide_rows, wide_vectors
from ..heads import head_view
from ..threads import ONE_BLAS_THREAD, num_threads, parallel_images

# one call over every head, or blocks of heads (or query rows) on the workers
SPLIT: TunableOp[None] = TunableOp(Choice("cpu.attention_split", settings.ATTENTION_SPLIT),
                                   (Candidate("off"), Candidate("on", kind="spread")))
PARALLEL_FLOPS = 4e6  # both products of every head: below this one call does all heads
# From this many scores a call on one thread scales, masks and normalises them in oneDNN's
# products and softmax primitive rather than the compiled pass; one call, one thread, two
# processes each: MobileViT's 16 heads of 256 by 256 1.35-1.42 against 1.66-1.68 ms, 16 of 64
# by 64 141 against 179-184 us, BERT-base's 12 of 128 by 128 masked 619-647 against 745-750
# us; 16 of 16 by 16 and 2 of 32 by 32 alike either way (docs/measurements.md)
ONEDNN_SOFTMAX_SCORES = 32768
SPREAD_WORK = 4e7

Block = tuple[int, int, int, int, int]  # batch, first and last head, first and last query


def _blocks(batch: int, heads: int, q_len: int, workers: int) -> list[Block]:
    """About four items per worker over every (batch, head) and query: blocks of whole heads
    (which oneDNN's products can take) while there are at least as many heads as workers, else
    each head's queries cut in row blocks."""
    units, count = batch * heads, 4 * workers
    if units >= workers:
        count = min(units, count)
        per_batch = max(1, -(-count // batch))
        step = -(-heads // min(heads, per_batch))
        return [(b, h, min(heads, h + step), 0, q_len) for b in range(batch)
                for h in range(0, heads, step)]
    rows = max(1, -(-q_len // -(-count // units)))
    return [(b, h, h + 1, q, min(q_len, q + rows)) for b in range(batch) for h in range(heads)
            for q in range(0, q_len, rows)]


# NOTE: softmax_row is inlined from rows_jit.py: jit_cache.py keys this function's disk cache by
# that file (and fast_math.py) too, so an edit there recompiles it.
@inlined
def _masked_softmax_row(row: Any, mrow: Any, scale: Any, one: Any, nan_to_zero: bool,
                        has_mask: bool, exp_sum32: Any) -> None:
    """row = softmax(row * scale + mrow) in place (mrow read only with has_mask); exp_sum32 as
    softmax_row's.

    As NumPy's softmax: a NaN, or a row masked everywhere (-inf - -inf), gives a NaN row;
    nan_to_zero then zeroes NaNs, as the exporters' where(isnan(p), 0, p) does. Without a
    mask a positive scale is applied inside the exp (softmax_row), saving a pass.
    """
    if not has_mask and scale > 0:
        softmax_row(row, nan_to_zero, scale, exp_sum32)
        return
    if has_mask:
        for j in range(row.shape[0]):
            row[j] = row[j] * scale + mrow[j]
    else:
        for j in range(row.shape[0]):
            row[j] = row[j] * scale
    softmax_row(row, nan_to_zero, one, exp_sum32)


@inlined
def _scale_mask_softmax_with(s: Any, mask: Any, b0: int, h0: int, q0: int, scale: Any,
                             one: Any, nan_to_zero: bool, has_mask: bool,
                             exp_sum32: Any) -> None:
    nb, nh, nq, _ = s.shape
    mb, mh, mq = mask.shape[0], mask.shape[1], mask.shape[2]
    for b in range(nb):
        for h in range(nh):
            for i in range(nq):
                mrow = mask[b0 + b if mb > 1 else 0, h0 + h if mh > 1 else 0,
                            q0 + i if mq > 1 else 0]
                _masked_softmax_row(s[b, h, i], mrow, scale, one, nan_to_zero, has_mask,
                                    exp_sum32)


@compiled
def _scale_mask_softmax(s: Any, mask: Any, b0: int, h0: int, q0: int, scale: Any, one: Any,
                        nan_to_zero: bool, has_mask: bool) -> None:
    """s[b, h, i, :] = softmax(s * scale + mask[b0 + b, h0 + h, q0 + i, :]) in place, the
    scores of the block at (b0, h0, q0); mask's first three dims of 1 broadcast (its rows are
    read as they are: a C-contiguous mask's vectorize, where a broadcast view's strided rows
    took GPT-2-tiny's masked softmax from 7.5 to 10.4 us); scale and one of s's type (a
    float64 one would widen float32 arithmetic)."""
    _scale_mask_softmax_with(s, mask, b0, h0, q0, scale, one, nan_to_zero, has_mask,
                             _exp_sum32)


@compiled
def _scale_mask_softmax_wide(s: Any, mask: Any, b0: int, h0: int, q0: int, scale: Any,
                             one: Any, nan_to_zero: bool, has_mask: bool) -> None:
    """_scale_mask_softmax in 512-bit vectors (for long rows: vector_width.wide_rows)."""
    wide_vectors()
    _scale_mask_softmax_with(s, mask, b0, h0, q0, scale, one, nan_to_zero, has_mask,
                             _exp_sum32_wide)


@inlined
def _scale_mask_softmax_on_team(data: Any, exp_sum32: Any) -> None:
    b = carray(data, (11,), np.int64)
    nb, nh, nq, nk = b[1], b[2], b[3], b[4]
    mb, mh, mq = b[6], b[7], b[8]
    s = float32_at(b[0], (nb * nh * nq, nk))
    has_mask = b[5] != 0
    mask = float32_at(b[5], (mb * mh * mq, nk))
    scale = np.float32(b[9:10].view(np.float64)[0])
    lo, hi = my_rows(nb * nh * nq)
    for r in range(lo, hi):
        i, h, n = r % nq, r // nq % nh, r // (nh * nq)
        m = ((n if mb > 1 else 0) * mh + (h if mh > 1 else 0)) * mq + (i if mq > 1 else 0)
        _masked_softmax_row(s[r], mask[m if has_mask else 0], scale, np.float32(1),
                            b[10] != 0, has_mask, exp_sum32)


@team_kernel
def _scale_mask_softmax_team(data: Any) -> None:
    """_scale_mask_softmax's rows on oneDNN's OpenMP team (omp_team.py), float32: the block
    holds the scores and their four dims, the mask (0 without one) and its first three dims (1
    where it broadcasts; its last is the scores'), the scale's bits and nan_to_zero."""
    _scale_mask_softmax_on_team(data, _exp_sum32)


@team_kernel
def _scale_mask_softmax_team_wide(data: Any) -> None:
    """_scale_mask_softmax_team in 512-bit vectors (for long rows)."""
    wide_vectors()
    _scale_mask_softmax_on_team(data, _exp_sum32_wide)


@compiled
def _few_queries(q: Any, k: Any, v: Any, mask: Any, out: Any, q_offset: int, heads: int,
                 scale: Any, one: Any, nan_to_zero: bool, has_mask: bool) -> None:
    """out[b, i, head h] = softmax(q[b, i, head h] . k[b, g] * scale + mask[b, h, i]) . v[b, g]
    with g = h // (heads // kv_heads), row by row in one pass. q and out are the arrays as
    given, in token layout (batch, queries, width): head h is columns [q_offset + h * head_dim,
    ...) of q and [h * head_dim, ...) of out, read through slices (no head views made per call);
    k and v (batch, kv_heads, tokens, head_dim); mask 4-D, each of its first three dims 1 or
    full (read as broadcast), its last the tokens."""
    nb, nq = out.shape[0], out.shape[1]
    nd = k.shape[3]
    group = heads // k.shape[1]
    nk = k.shape[2]
    mb, mh, mq = mask.shape[0] > 1, mask.shape[1] > 1, mask.shape[2] > 1
    zero = one - one
    s = np.empty(nk, q.dtype)
    acc = np.empty(nd, q.dtype)
    for b in range(nb):
        for h in range(heads):
            g = h // group
            for i in range(nq):
                qi = q[b, i, q_offset + h * nd:q_offset + (h + 1) * nd]
                for j in range(nk):
                    s[j] = lane_dot(qi, k[b, g, j], zero)
                _masked_softmax_row(s, mask[b if mb else 0, h if mh else 0, i if mq else 0],
                                    scale, one, nan_to_zero, has_mask, _exp_sum32)
                acc[:] = zero
                for j in range(nk):
                    p = s[j]
                    vj = v[b, g, j]
                    for d in range(nd):
                        acc[d] += p * vj[d]
                o = out[b, i, h * nd:(h + 1) * nd]
                for d in range(nd):
                    o[d] = acc[d]


# few_queries_team's block: q, k, v, the mask and out, each as its address and its dims
# (FEW_RANKS), then the scale's bits, q's first column, the heads, nan_to_zero, has_mask
FEW_RANKS = (3, 4, 4, 4, 3)
FEW_BLOCK = len(FEW_RANKS) + sum(FEW_RANKS) + 5


@team_kernel
def few_queries_team(data: Any) -> None:
    """_few_queries on the block (FEW_BLOCK), float32, by the calling thread: the same pass on
    the same arrays, each seen at its own address and dims."""
    b = carray(data, (FEW_BLOCK,), np.int64)
    q = float32_at(b[0], (b[1], b[2], b[3]))
    k = float32_at(b[4], (b[5], b[6], b[7], b[8]))
    v = float32_at(b[9], (b[10], b[11], b[12], b[13]))
    mask = float32_at(b[14], (b[15], b[16], b[17], b[18]))
    out = float32_at(b[19], (b[20], b[21], b[22]))
    scale = np.float32(b[23:24].view(np.float64)[0])
    _few_queries(q, k, v, mask, out, b[24], b[25], scale, np.float32(1), b[26] != 0,
                 b[27] != 0)


class FewQueryAttention(PreparedKernel):
    """run(q, k, v, [mask,] out) for a few query rows (a decode step's one token), any shape:
    one compiled pass per query row and head (scores, softmax and the weighted sum of v in
    cache), no workspace, nothing sized at prepare. In a LLaMA-style decode step (8 heads of
    64 over 2 kv heads, 71 past tokens) it took 21-33 us a layer where OpenBLAS's two products
    and the team's softmax pass took 44 (9 us alone: between the dense products they pay for
    the hand-offs), and a new past length makes nothing. The shapes are checked by whoever
    calls it (ops/attention.py's AttentionByShape checks each new one as prepare() does)."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int,
                 offsets: tuple[int, int, int], scale: float, nan_to_zero: bool,
                 has_mask: bool, dtype: str) -> None:
        jit_setup.start()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.offsets, self.nan_to_zero, self.has_mask = offsets, nan_to_zero, has_mask
        self.typed_scale, self.one = np.dtype(dtype).type(scale), np.dtype(dtype).type(1)
        self.zero_mask = np.zeros((1, 1, 1, 1), dtype)
        self._block_tail = [float_bits(float(self.typed_scale)), offsets[0], heads,
                            int(nan_to_zero), int(has_mask)]  # (block_values)

    def any_shape(self) -> bool:
        return True

    def __call__(self, *arrays: Any) -> None:
        # NOTE: nothing is kept between calls: one kernel serves a decoder's every layer (the
        # KernelCache shares it), so views kept per call missed, and views kept per array set
        # held the arrays (a dropped shape's KV cache) alive. q and out go in as given; k and
        # v are views only in token layout (a KV cache's own layout is taken as it is).
        q, k, v, *rest = arrays
        out = rest[-1]
        kh = head_view(k, self.offsets[1], self.kv_heads, self.head_dim)
        vh = head_view(v, self.offsets[2], self.kv_heads, self.head_dim)
        mask = rest[0] if self.has_mask else self.zero_mask  # read only with has_mask
        if self.has_mask and (mask.ndim != 4 or mask.shape[-1] != kh.shape[2]):
            mask = np.broadcast_to(mask, (out.shape[0], self.heads, out.shape[1],
                                          kh.shape[2]))
        _few_queries(q, kh, vh, mask, out, self.offsets[0], self.heads, self.typed_scale,
                     self.one, self.nan_to_zero, self.has_mask)

    def block_values(self, arrays: Sequence[Any], memo: DimsMemo | None = None
                     ) -> list[int] | None:
        """few_queries_team's block for a call's arrays (q, k, v, [mask,] out), each with its
        own dims: where __call__ would pass them to _few_queries as they are (C-contiguous
        float32, k and v in the KV cache's layout, a mask 4-D over the tokens), else None.
        memo: the calling site's (float32_dims; this kernel serves every layer's site)."""
        if len(arrays) != 4 + self.has_mask:
            return None
        q, k, v, *rest = arrays
        mask = rest[0] if self.has_mask else self.zero_mask
        values = float32_dims((q, k, v, mask, rest[-1]), FEW_RANKS, memo)
        if values is None or (self.has_mask and mask.shape[3] != k.shape[2]):
            return None
        return values + self._block_tail


def _groups(h0: int, h1: int, group: int) -> list[tuple[int, int]]:
    """Heads [h0, h1) cut where the kv head they read changes (every group heads); whole
    without groups."""
    if group == 1:
        return [(h0, h1)]
    return [(lo, min(h1, (lo // group + 1) * group))
            for lo in [h0] + list(range((h0 // group + 1) * group, h1, group))]


def _openmp() -> bool:
    """Whether oneDNN runs OpenMP threads inside each primitive in this process."""
    from ..onednn.policy import policy
    return policy().openmp > 1


class ViewsOf:
    """The arrays of an attention's last call at one call site, their views and oneDNN's
    products bound to them, and the team's block over them (AttentionKernel._views)."""

    def __init__(self) -> None:
        self.arrays: tuple[Any, ...] | None = None
        self.views: tuple[Any, ...] = ()
        self.blocks: list[Block] | None = None
        self.team_block: Any = None


class AttentionKernel(PreparedKernel):
    """run(q, k, v, [mask,] out) with out (batch, q_len, heads * head_dim); the scores of every
    head live in one workspace made at prepare time."""

    def __init__(self, batch: int, heads: int, q_len: int, k_len: int, head_dim: int,
                 offsets: tuple[int, int, int], scale: float, nan_to_zero: bool,
                 mask_shape: tuple[int, ...] | None, dtype: str, products: str = "blas",
                 shapes: tuple[tuple[int, ...], ...] = (), kv_heads: int = 0) -> None:
        jit_setup.start()
        self.batch, self.heads, self.q_len, self.head_dim = batch, heads, q_len, head_dim
        self.kv_heads = kv_heads or heads
        self.products = products
        self.shapes = shapes  # q's, k's and v's, for the oneDNN descriptors
        self._made: dict[tuple[Block, ...], Any] = {}  # blocks -> HeadProducts
        self.offsets, self.scale, self.nan_to_zero = offsets, scale, nan_to_zero
        self.typed_scale, self.one = np.dtype(dtype).type(scale), np.dtype(dtype).type(1)
        self.has_mask, self.mask_shape = mask_shape is not None, mask_shape
        self.full = (batch, heads, q_len, k_len)
        self.scores = np.empty(self.full, dtype)
        self.no_mask = np.zeros((1, 1, 1, k_len), dtype)  # read by no row (has_mask)
        self._views_of = ViewsOf()  # the views of its calls' arrays (see call_site)
        # (batch, first head, last head, first query, last query) per worker item: about four
        # items per worker where the heads' work pays for the hand-off, else one call over every
        # head. Fewer heads than items (SegFormer's 1 head of 16,384 queries by 256 keys) are
        # cut into blocks of query rows: 2.7 against 4.2 ms for one call, whose softmax pass
        # runs on one thread while OpenBLAS's spinning helper holds the other core.
        self.workers = num_threads()
        self.blocks = [(0, 0, heads, 0, q_len)]
        work = 4.0 * batch * heads * q_len * k_len * head_dim
        # oneDNN's own OpenMP threads share one call's heads (unless blocks are forced)
        openmp = products == "onednn" and _openmp() and \
            settings.word(settings.ATTENTION_SPLIT) == "auto"
        # the compiled pass on oneDNN's OpenMP team where one call does every head and the
        # scores are many enough (on this thread alone it took 1.6 of a LLaMA attention's 3.3 ms
        # at (4, 194)); it reads a mask of the scores' last dim only
        self.team = dtype == "float32" and on_team(batch * heads * q_len, k_len) and (
            mask_shape is None or mask_shape[-1] == k_len)
        # else the softmax on oneDNN's OpenMP threads too (a compiled pass off the team runs on
        # one core; the runtime's workers beside those threads spin against them). The team's
        # pass beat oneDNN's softmax primitive (scale and mask as qk's post-ops) wherever it
        # runs: MobileViT's 16 heads of 256 by 256 1.32 against 1.65 ms a call, BERT-base's 12
        # of 128 by 128 masked 0.38 against 0.42 (docs/measurements.md). NaN rows made zero
        # stay with the compiled pass. Without OpenMP (the workers' mode, one CPU) from
        # ONEDNN_SOFTMAX_SCORES scores on too, in one call or in each block of heads on the
        # workers: the scale as q's and the softmax primitive beat the compiled pass there
        self.softmax_on_onednn = products == "onednn" and not nan_to_zero and \
            dtype == "float32" and ((openmp and not self.team) or (
                not openmp and batch * heads * q_len * k_len >= ONEDNN_SOFTMAX_SCORES))
        # the pass's loops 16 lanes wide for long rows (vector_width.py)
        self._pass, self._pass_team = (_scale_mask_softmax_wide, _scale_mask_softmax_team_wide) \
            if wide_rows(k_len) else (_scale_mask_softmax, _scale_mask_softmax_team)
        self._ahead = OtherPath(self._pass_team, self._pass)
        if self.workers > 1 and work >= PARALLEL_FLOPS and (batch * heads > 1 or q_len > 1) \
                and not openmp:
            split = _blocks(batch, heads, q_len, self.workers)
            key = (f"{dtype} {batch}x{heads} heads of {q_len}x{head_dim} by {k_len} tokens"
                   f"{' masked' if self.has_mask else ''} in {len(split)} blocks"
                   f"{' (onednn products)' if products == 'onednn' else ''}"
                   # the blocks and one call race otherwise with oneDNN's softmax than with
                   # the compiled pass: a choice measured with the pass is not taken for it
                   f"{' softmax on onednn' if self.softmax_on_onednn else ''}")
            # as dense_tiles.SPREAD_FLOPS: large ones (BERT-base's 12 heads of 128 tokens: 0.41
            # against 0.64 ms on one call) keep the blocks unless one call is clearly faster, so
            # one measurement on a busy machine does not pin them to one core
            spread = work >= SPREAD_WORK
            if SPLIT.choose(("off", "on"), "cpu", key, lambda race: self._race(race, split),
                            "on" if spread else "off") == "on":
                self.blocks = split

    def _race(self, race: Race, split: list[Block]) -> Verdict:
        """One call over every head against the blocks on the workers, on random inputs of the
        real shapes with OpenBLAS at one thread, interleaved."""
        rng = np.random.default_rng(0)
        batch, heads, q_len, k_len = self.full
        width = max(self.offsets) + heads * self.head_dim  # q's heads are the widest
        shapes = self.shapes or ((batch, q_len, width), (batch, k_len, width),
                                 (batch, k_len, width))
        dtype = self.scores.dtype
        q, k, v = (rng.standard_normal(shape).astype(dtype) for shape in shapes)
        extra = [np.zeros(self.full, dtype)] if self.has_mask else []
        out = np.empty((batch, q_len, heads * self.head_dim), dtype)

        def using(blocks: list[Block]) -> Callable[[], None]:
            def call() -> None:
                self.blocks = blocks
                self(q, k, v, *extra, out)
            return call

        try:
            with ONE_BLAS_THREAD:
                return race({"off": sampler(using([(0, 0, heads, 0, q_len)])),
                             "on": sampler(using(split))})  # as dense_tiles measures
        finally:
            self.blocks = [(0, 0, heads, 0, q_len)]

    @property
    def impl(self) -> str:
        """oneDNN's implementations of the two products, or "" where OpenBLAS does them."""
        products = self._products_for(self.blocks) if self.products == "onednn" else None
        return "" if products is None else str(products.impl)

    def _products_for(self, blocks: list[Block]) -> Any:
        """The oneDNN products for these blocks of whole heads (made on first need); None for
        blocks of query rows, which OpenBLAS does."""
        batch, heads, q_len, k_len = self.full
        group = heads // self.kv_heads
        if any((q0, q1) != (0, q_len) or h0 % group or h1 % group
               for _, h0, h1, q0, q1 in blocks):
            return None
        key = tuple(blocks)
        made = self._made.get(key)
        if made is None:
            from ..onednn.attention_products import HeadProducts
            pieces = [(0, batch, 0, heads)] if len(blocks) == 1 else \
                [(b, b + 1, h0, h1) for b, h0, h1, _, _ in blocks]
            made = self._made[key] = HeadProducts(
                batch, heads, q_len, k_len, self.head_dim, self.shapes, self.offsets, pieces,
                self.kv_heads, (self.scale, self.mask_shape) if self.softmax_on_onednn else None)
        return made

    def workspace_bytes(self) -> int:
        return int(self.scores.nbytes)

    def uses_workers(self) -> bool:
        # Split blocks go to the workers; whole heads on oneDNN's products run on its OpenMP
        # threads, which a threaded OpenBLAS call (a decode step's GEMVs) leaves spinning
        # beside: a LLaMA decode step took 68 ms with OpenBLAS threaded, 29 ms held at one.
        return len(self.blocks) > 1 or self.products == "onednn"

    def call_site(self) -> AttentionSite:
        """The kernel as one node calls it, keeping the views of that node's arrays: one kernel
        serves a decoder's every layer (the KernelCache shares it), whose arrays alternate, and
        views made again at every call cost 40-100 us of a 65 us attention ((1, 32) of a
        LLaMA-style model). The node's step holds the site, so the views go with its module."""
        return AttentionSite(self, ViewsOf())

    def __call__(self, *arrays: Any) -> None:
        if self.run_with(self._views_of, arrays) and replay.active is not None:
            replay.whole_call(self)

    def _views(self, seen: ViewsOf, arrays: tuple[Any, ...]) -> tuple[Any, ...]:
        """(q heads, k heads transposed, v heads, out heads, mask, oneDNN's products, and for
        grouped-query attention the same in groups with the scores) over this call's arrays,
        made again only when the arrays change (a graph passes the same ones every run, and
        making the views cost ~5 us of BERT-tiny's 22 us attention); seen keeps them."""
        if seen.arrays is not None and len(arrays) == len(seen.arrays) and all(
                a is b for a, b in zip(arrays, seen.arrays)) and seen.blocks is self.blocks:
            products = seen.views[5]
            if products is not None:  # shared by the sites: pointed at these arrays again
                q, k, v, *rest = arrays
                products.bind(q, k, v, self.scores, rest[-1], rest[0] if len(rest) > 1 else None)
            return seen.views
        q, k, v, *rest = arrays
        heads, kv, dim = self.heads, self.kv_heads, self.head_dim
        products = None
        if self.products == "onednn":
            products = self._products_for(self.blocks)
            if products is not None and not products.bind(
                    q, k, v, self.scores, rest[-1], rest[0] if len(rest) > 1 else None):
                products = None  # arrays oneDNN was not made for: OpenBLAS this call
        out = rest[-1]
        views: tuple[Any, ...] = (
            head_view(q, self.offsets[0], heads, dim),
            head_view(k, self.offsets[1], kv, dim).transpose(0, 1, 3, 2),
            head_view(v, self.offsets[2], kv, dim), head_view(out, 0, heads, dim),
            self._mask_rows(rest[0]) if self.has_mask else self.no_mask, products)
        if kv != heads:
            grouped: tuple[Any, ...] = (
                head_view(q, self.offsets[0], heads, dim, kv), head_view(out, 0, heads, dim, kv),
                self.scores.reshape(self.batch, kv, heads // kv, *self.full[2:]))
            if heads // kv > self.q_len:
                # a group's heads as the rows of one product per query (a decode step's one
                # query: one GEMM per kv head, not one GEMV per head); each query row and head
                # is computed alike either way
                grouped = tuple(a.swapaxes(2, 3) for a in grouped)
            views += (grouped[0], views[1][:, :, None], views[2][:, :, None], grouped[1],
                      grouped[2])
        fused = products is not None and products.softmax_fused
        seen.team_block = None if fused else self._team_pass(rest[0] if self.has_mask else None)
        seen.arrays, seen.views, seen.blocks = arrays, views, self.blocks
        return views

    def _mask_rows(self, mask: Any) -> Any:
        """The mask as _scale_mask_softmax reads it: itself where C-contiguous with the keys'
        width (its dims of 1 broadcast by index), else a broadcast view of it."""
        if mask.flags.c_contiguous and mask.shape[-1] == self.full[3]:
            return mask
        return np.broadcast_to(mask, self.full)

    def _team_pass(self, mask: Any) -> Any:
        """The block of _scale_mask_softmax_team over the scores and this call's mask, or None
        where the compiled pass runs on this thread (no team, or arrays it cannot read)."""
        return self._pass_block(mask) if self.team else None

    def _pass_block(self, mask: Any) -> Any:
        """_team_pass's block, the team aside (None: arrays it cannot read)."""
        if mask is None:
            return block(self.scores, *self.full, 0, 1, 1, 1, self.scale, self.nan_to_zero)
        if mask.shape != self.mask_shape or not team_arrays(self.scores, mask):
            return None
        return block(self.scores, *self.full, mask, *mask.shape[:3], self.scale,
                     self.nan_to_zero)

    def run_with(self, seen: ViewsOf, arrays: tuple[Any, ...]) -> bool:
        """Compute over arrays, with the views seen keeps (made again where they are not of
        these arrays); True where the work was oneDNN's products and team kernels alone
        (replay.whole_call: the scores it keeps are noted for a replay to hold)."""
        qh, kt, vh, oh, mask, products, *grouped = self._views(seen, arrays)
        scores, blocks, group = self.scores, self.blocks, self.heads // self.kv_heads
        scale, one, nan_to_zero, has_mask = self.typed_scale, self.one, self.nan_to_zero, \
            self.has_mask
        softmax_pass = self._pass

        def block(worker: int, index: int) -> None:
            b, h0, h1, q0, q1 = blocks[index]
            s = scores[b:b + 1, h0:h1, q0:q1]
            if products is not None:
                products.qk_on_worker(index)
            else:
                for lo, hi in _groups(h0, h1, group):  # the query heads of one kv head each
                    kv = slice(lo // group, (hi - 1) // group + 1)
                    np.matmul(qh[b:b + 1, lo:hi, q0:q1], kt[b:b + 1, kv],
                              out=s[:, lo - h0:hi - h0])
            if products is not None and products.softmax_fused:
                products.softmax_on_worker(index)  # scaled and masked by qk's post-ops
            else:
                softmax_pass(s, mask, b, h0, q0, scale, one, nan_to_zero, has_mask)
            if products is not None:
                products.pv_on_worker(index)
            else:
                for lo, hi in _groups(h0, h1, group):
                    kv = slice(lo // group, (hi - 1) // group + 1)
                    np.matmul(s[:, lo - h0:hi - h0], vh[b:b + 1, kv],
                              out=oh[b:b + 1, lo:hi, q0:q1])

        if len(blocks) == 1:
            if products is not None and products.softmax_fused:
                products.qk(0)  # scaled and masked as its post-ops
                products.softmax()
                products.pv(0)
                return self._replayable()
            if products is not None:
                products.qk(0)
            elif grouped:
                np.matmul(grouped[0], grouped[1], out=grouped[4])
            else:
                np.matmul(qh, kt, out=scores)
            if self._ahead.pending:
                self._ahead.load(seen.team_block is not None, scores, mask, 0, 0, 0, scale,
                                 one, nan_to_zero, has_mask)
            by_block = seen.team_block is not None
            if by_block:
                run_on_team(self._pass_team(), seen.team_block)
            else:
                # recorded for a replay: the team's pass on this thread alone, as replayed
                here = self._pass_block(arrays[3] if has_mask else None) \
                    if products is not None and recording_here() else None
                by_block = here is not None
                if here is not None:
                    run_here(self._pass_team(), here)
                else:
                    self._pass(scores, mask, 0, 0, 0, scale, one, nan_to_zero, has_mask)
            if products is not None:
                products.pv(0)
                return by_block and self._replayable()
            if grouped:
                np.matmul(grouped[4], grouped[2], out=grouped[3])
            else:
                np.matmul(scores, vh, out=oh)
            return False
        parallel_images(len(blocks), self.workers, block)
        return False

    def _replayable(self) -> bool:
        """True, the scores (which the products and the pass reach by address) noted for a
        replay to keep."""
        replay.note_arrays([self.scores])
        return True


class AttentionSite:
    """An AttentionKernel as one node calls it (AttentionKernel.call_site): the kernel with
    the views of that node's arrays."""

    def __init__(self, kernel: AttentionKernel, seen: ViewsOf) -> None:
        self.kernel = kernel
        self.seen = seen

    def __call__(self, *arrays: Any) -> None:
        if self.kernel.run_with(self.seen, arrays) and replay.active is not None:
            replay.whole_call(self)
