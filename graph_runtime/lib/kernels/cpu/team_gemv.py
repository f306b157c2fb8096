"""Dense products of a few rows (a decode step's x[1, k] @ w[n, k].T) over oneDNN's OpenMP team.

Such a product reads its whole weight once and does two flops a weight: it runs at the memory's
speed. oneDNN 3.2's matmul reads it at one core's bandwidth even on two threads: in a
LLaMA-style decoder whose 48 MB of weights stream from memory each token, its 512x512 products
took 60 us and its 1376x512 ones 140 (17-20 GB/s), about ONNX Runtime's one-thread speed, where
its default two threads took 32 and 93 us (30 GB/s). Here the team's threads take the
weight's rows 32 at a time from a shared counter (whole cache lines of the output; a thread
whose core is late takes fewer) and sum eight rows' dot products together with every row of x,
the weight rows staying in cache across x's rows (numba, float32, sums in vector lanes, each
product fused with its sum). A 90 MB chain of decode-size products took 1.57-2.04x ONNX
Runtime's default time one row at a time, evenly split; so, 1.04-1.08x (docs/measurements.md).
A compiled tail (the chain's residual add, silu * up) then runs over the few output rows on the
caller.

A weight that stays the same between runs (a param: its write counter bound, derived.py) is read
packed: eight rows interleaved in 16-value pieces ([n/8][k/16][8 x 16], zero padded), so that a
thread's eight dot products read one sequential stream of whole cache lines, which the
hardware prefetcher follows, instead of eight streams 2-5 KB apart; threads take 64 rows at a
time. On a 2-core AMD EPYC, a 45 MB chain of 512x1376 and 1376x512 products read at 14 GB/s on
one thread and 27-34 GB/s on two from the weight as given, 27 and 42-49 GB/s packed (ONNX
Runtime's MLAS, packed too: 27 and 42). The packed copy is workspace (a frozen param's is
shared by every kernel reading it, derived.derived_of); a weight written every run (volatile)
is read as given.

A decoder's prompt runs its products on oneDNN's matmul first, which reorders each weight into
its blocked layout ("BA16a64b" on AVX-512: [n/64][k/16][16 x 64]) and offers the copy among
the frozen weight's derived data. The few-row products after it read that copy as it is
(_blocked_gemv_team) instead of packing another: a LLaMA-style decoder's first decode token
took 10.6-11.9 ms instead of 24.6-25.3 (its 48 MB packing gone, and the copy's memory with it),
and the layout reads at the packed one's speed on one row and 1.65x it on four.

Whether packing pays depends on the machine: on a 2-vCPU Intel Xeon VM (480 MB L3) a chain of
decode-size products read packed was 1.4x slower than read as given when each run follows a
pause (a server's Python between runs), and the decoder's token 3.2 against 2.2 ms. So the
layout is one tuning choice per machine (LAYOUT, `cpu.team_gemv_layout`): packed unless the
weight as given is clearly faster on a chain of 34 MB of such products, each sample after a
pause as a graph's products run; decided at create by a module whose run() meets new shapes
(decide_layout), where nothing is measured.

Offered by dense's candidate set (dense_choice.py) for float32 products of at most MAX_ROWS rows
against a 2-D weight when oneDNN's products run on that team (omp_team.available()), and its base
there: a symbolic module's new shapes take it unmeasured. A race times each candidate alone after
a pause, the team asleep and the weight in cache, so small products go to OpenBLAS's call on one
thread there.

The packed layout is made for weights that stream from memory. Where a module's storage (its
inputs, weights among them, and intermediates) takes at most half of the last-level cache, the
weights stay there between runs and are read from it: there the weight as given was faster on
the 2-core AMD EPYC (a 512x784 product 12.7 against 17.6 us, 512x512 8.8 against 12.1; the mlp
example's run 44 against 52 us), so such a module's products read it as given unless the layout
is forced, each thread the same rows at every call (weights_cached, which the executor holds
around preparing its kernels).

GRAPH_RUNTIME_TEAM_GEMV: auto (default, measured), on (wherever it applies), off.
GRAPH_RUNTIME_TEAM_GEMV_LAYOUT: auto (default, measured once per machine), packed, given.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import glob
import weakref
from typing import Any, Callable, Iterator, Mapping

import numpy as np
from numba import carray

from .... import settings
from ...._timing import MIN_SPEEDUP, Race, Verdict, sampler
from ...library import InputVersion
from ...tuning import Choice
from .. import replay
from ..address import address_of
from ..derived import DerivesFromInputs, derived_of, shared_list_watched_by
from ..nhwc_features import PermutedWeightProduct, permuting_pays
from ..onednn.weights import aligned_buffer
from . import jit_setup
from .loops_jit import inlined, lane_dot
from .omp_team import (_team_size, _thread_num, available, claim_rows, float32_at, run_at,
                       run_on_team, team_kernel, wake_team)

MAX_ROWS = 8  # of x: beyond, the product has flops enough for a GEMM's blocking to win
LINE = 16  # float32 values per cache line
# rows a team thread takes at a time (whole cache lines of the output: no two threads write one)
CHUNK = 2 * LINE
BLOCK = 8  # int64 entries of a kernel's block (_gemv_team)
COUNTER = BLOCK - 1  # the block's last entry: the first row no thread has taken
# array sets a kernel keeps blocks for (TeamGemv._bind): a decoder's layers each pass their own,
# a symbolic module's new shapes their new views; past it all are dropped at once
BOUND_KEPT = 64
PACK_ROWS = 8  # weight rows interleaved in the packed layout
PIECE = LINE  # values of one row taken at a time there: a cache line
PANEL = PACK_ROWS * PIECE  # one piece of each of the eight rows: 512 bytes
# packed blocks of eight rows a thread takes at a time: one long stream per thread (taking
# them one at a time, the two threads' streams interleaved and read at 30 GB/s instead of 42)
CHUNK_BLOCKS = 8
PACKED_TAG = "team_gemv packed"  # its entries in a frozen weight's derived_of list
LAYOUT = Choice("cpu.team_gemv_layout", settings.TEAM_GEMV_LAYOUT)
LAYOUTS = ("packed", "given")
# the race's chain: a decode step's MLP products (12 x 2.8 MB), past a core's L2 many times
LAYOUT_CHAIN = ((1376, 512), (512, 1376)) * 6
LAYOUT_KEY = "float32 m 1 chain " + " ".join(f"{n}x{k}" for n, k in LAYOUT_CHAIN[:2]) + " x6"
PAUSE_S = 0.0005  # before each sample: a graph's products follow other work, not each other


# Within weights_cached(True): the module whose kernels are prepared keeps its weights in cache.
_CACHED: contextvars.ContextVar[bool] = contextvars.ContextVar("team_gemv weights cached",
                                                               default=False)


@contextlib.contextmanager
def weights_cached(cached: bool) -> Iterator[None]:
    """Within: the products made read their weights as given where cached (and the layout is
    not forced), each thread the same rows: a module whose storage fits in the cache between
    runs (cache_holds)."""
    token = _CACHED.set(cached)
    try:
        yield
    finally:
        _CACHED.reset(token)


def cache_holds(nbytes: int) -> bool:
    """Whether a module's nbytes of storage stay in the last-level cache between runs: at most
    half of it (the rest for the interpreter and other work); no when its size is unknown."""
    return 0 < nbytes <= last_level_cache_bytes() // 2


CACHE_FOLDER = "/sys/devices/system/cpu/cpu0/cache"  # Linux's description of CPU 0's caches


@functools.cache
def last_level_cache_bytes(folder: str = CACHE_FOLDER) -> int:
    """The size of the highest-level cache in folder (sysfs: index*/level and index*/size,
    "32768K"), 0 where none can be read."""
    best = (0, 0)
    for index in glob.glob(f"{folder}/index*"):
        try:
            with open(f"{index}/level") as f:
                level = int(f.read())
            with open(f"{index}/size") as f:
                text = f.read().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, (level, int(digits) * scale))
    return best[1]


def applies(m: int, n: int, dtype: str) -> bool:
    """Whether a product of m rows against an [n, k] weight may run here now. A narrow weight
    (n under CHUNK: a classifier's last dense) is one thread's work, as OpenBLAS's call does
    it; on the team its calls are recorded and replayed with their neighbours' (replay.py),
    where OpenBLAS's call stays a call from Python: the cnn example's 10x8192 dense took 4.5
    us replayed against OpenBLAS's 4.3, and oneDNN's matmul 36."""
    return dtype == "float32" and 1 <= m <= MAX_ROWS and n >= 1 and available()


def packs() -> bool:
    """Whether team products read a steady weight packed on this machine (LAYOUT: forced, the
    process's or the tuning file's answer, else measured; inside a symbolic module's run(),
    never measured: the file's answer or packed)."""
    return LAYOUT.choose("cpu", LAYOUT_KEY, LAYOUTS, _race_layouts, "packed",
                         MIN_SPEEDUP) == "packed"


def decide_layout() -> None:
    """Decide LAYOUT now (measured once per machine where the tuning file has no trusted
    answer: about 0.15 s, and the team kernels' code loaded, which their first call would
    load anyway, 0.4 s), where the team may run: a module whose run() meets new shapes calls
    this at create, so that its products are not left at the default."""
    if available():
        packs()


def _race_layouts(race: Race) -> Verdict:
    """Both layouts timed on LAYOUT_CHAIN's products, one chain a sample after a pause with
    the team woken first, as a decode step's products run after the Python between runs."""
    rng = np.random.default_rng(0)  # float32 draws: 34 MB of normal ones took 0.12 s
    weights = [rng.random(shape, np.float32) for shape in LAYOUT_CHAIN]
    xs = {k: rng.random((1, k), np.float32) for _, k in LAYOUT_CHAIN}
    outs = [np.empty((1, n), np.float32) for n, _ in LAYOUT_CHAIN]
    steady = InputVersion()  # constant weights, as params are: packed once

    def chain(packed: bool) -> Callable[[], None]:
        kernels = []
        for w in weights:
            kernel = TeamGemv(1, w.shape[0], w.shape[1], packed=packed)
            kernel.bind_versions({pos: steady for pos in kernel.cached_inputs()})
            kernels.append(kernel)

        def run() -> None:
            for kernel, w, out in zip(kernels, weights, outs):
                kernel(xs[w.shape[1]], w, out)
        return run
    return race({name: sampler(chain(name == "packed"), pause_s=PAUSE_S, wake=wake_team)
                 for name in LAYOUTS})


@team_kernel(reassociate=True)
def _gemv_team(data: Any) -> None:
    """The block holds x, w and out's addresses, m, n, k, the address of its last entry and
    that entry (the first row not yet taken: 0 when the team starts). Each thread takes CHUNK
    rows at a time, eight weight rows summed together in vector lanes: eight streams from
    memory in flight, not one, and no thread left waiting for another whose core is busy."""
    b = carray(data, (BLOCK,), np.int64)
    m, n, k = b[3], b[4], b[5]
    x = float32_at(b[0], (m, k))
    w = float32_at(b[1], (n, k))
    out = float32_at(b[2], (m, n))
    while True:
        j = claim_rows(b[6], CHUNK)
        if j >= n:
            return
        _gemv_rows(x, w, out, m, j, min(j + CHUNK, n))


@team_kernel(reassociate=True)
def _gemv_team_fixed(data: Any) -> None:
    """_gemv_team with each thread taking the same rows at every call (its share of the
    CHUNKs, in order): a weight that stays in the cache between runs stays in the cache of the
    core reading it. On the 2-core AMD EPYC a 512x512 product read from the other core's
    share by taking rows from the counter took 8.8 us, about ONNX Runtime's 6.6 this way."""
    b = carray(data, (BLOCK,), np.int64)
    m, n, k = b[3], b[4], b[5]
    x = float32_at(b[0], (m, k))
    w = float32_at(b[1], (n, k))
    out = float32_at(b[2], (m, n))
    t, size = _thread_num(), _team_size()
    chunks = (n + CHUNK - 1) // CHUNK
    _gemv_rows(x, w, out, m, t * chunks // size * CHUNK,
               min((t + 1) * chunks // size * CHUNK, n))


@inlined
def _gemv_rows(x: Any, w: Any, out: Any, m: int, j: int, end: int) -> None:
    """out[:, j:end] = x @ w[j:end].T, eight weight rows summed together in vector lanes."""
    k = x.shape[1]
    while j + 8 <= end:
        w0, w1, w2, w3 = w[j], w[j + 1], w[j + 2], w[j + 3]
        w4, w5, w6, w7 = w[j + 4], w[j + 5], w[j + 6], w[j + 7]
        for r in range(m):
            xr = x[r]
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
            for i in range(k):
                xi = xr[i]
                s0 += xi * w0[i]
                s1 += xi * w1[i]
                s2 += xi * w2[i]
                s3 += xi * w3[i]
                s4 += xi * w4[i]
                s5 += xi * w5[i]
                s6 += xi * w6[i]
                s7 += xi * w7[i]
            o = out[r]
            o[j], o[j + 1], o[j + 2], o[j + 3] = s0, s1, s2, s3
            o[j + 4], o[j + 5], o[j + 6], o[j + 7] = s4, s5, s6, s7
        j += 8
    for jj in range(j, end):
        for r in range(m):
            out[r, jj] = lane_dot(x[r], w[jj], np.float32(0.0))


@team_kernel(reassociate=True)
def _packed_gemv_team(data: Any) -> None:
    """_gemv_team over the packed weight (pack): the block holds x, the packed weight and out's
    addresses, m, n, k, the counter's address and the counter, here counting blocks of eight
    rows. Each piece of the eight rows is one cache line read once, in order."""
    b = carray(data, (BLOCK,), np.int64)
    m, n, k = b[3], b[4], b[5]
    blocks = (n + PACK_ROWS - 1) // PACK_ROWS
    pieces, whole = (k + PIECE - 1) // PIECE, k // PIECE
    x = float32_at(b[0], (m, k))
    w = float32_at(b[1], (blocks, pieces, PANEL))
    out = float32_at(b[2], (m, n))
    while True:
        first = claim_rows(b[6], CHUNK_BLOCKS)
        if first >= blocks:
            return
        for jb in range(first, min(first + CHUNK_BLOCKS, blocks)):
            p = w[jb]
            row = jb * PACK_ROWS
            for r in range(m):
                xr = x[r]
                s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
                for ii in range(pieces):
                    q = p[ii]
                    at = ii * PIECE
                    for c in range(PIECE if ii < whole else k - at):
                        xi = xr[at + c]
                        s0 += xi * q[c]
                        s1 += xi * q[PIECE + c]
                        s2 += xi * q[2 * PIECE + c]
                        s3 += xi * q[3 * PIECE + c]
                        s4 += xi * q[4 * PIECE + c]
                        s5 += xi * q[5 * PIECE + c]
                        s6 += xi * q[6 * PIECE + c]
                        s7 += xi * q[7 * PIECE + c]
                o = out[r]
                sums = (s0, s1, s2, s3, s4, s5, s6, s7)
                for t in range(min(PACK_ROWS, n - row)):
                    o[row + t] = sums[t]


# oneDNN's layout of a (k, n) matmul weight on AVX-512 ("BA16a64b"), as a primitive's reorder
# leaves it: [n/64][k/16][16 of k][64 of n], both padded (_blocked_gemv_team reads it)
ONEDNN_K_BLOCK, ONEDNN_N_BLOCK = 16, 64


@team_kernel(reassociate=True)
def _blocked_gemv_team(data: Any) -> None:
    """_gemv_team over the copy of the weight a oneDNN matmul keeps in its own layout (the
    prompt's products, reordered once): the block as _gemv_team's, its counter counting blocks
    of 64 output columns. A thread sums each 16 x 64 piece into 64 partial sums a row of x, four
    of its rows at a time: one stream through the piece, the sums vectorised across columns
    (no lane sums to add up), read at the packed layout's speed from memory on the 2-core AMD
    EPYC and 1.65x its speed at four rows (docs/measurements.md)."""
    b = carray(data, (BLOCK,), np.int64)
    m, n, k = b[3], b[4], b[5]
    nblocks = (n + ONEDNN_N_BLOCK - 1) // ONEDNN_N_BLOCK
    kblocks = (k + ONEDNN_K_BLOCK - 1) // ONEDNN_K_BLOCK
    x = float32_at(b[0], (m, k))
    w = float32_at(b[1], (nblocks, kblocks, ONEDNN_K_BLOCK, ONEDNN_N_BLOCK))
    out = float32_at(b[2], (m, n))
    sums = np.empty((m, ONEDNN_N_BLOCK), np.float32)
    while True:
        jb = claim_rows(b[6], 1)
        if jb >= nblocks:
            return
        sums[:] = 0.0
        p = w[jb]
        for kb in range(kblocks):
            q = p[kb]
            at = kb * ONEDNN_K_BLOCK
            whole = at + ONEDNN_K_BLOCK <= k
            for r in range(m):
                xr, acc = x[r], sums[r]
                if whole:
                    for kk in range(0, ONEDNN_K_BLOCK, 4):
                        x0, x1, x2, x3 = xr[at + kk], xr[at + kk + 1], xr[at + kk + 2], \
                            xr[at + kk + 3]
                        q0, q1, q2, q3 = q[kk], q[kk + 1], q[kk + 2], q[kk + 3]
                        for c in range(ONEDNN_N_BLOCK):
                            acc[c] += x0 * q0[c] + x1 * q1[c] + x2 * q2[c] + x3 * q3[c]
                else:  # k's last piece: its rows past k are padding, never read
                    for kk in range(k - at):
                        xv, row = xr[at + kk], q[kk]
                        for c in range(ONEDNN_N_BLOCK):
                            acc[c] += xv * row[c]
        j0 = jb * ONEDNN_N_BLOCK
        for r in range(m):
            o, acc = out[r], sums[r]
            for c in range(min(ONEDNN_N_BLOCK, n - j0)):
                o[j0 + c] = acc[c]


def _onednn_copy(shared: list[Any], n: int, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Among a frozen weight w[n, k]'s derived data, the copy a oneDNN matmul reading it as its
    transposed (k, n) operand reordered into "BA16a64b" (PackedWeight's entries: the user's
    and the chosen descriptors, the buffer): the buffer and its (n/64, k/16, 16, 64) view;
    None if none."""
    from ..onednn.binding import MemoryDesc
    k_pad = -(-k // ONEDNN_K_BLOCK) * ONEDNN_K_BLOCK
    n_pad = -(-n // ONEDNN_N_BLOCK) * ONEDNN_N_BLOCK
    piece = ONEDNN_K_BLOCK * ONEDNN_N_BLOCK
    want = ((k_pad, n_pad), (piece, k_pad // ONEDNN_K_BLOCK * piece),
            ((0, ONEDNN_K_BLOCK), (1, ONEDNN_N_BLOCK)))
    for user, chosen, ref in shared:
        buffer = ref()
        if buffer is None or not isinstance(user, MemoryDesc) or user.shape != (k, n) \
                or buffer.size < k_pad * n_pad:
            continue
        if user == MemoryDesc.strided((k, n), (1, k)) and chosen.blocking() == want:
            return buffer, buffer[:k_pad * n_pad].reshape(
                n_pad // ONEDNN_N_BLOCK, k_pad // ONEDNN_K_BLOCK, ONEDNN_K_BLOCK, ONEDNN_N_BLOCK)
    return None


def pack(w: np.ndarray, out: np.ndarray) -> None:
    """w [n, k] into out [ceil(n/8), ceil(k/16), 128] (_packed_gemv_team's layout): row
    8*jb + r's values 16*ii .. 16*ii + 15 at out[jb, ii, 16*r:16*r + 16], zeros past n and k."""
    n, k = w.shape
    blocks, pieces = out.shape[:2]
    if n % PACK_ROWS or k % PIECE:
        padded = np.zeros((blocks * PACK_ROWS, pieces * PIECE), np.float32)
        padded[:n, :k] = w
        w = padded
    out.reshape(blocks, pieces, PACK_ROWS, PIECE)[...] = \
        w.reshape(blocks, PACK_ROWS, pieces, PIECE).transpose(0, 2, 1, 3)


class TeamGemv(DerivesFromInputs):
    """run(x, w, *tail_inputs, out): out[m, n] = tail(x[m, k] @ w[n, k].T, ...), the product on
    the OpenMP team, then the tail (a chain_jit.CompiledChain over the (m, n) output reading
    its inputs after w; None: the product alone) over the output on the caller. w is read
    packed (pack) while its write counter is bound and not volatile and the machine's layout
    packs (packed None: packs()), else as given."""

    derived = (1,)

    def __init__(self, m: int, n: int, k: int, tail: Any = None,
                 packed: bool | None = None) -> None:
        super().__init__()
        jit_setup.start()
        self.shapes = ((m, k), (n, k), (m, n))
        self.tail = tail
        # in a module keeping its weights in the cache: each thread reads the same rows at
        # every call (_gemv_team_fixed), and the weight as given unless the layout is forced
        self.cached = _CACHED.get()
        if packed is None:
            packed = False if self.cached and settings.word(settings.TEAM_GEMV_LAYOUT) == \
                "auto" else packs()
        self.packs = packed
        self.packed: np.ndarray | None = None  # w packed (its own or a frozen weight's shared)
        # the buffer of a oneDNN matmul's copy of w (its PackedWeight's) that packed views
        # (_onednn_copy), else None: packed is pack's layout
        self._copy: np.ndarray | None = None
        self._own: np.ndarray | None = None  # its own packed buffer, made at first need
        self._owner: tuple[Any, Any] = (None, self)  # (the weight's counter, workspace_owner)
        # per (x, weight read, out) met, by identity: weak references to them (an entry is
        # used only while each still is the array it was made for, and keeps none alive: a
        # shape's buffers go with its module), a block holding their addresses, the block's
        # own address and the kernel's. A module passes the same arrays every run.
        self._bound: dict[tuple[int, ...], tuple[tuple[Any, ...], np.ndarray, int, int]] = {}

    def with_tile_tail(self, tail: Any) -> TeamGemv:
        (m, k), (n, _), _ = self.shapes
        made = TeamGemv(m, n, k, tail, self.packs)
        made.cached = self.cached
        return made

    def note(self) -> str:
        text = "dense of few rows on the OpenMP team" + ("" if self.packs else
                                                         ", weight read as given")
        return text if self.tail is None else text + ", compiled tail " + "+".join(self.tail.ops)

    @property
    def _blocked(self) -> bool:
        """Whether packed is a oneDNN matmul's copy of w (read by _blocked_gemv_team)."""
        return self._copy is not None

    def workspace_bytes(self) -> int:
        """The packed weight (counted whether it is this kernel's or shared) and the tail's."""
        return self._packed_bytes() + self._tail_bytes()

    def workspace_items(self) -> list[tuple[Any, int]]:
        packed, tail = self._packed_bytes(), self._tail_bytes()
        return ([(self.workspace_owner(), packed)] if packed else []) + \
            ([(self, tail)] if tail else [])

    def _packed_bytes(self) -> int:
        return 0 if not self.packs else self.packed.nbytes if self.packed is not None \
            else 4 * int(np.prod(self._packed_shape()))

    def _tail_bytes(self) -> int:
        return 0 if self.tail is None else self.tail.workspace_bytes()

    def _packed_shape(self) -> tuple[int, int, int]:
        """The packed weight's shape (pack): blocks of eight rows, pieces of 16 values."""
        (_, k), (n, _), _ = self.shapes
        return -(-n // PACK_ROWS), -(-k // PIECE), PANEL

    def workspace_owner(self) -> Any:
        """A frozen weight's packed copy is one, whichever kernels read it (a decoder's step at
        each batch size has its own kernel): counted once, by the weight's derived data, or
        where it reads a oneDNN matmul's copy, by that buffer, as the matmul counts it."""
        if self._copy is not None:
            return self._copy
        cell = self._cells[0]
        if self._owner[0] is not cell:  # asked at every new shape: looked up once per counter
            shared = None if cell.volatile else shared_list_watched_by(cell)
            self._owner = (cell, self if shared is None else shared)
        return self._owner[1]

    def bind_versions(self, versions: Mapping[int, InputVersion] | Any) -> None:
        super().bind_versions(versions)
        # packed again at the next call, from the weight bound then (a oneDNN copy it read
        # is let go with it)
        self.packed = self._copy = None

    def __call__(self, a: Any, b: Any, *rest: Any) -> None:
        out = rest[-1]
        weight = self._weight(b)
        made = self._bound.get((id(a), id(weight), id(out)))
        if made is None or made[0][0]() is not a or made[0][1]() is not weight \
                or made[0][2]() is not out:
            made = self._bind(a, weight, out)
        if made is None:
            self._copying_product(a, weight, out)
        else:
            made[1][COUNTER] = 0  # no row taken yet
            if replay.active is not None:
                replay.active.team(made[3], made[1], made[2] + COUNTER * made[1].itemsize)
                replay.note_arrays([a, weight, out])
            run_at(made[3], made[2])
            if replay.active is not None and replay.active.here() is not None:
                self._recorded(rest)
                return
        if self.tail is not None:
            # its rows as one block on this thread: a tail's own call may hand a wide output
            # (8 rows of a vocabulary) to the runtime's workers, beside the team's spinning
            m, n = self.shapes[2]
            self.tail.run_block(0, m, 0, n, n, self.tail.flat_arrays(rest))

    def reading_nhwc(self, position: int, shape: tuple[int, ...]) -> Any:
        """This product reading its features (position 0, an (m, C, H, W) tensor flattened)
        from their NHWC bytes, on a permuted copy of the weight where that pays
        (nhwc_features.py): the flatten before it is then skipped (runtime/flatten_reads.py)."""
        (m, k), (n, _), _ = self.shapes
        if (position != 0 or len(shape) != 4 or shape[0] != m
                or shape[1] * shape[2] * shape[3] != k or not permuting_pays(m, n, k, 4)):
            return None
        return NhwcFeaturesTeamGemv(self, (shape[1], shape[2], shape[3]))

    def _recorded(self, rest: tuple[Any, ...]) -> None:
        """The rest of a call while a replay records (kernels/replay.py): the tail as the
        chain's own call over its arrays (its team function on this thread: the same loop as
        run_block over every row); vouched for where that was recorded too."""
        if self.tail is None or replay.vouched(self.tail, *rest):
            replay.whole_call(self)

    def _weight(self, b: Any) -> Any:
        """The weight as read this call: packed when it keeps its values between runs (packed
        again when its counter moved), else b itself."""
        if not self.packs or any(cell.volatile for cell in self._cells):
            return b
        if self._stale() or self.packed is None:
            self.packed = self._packed_from(b)
        return self.packed

    def _packed_from(self, b: Any) -> np.ndarray:
        """b packed: a frozen weight's copy a oneDNN matmul keeps in its blocked layout (the
        prompt's products reordered it: read as it is, no second copy made), else its shared
        copy in pack's layout where one is made, else this kernel's own (made once) filled
        from b and offered to the others."""
        (_, k), (n, _), _ = self.shapes
        shape = self._packed_shape()
        shared = derived_of(b)
        self._copy = None
        if shared is not None:
            copy = _onednn_copy(shared, n, k)
            if copy is not None:
                self._copy = copy[0]
                return copy[1]
            for tag, key, ref in shared:
                buffer = ref()
                if tag == PACKED_TAG and key == shape and buffer is not None:
                    return buffer
        if self._own is None:
            size = int(np.prod(shape))
            self._own = aligned_buffer(size * 4)[:size].reshape(shape)
        pack(np.asarray(b, np.float32).reshape(n, k), self._own)
        if shared is not None:
            shared[:] = [item for item in shared if item[2]() is not None]
            shared.append((PACKED_TAG, shape, weakref.ref(self._own)))
        return self._own

    def _bind(self, x: Any, w: Any, out: Any
              ) -> tuple[tuple[Any, ...], np.ndarray, int, int] | None:
        """A block pointing at the arrays read and written in place (float32, C-contiguous),
        kept with its address, so that a call on the same arrays (every run of a module) skips
        the copies' checks and the address lookups (about 5 us less a call, 29 calls a LLaMA
        decode step); None where x, w or out would need a copy. A tail's inputs are not in it
        (read anew each call)."""
        if not all(isinstance(v, np.ndarray) and v.dtype == np.float32 and v.flags.c_contiguous
                   for v in (x, w, out)):
            return None
        block = self._block(x, w, out)
        if len(self._bound) >= BOUND_KEPT:
            self._bound.clear()
        made = self._bound[(id(x), id(w), id(out))] = (
            (weakref.ref(x), weakref.ref(w), weakref.ref(out)), block, block.ctypes.data,
            self._kernel(w).address)
        return made

    def _kernel(self, w: np.ndarray) -> Any:
        """The team kernel reading w: the packed layout's for this kernel's packed weight."""
        if w is self.packed:
            return _blocked_gemv_team() if self._blocked else _packed_gemv_team()
        return _gemv_team_fixed() if self.cached else _gemv_team()

    def _copying_product(self, a: Any, b: Any, out: Any) -> None:
        """The product of operands that are not all float32 C-contiguous arrays: copied to be
        read by address, the result copied back into out."""
        x = np.ascontiguousarray(a, np.float32)
        w = b if b is self.packed and b is not None else np.ascontiguousarray(b, np.float32)
        if out.flags.c_contiguous and out.dtype == np.float32:
            y = out
        else:
            y = np.empty(self.shapes[2], np.float32)
        run_on_team(self._kernel(w), self._block(x, w, y))
        if y is not out:
            out[...] = y.reshape(out.shape)

    def _block(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The team kernel's block for these arrays, its row counter at 0."""
        (m, k), (n, _), _ = self.shapes
        block = np.zeros(BLOCK, np.int64)
        block[:6] = (address_of(x), address_of(w), address_of(out), m, n, k)
        block[6] = address_of(block) + COUNTER * block.itemsize
        return block


class NhwcFeaturesTeamGemv(PermutedWeightProduct):
    """run(features, weight, *tail_inputs, out) as `product` (a TeamGemv) computes it, features
    (m, H*W*C) NHWC: the product on a copy of the weight with its K columns in H, W, C order
    (packed again as the product's own weight, where it packs, when the copy is made again)."""

    def __init__(self, product: TeamGemv, chw: tuple[int, int, int]) -> None:
        (m, k), (n, _), _ = product.shapes
        inner = TeamGemv(m, n, k, product.tail, product.packs)
        inner.cached = product.cached
        super().__init__(inner, aligned_buffer(4 * n * k)[:n * k].reshape(n, k), chw,
                         weight_trans_b=True, permuted_trans_b=True)
