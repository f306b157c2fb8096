"""dense / matmul / batch_matmul on oneDNN: one matmul primitive per node, float32.

Operands are described with their real strides (a transposed operand is a strided view, no
copy). A 2-D product's right operand (dense's weight) is packed into the layout oneDNN picks
(format `any`), once and again when written; a batched right operand is read in place, since
it is usually an activation that changes every run. A 2-D product may carry its chain's tail
as bias and post-ops (matmul_tail.py).

Where oneDNN has no brgemm matmul for float32 (an AVX2 host: it runs gemm:jit, whose weight
stays plain) but has a brgemm inner product, a 2-D product of untransposed data is an inner
product instead (_inner_product_pays): the same sums, bias and post-ops, on a weight packed in
blocks. gemm:jit's time there depended on where the arrays lay: a T5's 128x256 @ 256x2048 ran
0.82-2.2 ms by the offsets of data and weight (1.5 ms on the runtime's 64-byte-aligned
buffers), the inner product 0.72-1.08 ms (docs/measurements.md).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from math import prod
from typing import Any, Callable, Sequence

from ...._lru import LruCache
from ....errors import LibraryError
from ... import tuning
from ..threads import parallel_images
from .. import replay
from ..derived import DerivesFromInputs
from . import abi
from . import binding as dn
from .binding import Memory, MemoryDesc, Primitive, PrimitiveDesc
from .policy import policy
from .matmul_tail import MatmulTail, append_post_ops
from .weights import PackedWeight

MIN_SPLIT_FLOPS = 4_000_000  # below this one work item (conv.py's threshold, same reason)
RUNTIME_DIM = -(1 << 63)  # DNNL_RUNTIME_DIM_VAL: a dim or stride given with the memories
SHAPES_KEPT = 16  # memories an any-shape product keeps, for the shapes met last
PIECES_KEPT = 64  # a 2-D product in pieces: the pieces' memories kept, for those met last
# A symbolic module's 2-D product of over SMALL_DIM rows runs its rows in pieces of PIECE_ROWS,
# then one exact remainder: each piece an exact brgemm primitive on the one packed weight, made
# once per piece size met (the last SIZES_KEPT kept). Every piece reads the whole weight again:
# pieces of the sizes 512 to 8, largest first, ran LLaMA-style prompts of 54-240 rows 1.1-1.2x
# ONNX Runtime against 0.85-1.05x for one exact piece, whose primitives (about 0.3 ms each, the
# layers' equal products made once) cost a new shape's first run no measurable time
# (docs/measurements.md). oneDNN's run-time rows (gemm:jit) ran 0.90-1.22x over 256 rows and
# 1.2-2.8x below. One kernel so serves every row count over SMALL_DIM (runtime/executor.py keys
# it by that band). Pieces of 512 rows ran a 1,200-row prompt's residual products (a stream's
# (4, 300) after (4, 156)) 1.37-1.42x slower than one exact primitive on an AVX2 host (AMD EPYC,
# Zen 3), the whole prompt 1.10-1.14x its static module; 2,048 rows a piece: 1.05x.
PIECE_ROWS = 2048
WORKER_STEP = 64  # the workers' pieces: multiples of it (_row_pieces)
# A piece's primitive descriptor and argument descriptors depend on its rows, the product's n
# and k, the post-ops' kinds and operand forms, oneDNN's thread count and the packed weight's
# layout, not on the weight's values: the denses of one such product (a decoder's layers, q and
# o, ...) share them process-wide, so a new row count makes one descriptor per product kind
# instead of one per dense node (a LLaMA-style prompt's 29 denses: 7). Each node makes its own
# primitive from it (oneDNN's cache hands it the code; about 10 us) and its memories: a
# primitive's scratchpad is its own, so one primitive must never run on two threads at once
# (the workers' pieces of one call, clones of a module running side by side). The last
# PIECES_SHARED piece sizes of every kind are kept.
PIECES_SHARED = 512


def matmul_applies(dtype: str, batch: int, m: int, n: int, k: int) -> bool:
    """Whether OnednnMatmul computes this product (and the library is here)."""
    return dtype == "float32" and min(batch, m, n, k) > 0 and dn.available()


def row_pieces(rows: int, size: int | None = None) -> list[tuple[int, int]]:
    """(first row, end row) pieces of rows: size (PIECE_ROWS) each, then the rest as one."""
    size = PIECE_ROWS if size is None else size
    full = rows - rows % size
    out = [(r0, r0 + size) for r0 in range(0, full, size)]
    if full < rows:
        out.append((full, rows))
    return out


@dataclass(frozen=True)
class _SharedPiece:
    """A piece size's primitive descriptor on the packed weight layout `weights`, and the
    descriptors of its execute arguments in order (each dense binds its own packed weight)."""

    weights: MemoryDesc
    pd: PrimitiveDesc
    descs: tuple[MemoryDesc, ...]


# per (rows, n, k, post-ops, OpenMP threads): the pieces made, one per weight layout met
_shared_pieces: LruCache[list[_SharedPiece]] = LruCache(PIECES_SHARED)


def _operand(batches: int, rows: int, cols: int, transposed: bool,
             two_d: bool) -> MemoryDesc:
    """The (batches, rows, cols) operand, stored transposed as (batches, cols, rows) if asked."""
    strides = (rows * cols, 1, rows) if transposed else (rows * cols, cols, 1)
    if two_d:
        return MemoryDesc.strided((rows, cols), strides[1:])
    return MemoryDesc.strided((batches, rows, cols), strides)


def _matmul_pd(src: MemoryDesc, weights: MemoryDesc, dst: MemoryDesc,
               tail: MatmulTail | None = None, bias: MemoryDesc | None = None,
               operands: Sequence[MemoryDesc] = (), inner: bool = False) -> PrimitiveDesc:
    """oneDNN's matmul descriptor, with tail's bias and binary post-ops (reading operands);
    inner: an inner product's instead (weights (n, k), bias (n,))."""
    engine = dn.library().engine
    made = None if tail is None else dn.post_ops_attr(
        lambda lib, ops: append_post_ops(lib, ops, tail, operands))
    attr = None if made is None else made[0]
    bias_handle = None if bias is None else bias.handle
    try:
        if inner:
            return PrimitiveDesc("dnnl_inner_product_forward_primitive_desc_create", engine,
                                 abi.FORWARD_INFERENCE, src.handle, weights.handle, bias_handle,
                                 dst.handle, attr)
        return PrimitiveDesc("dnnl_matmul_primitive_desc_create", engine, src.handle,
                             weights.handle, bias_handle, dst.handle, attr)
    finally:
        if made is not None:
            dn.free_attr(*made)


_inner_pays: dict[int, bool] = {}  # per OpenMP thread count


def _inner_product_pays() -> bool:
    """Whether a 2-D product runs faster as oneDNN's inner product here: where its matmul is
    gemm:jit (no brgemm matmul for float32: AVX2) and its inner product brgemm. Asked once per
    thread count (oneDNN picks its kernels for the threads of their creation)."""
    threads = dn.threads_in_use() or 0
    if threads not in _inner_pays:
        m, n, k = 64, 64, 64
        src, dst = MemoryDesc.plain((m, k)), MemoryDesc.plain((m, n))
        product = _matmul_pd(src, MemoryDesc.plain((k, n), abi.TAG_ANY), dst).impl()
        try:
            inner = _matmul_pd(src, MemoryDesc.plain((n, k), abi.TAG_ANY), dst,
                               inner=True).impl()
        except LibraryError:
            inner = ""
        _inner_pays[threads] = product.startswith("gemm") and inner.startswith("brg")
    return _inner_pays[threads]


class OnednnMatmul(DerivesFromInputs):
    """run(a, b, *extras, out): out[i] = op(a[i % a_batches]) @ op(b[i % b_batches]) on
    oneDNN; a 2-D product may then apply a tail: bias and post-ops reading extras, and after
    them a compiled chain (`after`, reading the arrays at after_args) on each item's rows.

    With split, a large product is cut into work items for the runtime's workers (as a conv's
    bands): blocks of output rows of a 2-D product (sharing its packed weight), or of the
    batch; without, it is one call on the caller's thread (measured faster for the small
    products of BERT-tiny and Whisper, 64-200 rows: 225 GFLOP/s against 105-117 in 16-row
    blocks, machine at load 3.6).

    A batched product without a tail or split, prepared for a symbolic module's new shape
    (tuning.in_size_class_scope), is one primitive with run-time dims (oneDNN's gemm:jit): it
    takes any shape (any_shape), memories made once per shape met, so a decoder's attention
    products need no new primitive per past length (0.3-0.5 ms each; it runs the decode
    products at 1, 64-300 columns in 4-12 us against brgemm's 5-21 us, and BERT-base's 12 x 128
    x 128 x 64 within 5%, measured on 2 loaded cores). Static graphs keep one primitive per
    shape. A 2-D product for such a shape of over SMALL_DIM rows takes any such rows too, in
    pieces (PIECE_ROWS; with split on the runtime's workers, their items, about two a worker).

    An any-shape product made by a tuning choice (dense_choice.py) serves another shape only
    where that choice picks it there too (serves).
    """

    def __init__(self, batch: int, m: int, n: int, k: int, trans_a: bool, trans_b: bool,
                 a_batches: int, b_batches: int, split: bool = True,
                 tail: MatmulTail | None = None, extras: int = 0, after: Any = None,
                 after_args: tuple[int, ...] = ()) -> None:
        two_d = batch == a_batches == b_batches == 1
        if (tail is not None or after is not None) and not two_d:
            raise ValueError("OnednnMatmul: a tail needs a 2-D product")
        self.derived = (1,) if two_d else ()
        super().__init__()
        dn.use_threads(policy().openmp)
        self.shape = (batch, m, n, k, trans_a, trans_b, a_batches, b_batches)
        self.two_d = two_d
        # an inner product instead of a matmul (_inner_product_pays): weights (n, k), bias (n,)
        self.inner = two_d and not trans_a and _inner_product_pays()
        self.split = split
        self.tail = tail
        self.extras = extras
        self.after = after
        self.after_args = after_args
        # OpenMP threads inside the primitive, or (split) single-threaded items over the
        # runtime's workers: policy.py's mode for this process
        threads = policy()
        self.openmp = threads.openmp
        self.workers = threads.workers if split else 1
        self.items: list[tuple[Primitive, list[tuple[Memory, int, int]]]] = []
        self.rows: list[tuple[int, int]] = []  # a 2-D product's item rows
        self._flat: tuple[Any, ...] = ()
        self._arrays: tuple[Any, ...] = ()
        self._impl = ""
        batched_any = not two_d and tail is None and after is None and not split and extras == 0
        # a 2-D product taking any rows: its compiled tail must read every array whole
        # (chain_jit kinds c and s: no per-row metadata made for the prepared rows)
        rows_whole = two_d and not trans_a and (
            after is None or all(meta.size == 0 for meta in after.metas))
        in_scope = tuning.in_size_class_scope()
        # any rows over SMALL_DIM run in pieces (PIECE_ROWS), each exact
        self.in_pieces = in_scope and rows_whole and m > tuning.SMALL_DIM
        self.any = self.in_pieces or in_scope and batched_any
        # whether the tuning choice that made this kernel picks it at other shapes (serves)
        self.chosen_at: Callable[[Sequence[tuple[int, ...]]], bool] | None = None
        # per shapes met, the primitive on memories of those dims (with each memory's argument
        # index and byte offset): a batched product's per (a, b, out), a 2-D product's per rows
        # (in pieces, each piece's, in order); and those the last call ran (on _arrays)
        self._by_shape: OrderedDict[Any, tuple[Primitive, list[tuple[Memory, int, int]]]] = \
            OrderedDict()
        self._by_rows: OrderedDict[int, list[tuple[Primitive, list[tuple[Memory, int, int]]]]] \
            = OrderedDict()  # the same for a 2-D product: per rows, its primitives in order
        # in pieces: per piece size and its place among the pieces of that size in a call,
        # its primitive and (memory, argument index, bytes per row of the piece's first row)
        self._by_piece: LruCache[tuple[Primitive, list[tuple[Memory, int, int]]]] = \
            LruCache(PIECES_KEPT)
        self._current: Any = None
        self._current_rows: list[Primitive] = []  # a 2-D any-shape call's primitives, in order
        self._current_pieces: list[tuple[int, int]] = []  # and their rows
        self._fused_ops = tail.post_ops if tail is not None else ()  # oneDNN applies them
        self._rows = 0  # this call's rows (a 2-D any-shape product)

    def _build(self) -> None:
        """Make the primitives and the packed weight, on first need: a kernel the tuning
        service or a chain's tail passes over costs nothing (BERT-base made 132 matmul
        primitives for 48 dense nodes, 0.48 s of a warm start)."""
        if self._impl:
            return
        dn.use_threads(self.openmp)
        n, k, b_batches = self.shape[2], self.shape[3], self.shape[7]
        two_d = self.two_d
        w_shape = ((n, k) if self.inner else (k, n)) if two_d else (b_batches, k, n)
        pieces = self._pieces()
        pds = {}
        chosen: MemoryDesc | None = None
        for piece in pieces:
            geometry = (piece[1] - piece[0], piece[3] - piece[2])
            if geometry not in pds:
                pds[geometry] = self._pd(piece, chosen)
                if chosen is None:
                    chosen = pds[geometry].md(abi.QUERY_WEIGHTS_MD, w_shape)
        assert chosen is not None
        user_w = self._user_weight()
        # a batched right operand is read in place by each item (its own memory, not this one)
        self.weight = PackedWeight(user_w, chosen if two_d else user_w)
        self.rows = [(piece[2], piece[3]) for piece in pieces]
        for piece in pieces:
            pd = pds[(piece[1] - piece[0], piece[3] - piece[2])]
            self.items.append(self._item(pd, piece))
            if self.in_pieces:
                self._share_piece(piece[3] - piece[2], self.items[-1][0])
        if self.any and two_d:  # the prepared rows' items serve their first call (_run_rows)
            self._by_rows[self.shape[1]] = list(self.items)
        self._impl = pds[(pieces[0][1] - pieces[0][0], pieces[0][3] - pieces[0][2])].impl()

    @property
    def impl(self) -> str:
        """The implementation oneDNN picks (brg:avx512_core, ref:any ...), as _build's first
        work item gets it: asked of that item's primitive descriptor alone, so that a kernel
        checked and passed over (choice.py) makes no primitives and no packed weight (48 such
        builds were 0.1 s of a warm BERT-base start)."""
        if not self._impl:
            return self._pd(self._pieces()[0], None).impl()
        return self._impl

    def with_tail(self, tail: MatmulTail, extras: int, after: Any = None,
                  after_args: tuple[int, ...] = ()) -> OnednnMatmul:
        """This 2-D product with tail's bias and post-ops reading `extras` more inputs, then
        the compiled chain after (chain_jit.CompiledChain) over the arrays at after_args."""
        made = OnednnMatmul(*self.shape, split=self.split, tail=tail, extras=extras,
                            after=after, after_args=after_args)
        made.chosen_at = self.chosen_at
        return made

    def post_op_shape(self) -> tuple[int, int] | None:
        return (self.shape[1], self.shape[2]) if self.two_d else None

    def with_post_ops(self, tail: Any, extras: int, after: Any = None,
                      after_args: tuple[int, ...] = ()) -> OnednnMatmul | None:
        return self.with_tail(tail, extras, after, after_args) if self.two_d else None

    def reading_nhwc(self, position: int, shape: tuple[int, ...]) -> Any:
        """A dense (2-D, untransposed data) reading its features from NHWC bytes
        (nhwc_dense.py): position 0, an (N, C, H, W) shape with N rows and C*H*W columns.

        The variant keeps a permuted copy and a second packing of the weight: only where
        that pays (kernels/nhwc_features.py's permuting_pays: a small weight, or one no larger
        than the features), not for a VGG-sized classifier at batch 1.
        """
        from ..nhwc_features import permuting_pays
        from .nhwc_dense import NhwcFeaturesMatmul  # it builds on this class
        batch, m, n, k, trans_a = self.shape[:5]
        if (position != 0 or not self.two_d or trans_a or len(shape) != 4 or shape[0] != m
                or shape[1] * shape[2] * shape[3] != k or not permuting_pays(m, n, k, 4)):
            return None
        return NhwcFeaturesMatmul(self, shape)

    def pieces(self) -> int:
        """How many work items a call hands out."""
        self._build()
        return len(self.items)

    def note(self) -> str:
        """What `graphrun profile` says of it."""
        text = f"onednn matmul ({self.impl}) in {len(self.items)} item" + \
            ("s" if len(self.items) > 1 else "")
        if self.tail is not None and self.tail.ops:
            text += ", post-ops " + "+".join(self.tail.ops)
        if self.after is not None:
            text += ", compiled tail " + "+".join(self.after.ops)
        return text

    def _pieces(self) -> list[tuple[int, int, int, int]]:
        """(first batch, end batch, first row, end row) work items: blocks for the workers,
        or the prepared rows' pieces."""
        batch, m, n, k = self.shape[:4]
        if self.in_pieces:
            return [(0, 1, r0, r1) for r0, r1 in self._row_pieces(m)]
        parts = 1
        if self.split and self.workers > 1 and 2 * batch * m * n * k >= MIN_SPLIT_FLOPS:
            parts = min(2 * self.workers, m if self.two_d else batch)
        if self.two_d:
            step = -(-m // parts)
            return [(0, 1, r0, min(m, r0 + step)) for r0 in range(0, m, step)]
        step = -(-batch // parts)
        return [(b0, min(batch, b0 + step), 0, m) for b0 in range(0, batch, step)]

    def _descs(self, piece: tuple[int, int, int, int]) -> tuple[MemoryDesc, ...]:
        """(src, user weights, dst) descriptors of one work item."""
        _, _, n, k, trans_a, trans_b, a_batches, b_batches = self.shape
        m = self.shape[1]
        b0, b1, r0, r1 = piece
        rows = r1 - r0
        if self.two_d:
            strides = (1, m) if trans_a else (k, 1)
            return (MemoryDesc.strided((rows, k), strides), self._user_weight(),
                    MemoryDesc.plain((rows, n)))
        count = b1 - b0
        return (_operand(count if a_batches > 1 else 1, m, k, trans_a, False),
                _operand(count if b_batches > 1 else 1, k, n, trans_b, False),
                MemoryDesc.plain((count, m, n)))

    def _user_weight(self) -> MemoryDesc:
        """The right operand as given: the matmul's (k, n), or the inner product's (n, k)
        (the same bytes: a dense's (n, k) weight, plain where trans_b)."""
        _, _, n, k, _, trans_b, b_batches, _ = self.shape
        if self.inner:
            return _operand(1, n, k, not trans_b, True)
        return _operand(b_batches, k, n, trans_b, self.two_d)

    def _operand_descs(self, rows: int) -> tuple[MemoryDesc | None, list[MemoryDesc]]:
        """The bias's descriptor (or None) and the operand's of each binary post-op oneDNN
        applies (_fused_ops), for a piece of rows rows."""
        tail, n = self.tail, self.shape[2]
        if tail is None:
            return None, []
        bias = None
        if tail.bias >= 0:
            bias = MemoryDesc.plain((n,) if self.inner else (1, n))
        shapes = {"one": (1, 1), "row": (1, n), "full": (rows, n)}
        return bias, [MemoryDesc.plain(shapes[op.form]) for op in self._fused_ops]

    def _pd(self, piece: tuple[int, int, int, int], chosen: MemoryDesc | None) -> PrimitiveDesc:
        if self.any and not self.two_d:
            return self._runtime_pd()
        src, user_w, dst = self._descs(piece)
        weights = user_w
        if self.two_d:
            weights = chosen or MemoryDesc.plain(user_w.shape, abi.TAG_ANY)
        if self.tail is None:
            return _matmul_pd(src, weights, dst, inner=self.inner)
        return _matmul_pd(src, weights, dst, self.tail,
                          *self._operand_descs(piece[3] - piece[2]), inner=self.inner)

    def _runtime_pd(self) -> PrimitiveDesc:
        """A batched product's descriptor with every dim and outer stride given at run time."""
        trans_a, trans_b = self.shape[4], self.shape[5]
        dims = (RUNTIME_DIM,) * 3
        plain, transposed = (RUNTIME_DIM, RUNTIME_DIM, 1), (RUNTIME_DIM, 1, RUNTIME_DIM)
        return _matmul_pd(MemoryDesc.strided(dims, transposed if trans_a else plain),
                          MemoryDesc.strided(dims, transposed if trans_b else plain),
                          MemoryDesc.strided(dims, plain))

    def any_shape(self) -> bool:
        return self.any

    def serves(self, shapes: Sequence[tuple[int, ...]]) -> bool:
        """Whether its tuning choice picks it for arrays of these shapes too (chosen_at; a
        kernel no choice made serves every shape it takes)."""
        return self.chosen_at is None or self.chosen_at(shapes)

    def _rows_items(self, rows: int) -> list[tuple[Primitive, list[tuple[Memory, int, int]]]]:
        """A 2-D product of these rows: each piece's primitive on memories of its rows. A
        piece's memories depend on its size alone (its first row moves only their addresses):
        the first piece of each size in a call, the second, ... are items kept across row
        counts, so a new length makes nothing once its piece sizes were met (a stream's new
        shapes each made 2-3 items a product, 75 us each, where the pieces began elsewhere)."""
        items = []
        seen: dict[int, int] = {}
        for r0, r1 in self._row_pieces(rows):
            size = r1 - r0
            place = seen[size] = seen.get(size, -1) + 1
            primitive, per_row = self._by_piece.get_or_build(
                (size, place), partial(self._piece_item, size))
            items.append((primitive, [(memory, which, r0 * row_bytes)
                                      for memory, which, row_bytes in per_row]))
        return items

    def _row_pieces(self, rows: int) -> list[tuple[int, int]]:
        """A 2-D product's rows in pieces (in_pieces): PIECE_ROWS each on this thread. On the
        runtime's workers (policy.py's workers mode: a neighbour holds a core) the pieces are
        their items, pulled in turn: about two a worker, as a static shape's product is split
        (pieces of at most 128 rows ran a LLaMA-style stream's large shapes up to 1.1x slower:
        docs/measurements.md), in multiples of WORKER_STEP rows up to PIECE_ROWS (of SMALL_DIM
        for fewer rows), so that most row counts find their pieces' items made (_by_piece)
        and make only the remainder's."""
        if self.workers == 1:
            return row_pieces(rows)
        share = rows / (2 * self.workers)
        if share >= WORKER_STEP:
            size = WORKER_STEP * int(share / WORKER_STEP + 0.5)
        else:
            size = tuning.SMALL_DIM * -(-int(share) // tuning.SMALL_DIM) or tuning.SMALL_DIM
        return row_pieces(rows, min(PIECE_ROWS, size))

    def _piece_item(self, size: int) -> tuple[Primitive, list[tuple[Memory, int, int]]]:
        """A primitive of its own for a piece of size rows, on memories of its own, with each
        memory's argument index and its offset in bytes per first row of the piece: made from
        the product kind's shared descriptor for that size (_shared_pieces) where one reads
        this weight layout, else from one made here (and shared)."""
        made, shared = self._shared_piece(size)
        args, per_row = self._args((0, 1, 0, size), per_row=True,
                                   descs=None if shared is None else shared.descs)
        if shared is not None:
            return Primitive(shared.pd, args), per_row
        primitive = Primitive(self._pd((0, 1, 0, size), self.weight.memory.desc), args)
        self._add_piece(made, primitive)
        return primitive, per_row

    def _shared_piece(self, size: int) -> tuple[list[_SharedPiece], _SharedPiece | None]:
        """The pieces of size rows made for this product kind (_shared_pieces: its rows, n, k,
        post-ops' kinds and operand forms, OpenMP threads), and the one on this dense's packed
        weight layout, if made."""
        tail = self.tail
        ops = None if tail is None else (tail.bias >= 0, tuple((op.kind, op.form)
                                                              for op in tail.post_ops))
        made = _shared_pieces.get_or_build((size, self.shape[2], self.shape[3], ops,
                                            self.openmp), list)
        weights = self.weight.memory.desc
        return made, next((p for p in made if p.weights == weights), None)

    def _share_piece(self, size: int, primitive: Primitive) -> None:
        """primitive's descriptors (made for a piece of size rows on this dense's memories) for
        the other denses of this product kind."""
        made, shared = self._shared_piece(size)
        if shared is None:
            self._add_piece(made, primitive)

    def _add_piece(self, made: list[_SharedPiece], primitive: Primitive) -> None:
        made.append(_SharedPiece(self.weight.memory.desc, primitive.pd,
                                 tuple(m.desc for m in primitive.memories)))

    def _run_rows(self, arrays: tuple[Any, ...]) -> None:
        """A 2-D any-shape call: the primitives for out's rows, then the tail."""
        if len(arrays) != len(self._arrays) or any(x is not y for x, y in zip(arrays,
                                                                              self._arrays)):
            n = self.shape[2]
            rows = arrays[-1].size // n if n else 0
            items = self._by_rows.get(rows)
            if items is None:
                items = self._by_rows[rows] = self._rows_items(rows)
                if len(self._by_rows) > SHAPES_KEPT:
                    self._by_rows.popitem(last=False)
            for _, bindings in items:
                for memory, which, offset in bindings:  # by address, as _run_any
                    memory.bind_address(arrays[which].ctypes.data + offset)
            if self.after is not None:
                self._flat = self.after.flat_arrays([arrays[i] for i in self.after_args])
            self._arrays = arrays
            self._current_rows = [primitive for primitive, _ in items]
            # the workers' items' rows (one thread runs the pieces in turn, the tail once)
            self._current_pieces = self._row_pieces(rows) if self.workers > 1 else []
            self._rows = rows
        primitives, after, n = self._current_rows, self.after, self.shape[2]
        if self.workers > 1 and len(primitives) > 1:  # the pieces are the workers' items
            pieces, flat = self._current_pieces, self._flat

            def item(worker: int, i: int) -> None:
                dn.run_on_worker(primitives[i])
                if after is not None:
                    after.run_block(pieces[i][0], pieces[i][1], 0, n, n, flat)
            parallel_images(len(primitives), self.workers, item)
            return
        for primitive in primitives:
            primitive.run()
        if replay.active is not None and replay.active.here() is not None:
            self._recorded_rows(arrays)
        elif after is not None:
            after.run_block(0, self._rows, 0, n, n, self._flat)

    def _recorded_rows(self, arrays: tuple[Any, ...]) -> None:
        """_recorded for a call of any rows (a symbolic module's band kernel, in pieces on
        this thread): the tail as one call over the arrays at their shapes (its call site:
        the tail is prepared for other rows), vouched for as _recorded does."""
        after = self.after
        whole = self.weight.direct or not self._volatile()
        if after is not None:
            tail = [arrays[i] for i in self.after_args]
            if after.at(tuple(a.shape for a in tail)) is None:  # (not a flat loop's shapes)
                after.run_block(0, self._rows, 0, self.shape[2], self.shape[2], self._flat)
                return
            whole = replay.vouched(after.call_site(), *tail) and whole
        if whole:
            replay.whole_call(self)

    def _shape_item(self, a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]
                    ) -> tuple[Primitive, list[tuple[Memory, int, int]]]:
        """The run-time-dims primitive on memories for arrays of these shapes (any_shape)."""
        trans_a, trans_b = self.shape[4], self.shape[5]
        m, n = out[-2], out[-1]
        k = a[-2] if trans_a else a[-1]
        batch, a_batches, b_batches = prod(out[:-2]), prod(a[:-2]), prod(b[:-2])
        if a_batches not in (1, batch) or b_batches not in (1, batch):
            raise LibraryError(f"oneDNN batched matmul: operands {a} and {b} for output {out}: "
                               f"each operand's batch must be 1 or the output's {batch}")
        descs = (_operand(a_batches, m, k, trans_a, False), _operand(b_batches, k, n, trans_b,
                                                                     False),
                 MemoryDesc.plain((batch, m, n)))
        memories = [Memory(desc) for desc in descs]
        primitive = self.items[0][0].with_args([(abi.ARG_SRC, memories[0]),
                                                (abi.ARG_WEIGHTS, memories[1]),
                                                (abi.ARG_DST, memories[2])])
        return primitive, [(memory, which, 0) for which, memory in enumerate(memories)]

    def _run_any(self, a: Any, b: Any, out: Any) -> None:
        last = self._arrays
        if len(last) == 3 and a is last[0] and b is last[1] and out is last[2]:
            self._current.run()  # the arrays of the call before (a warm module)
            if replay.active is not None:
                replay.whole_call(self)
            return
        key = (a.shape, b.shape, out.shape)
        item = self._by_shape.get(key)
        if item is None:
            item = self._by_shape[key] = self._shape_item(*key)
            if len(self._by_shape) > SHAPES_KEPT:
                self._by_shape.popitem(last=False)
        primitive, bindings = item
        # by address: a kept shape's memories must not keep its module's arrays alive
        arrays = (a, b, out)
        for memory, which, _ in bindings:
            memory.bind_address(arrays[which].ctypes.data)
        self._arrays = (a, b, out)
        self._current = primitive
        primitive.run()
        if replay.active is not None:  # one primitive on the arrays' addresses: its whole call
            replay.whole_call(self)

    def _item(self, pd: PrimitiveDesc, piece: tuple[int, int, int, int]
              ) -> tuple[Primitive, list[tuple[Memory, int, int]]]:
        """The item's primitive and its (memory, operand 0-2, byte offset) to bind each run."""
        args, bindings = self._args(piece)
        return Primitive(pd, args), bindings

    def _args(self, piece: tuple[int, int, int, int], per_row: bool = False,
              descs: Sequence[MemoryDesc] | None = None
              ) -> tuple[list[tuple[int, Memory]], list[tuple[Memory, int, int]]]:
        """An item's execute arguments on memories of its piece, and (memory, argument index,
        byte offset) for each to bind per run; per_row (a 2-D product): the offset of a piece
        starting at row 1 instead (a piece at row r0 binds r0 times it). descs: a shared
        piece's argument descriptors, in order (_SharedPiece), instead of made here."""
        _, m, n, k, trans_a, _, a_batches, b_batches = self.shape
        b0, _, r0, _ = piece
        if descs is None:
            src_desc, w_desc, dst_desc = self._descs(piece)
            bias_desc, operand_descs = self._operand_descs(piece[3] - piece[2])
        else:  # a 2-D piece's: src, weights, dst, then the bias and operands if any
            src_desc, w_desc, dst_desc = descs[:3]
            has_bias = self.tail is not None and self.tail.bias >= 0
            bias_desc = descs[3] if has_bias else None
            operand_descs = list(descs[3 + int(has_bias):])
        src, dst = Memory(src_desc), Memory(dst_desc)
        out = 2 + self.extras  # out's argument index
        if self.two_d:
            r0 = 1 if per_row else r0
            bindings = [(src, 0, 4 * (r0 if trans_a else r0 * k)), (dst, out, 4 * r0 * n)]
            weights = self.weight.memory
        else:
            weights = Memory(w_desc)
            bindings = [(src, 0, 4 * b0 * m * k if a_batches > 1 else 0),
                        (weights, 1, 4 * b0 * k * n if b_batches > 1 else 0),
                        (dst, out, 4 * b0 * m * n)]
        args = [(abi.ARG_SRC, src), (abi.ARG_WEIGHTS, weights), (abi.ARG_DST, dst)]
        if self.tail is not None:
            if bias_desc is not None:
                bias = Memory(bias_desc)
                args.append((abi.ARG_BIAS, bias))
                bindings.append((bias, 2 + self.tail.bias, 0))
            for index, (op, desc) in enumerate(zip(self._fused_ops, operand_descs)):
                memory = Memory(desc)
                args.append((abi.ARG_POST_OP_BASE * (index + 1) | abi.ARG_SRC_1, memory))
                bindings.append((memory, 2 + op.operand, 4 * r0 * n if op.form == "full" else 0))
        return args, bindings

    def workspace_bytes(self) -> int:
        self._build()
        return self.weight.nbytes

    def workspace_owner(self) -> Any:
        self._build()
        return self.weight.owner(self)

    def uses_workers(self) -> bool:
        """Its work items go to the runtime's workers (OpenBLAS held at one thread beside it)."""
        return True

    def __call__(self, a: Any, b: Any, *rest: Any) -> None:
        dn.use_threads(self.openmp)
        if not self._impl:
            self._build()
        if self.any and not self.two_d:
            self._run_any(a, b, rest[0])
            return
        if self.two_d:
            if self.weight.direct:
                self.weight.memory.bind(b)
            elif self._stale():
                self.weight.refresh(b)
            if self.any:
                self._run_rows((a, b) + rest)
                return
        arrays = (a, b) + rest
        if len(self._arrays) != len(arrays) or any(x is not y for x, y in zip(arrays,
                                                                              self._arrays)):
            bases = [x.ctypes.data for x in arrays]
            for _, bindings in self.items:
                for memory, which, offset in bindings:
                    memory.bind_address(bases[which] + offset)
            if self.after is not None:
                self._flat = self.after.flat_arrays([arrays[i] for i in self.after_args])
            self._arrays = arrays
        items, after = self.items, self.after
        if len(items) == 1:
            items[0][0].run()
            if replay.active is not None and replay.active.here() is not None:
                self._recorded(arrays)
            elif after is not None:
                after.run_block(0, self.shape[1], 0, self.shape[2], self.shape[2], self._flat)
            return
        if after is None:
            parallel_images(len(items), self.workers, lambda worker, i: dn.run_on_worker(items[i][0]))
            return
        rows, flat, n = self.rows, self._flat, self.shape[2]

        def item(worker: int, i: int) -> None:
            dn.run_on_worker(items[i][0])
            after.run_block(rows[i][0], rows[i][1], 0, n, n, flat)
        parallel_images(len(items), self.workers, item)

    def _recorded(self, arrays: tuple[Any, ...]) -> None:
        """The rest of a one-item call while a replay records (kernels/replay.py): the tail
        after the product as the chain's own call over the whole output (its team function on
        this thread, the same loop as run_block over every row); vouched for where that was
        recorded too and the weight is not derived anew each run."""
        after = self.after
        whole = not self.two_d or self.weight.direct or not self._volatile()
        if after is not None:
            whole = replay.vouched(after, *[arrays[i] for i in self.after_args]) and whole
        if whole:
            replay.whole_call(self)

    def __repr__(self) -> str:
        return f"OnednnMatmul({self.impl}, {len(self.items)} items)"

