"""Numba-compiled row kernels for the CPU: layer_norm, rms_norm and softmax over the last axis in
one pass, group_norm (and instance_norm) per (image, group) row in two; on oneDNN's OpenMP team
(omp_team.py) where its threads hold the cores.

NumPy's layer_norm made seven passes over the data (copy, mean, subtract, square, mean, divide,
scale) and softmax five; here each row is read once into cache and made there, sums in float64
for float32 rows. Rows are cut into ranges for the runtime's workers when there are many
(threads.py; the functions release the GIL). Machine code is cached beside this file, as in
loops_jit.py. Used for float32/float64 rows over the last axis; other cases keep NumPy.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numba
import numpy as np
from numba import carray, types
from numba.extending import overload

from . import jit_setup
from .. import replay
from .fast_math import _bits_of_float, _float_of_bits, as_type_of, exp_neg32, softmax_exp_as
from .loops_jit import compiled, inlined, reassociating
from .omp_team import (available, block, float32_at, my_rows, recording_here, run_here,
                       run_on_team, team_arrays, team_kernel)
from .vector_width import wide_rows, wide_vectors
from ..threads import num_threads, parallel_rows
from ...prepared import AnyShape

# Row elements x rows above which the rows go to the workers.
PARALLEL_ELEMENTS = 1 << 17
# ... or from this many to oneDNN's OpenMP team, whose start is about 7 us: MobileViT's layer
# norm of 1,024 rows of 64 took 105 us on one core and 50 on the team; at 6,144 elements the
# team's start costs more than it saves (11 against 19 us).
TEAM_ELEMENTS = 1 << 15


@reassociating
def _row_sum(row: Any) -> float:
    """sum(row) in float64, summed in vector lanes (2x faster layer norms than four scalar
    accumulators: 3.7 against 7.2 us on 64 rows of 128, load 3)."""
    total = 0.0
    for j in range(row.shape[0]):
        total += row[j]
    return total


@reassociating
def _row_squares(row: Any, mean: float) -> float:
    """sum((row - mean) ** 2) in float64, in vector lanes."""
    total = 0.0
    for j in range(row.shape[0]):
        d = row[j] - mean
        total += d * d
    return total


@compiled
def _layer_norm_rows(x: Any, gamma: Any, beta: Any, out: Any, eps: float, lo: int,
                     hi: int) -> None:
    n = x.shape[1]
    for r in range(lo, hi):
        row = x[r]
        mean = _row_sum(row) / n
        inv = 1.0 / math.sqrt(_row_squares(row, mean) / n + eps)
        # the statistics in float64, the row made in its own type: a float32 row's loop at
        # full vector width (ViT-small's 197 rows of 192: 28 -> 19 us, error 1e-7 -> 5e-7)
        m, s = as_type_of(mean, row[0]), as_type_of(inv, row[0])
        for j in range(n):
            out[r, j] = (row[j] - m) * s * gamma[j] + beta[j]


@compiled
def _rms_norm_rows(x: Any, gamma: Any, out: Any, eps: float, lo: int, hi: int) -> None:
    n = x.shape[1]
    for r in range(lo, hi):
        row = x[r]
        inv = as_type_of(1.0 / math.sqrt(_row_squares(row, 0.0) / n + eps), row[0])
        for j in range(n):
            out[r, j] = row[j] * inv * gamma[j]


@compiled
def _group_norm_rows(x: Any, scale: Any, bias: Any, out: Any, eps: float, groups: int,
                     spatial: int, lo: int, hi: int) -> None:
    """Rows r of x (n * groups, channels per group * spatial): each normalized over itself,
    then scaled and shifted per channel, in two passes over the row."""
    n = x.shape[1]
    per_group = n // spatial if spatial else 0
    for r in range(lo, hi):
        row = x[r]
        orow = out[r]
        mean = _row_sum(row) / n
        inv = 1.0 / math.sqrt(_row_squares(row, mean) / n + eps)
        m, s = as_type_of(mean, row[0]), as_type_of(inv, row[0])
        for cc in range(per_group):
            c = (r % groups) * per_group + cc
            sc = scale[c]
            sh = bias[c]
            seg = row[cc * spatial:(cc + 1) * spatial]
            oseg = orow[cc * spatial:(cc + 1) * spatial]
            for j in range(spatial):
                oseg[j] = (seg[j] - m) * s * sc + sh


@inlined
def _row_max(row: Any) -> float:
    """max(row) of a row of at least one element, NaNs skipped (NaN if all are).

    NOTE: eight accumulators side by side, which LLVM's SLP pass turns into one vector max:
    LLVM vectorizes no float reduction loop without fastmath (2.6x slower with four scalar
    ones on 200-wide rows).
    """
    n = row.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = row[0]  # in the row's own type
    j = 0
    while j + 8 <= n:
        a0 = row[j]
        a1 = row[j + 1]
        a2 = row[j + 2]
        a3 = row[j + 3]
        a4 = row[j + 4]
        a5 = row[j + 5]
        a6 = row[j + 6]
        a7 = row[j + 7]
        m0 = a0 if a0 > m0 else m0
        m1 = a1 if a1 > m1 else m1
        m2 = a2 if a2 > m2 else m2
        m3 = a3 if a3 > m3 else m3
        m4 = a4 if a4 > m4 else m4
        m5 = a5 if a5 > m5 else m5
        m6 = a6 if a6 > m6 else m6
        m7 = a7 if a7 > m7 else m7
        j += 8
    while j < n:
        a0 = row[j]
        m0 = a0 if a0 > m0 else m0
        j += 1
    m0 = m0 if m0 > m1 else m1
    m2 = m2 if m2 > m3 else m3
    m4 = m4 if m4 > m5 else m5
    m6 = m6 if m6 > m7 else m7
    m0 = m0 if m0 > m2 else m2
    m4 = m4 if m4 > m6 else m6
    return m0 if m0 > m4 else m4


def row_max_as(row: Any) -> float:
    """max(row) for softmax: the largest non-NaN value, or a NaN (the softmax row is NaN
    either way then); float32 rows compare IEEE bits as integers, which vectorizes."""
    return max(row)


@overload(row_max_as, inline="always")
def _row_max_as(row: Any) -> Any:
    if isinstance(row.dtype, types.Float) and row.dtype.bitwidth == 32:
        def bits(row: Any) -> Any:
            return _row_max_bits(row)
        return bits

    def floats(row: Any) -> Any:
        return _row_max(row)
    return floats


@inlined
def _row_max_bits(row: Any) -> Any:
    """max of a float32 row by ordered integer keys (the bits with the magnitude flipped for
    negatives: -NaN < -inf < ... < -0 < +0 < ... < inf < NaN): an integer max reduction,
    which LLVM vectorizes where the float one (NaN-aware selects) stays scalar, 3x faster."""
    top = np.int64(-2147483648)
    for j in range(row.shape[0]):
        b = np.int64(_bits_of_float(row[numba.uint64(j)]))  # type: ignore[call-arg]
        key = b ^ ((b >> 31) & 0x7FFFFFFF)
        top = key if key > top else top
    bits = top ^ ((top >> 31) & 0x7FFFFFFF)
    return _float_of_bits(np.int32(bits))  # type: ignore[call-arg]


def exp_sum_as(row: Any, top: Any, scale: Any, exp_sum32: Any) -> float:
    """row[j] = exp((row[j] - top) * scale) in place, and their sum (softmax's numerator and
    denominator): for float32 rows one loop (exp_sum32: _exp_sum32 or _exp_sum32_wide), else
    the exp, then _row_sum."""
    for j in range(row.shape[0]):
        row[j] = math.exp((row[j] - top) * scale)
    return float(row.sum())


@overload(exp_sum_as, inline="always")
def _exp_sum_as(row: Any, top: Any, scale: Any, exp_sum32: Any) -> Any:
    if isinstance(row.dtype, types.Float) and row.dtype.bitwidth == 32:
        def narrow(row: Any, top: Any, scale: Any, exp_sum32: Any) -> Any:
            return exp_sum32(row, top, scale)
        return narrow

    def other_floats(row: Any, top: Any, scale: Any, exp_sum32: Any) -> Any:
        for j in range(row.shape[0]):
            row[j] = softmax_exp_as((row[j] - top) * scale, row[j])
        return _row_sum(row)
    return other_floats


@inlined
def _exp_sum32_loop(row: Any, top: Any, scale: Any) -> Any:
    total = np.float32(0.0)
    for j in range(row.shape[0]):
        e = exp_neg32(np.float32((row[j] - top) * scale))
        row[j] = e
        total += e
    return total


@reassociating
def _exp_sum32(row: Any, top: Any, scale: Any) -> Any:
    """exp_sum_as of a float32 row: each exp summed as it is stored, in float32 vector lanes
    (16 partial sums of a few terms each, as ONNX Runtime's MLAS sums its softmax). One pass
    where the exp, then a float64 sum, took two: 4,096 rows of 256 in 521 against 607 us on one
    core, each value within the same 4e-6 of a float64 softmax (docs/measurements.md)."""
    return _exp_sum32_loop(row, top, scale)


@reassociating
def _exp_sum32_wide(row: Any, top: Any, scale: Any) -> Any:
    """_exp_sum32 in 512-bit vectors where the machine takes them (vector_width.py)."""
    wide_vectors()
    return _exp_sum32_loop(row, top, scale)


@inlined
def softmax_row(row: Any, nan_to_zero: bool, scale: Any, exp_sum32: Any) -> None:
    """row = softmax(row * scale) in place, for scale > 0 of the row's type, as NumPy's (a NaN,
    or -inf everywhere, gives NaN; then 0 with nan_to_zero). exp_sum32: _exp_sum32, or in a
    function marked wide_vectors() _exp_sum32_wide (its loops are then all 16 lanes wide).

    A NaN makes the whole row NaN as in NumPy, through its exp and so the sum, whatever the
    max made of it (as does an inf, whose x - max is NaN). The max and the exp with its sum
    are loops of their own so that each vectorizes (for float32 an integer max of the bits,
    then fast_math.exp_neg32 summed as it is stored, in float32 lanes: exp_sum_as).
    """
    n = row.shape[0]
    if n == 0:
        return
    top = row_max_as(row)
    # NOTE: 1 / sum rounded to the row's type: a float64 multiplier took the normalizing loop
    # from 2.4 to ~10 us over Whisper's 400 rows of 200 (half the vector width)
    inv = as_type_of(1.0 / exp_sum_as(row, top, scale, exp_sum32), top)
    for j in range(n):
        p = row[j] * inv
        if nan_to_zero and p != p:
            p = 0.0
        row[j] = p


@inlined
def _softmax_rows_with(x: Any, out: Any, lo: int, hi: int, one: Any, exp_sum32: Any) -> None:
    n = x.shape[1]
    for r in range(lo, hi):
        row = out[r]
        for j in range(n):
            row[j] = x[r, j]
        softmax_row(row, False, one, exp_sum32)


@compiled
def _softmax_rows(x: Any, out: Any, lo: int, hi: int, one: Any) -> None:
    _softmax_rows_with(x, out, lo, hi, one, _exp_sum32)


@compiled
def _softmax_rows_wide(x: Any, out: Any, lo: int, hi: int, one: Any) -> None:
    wide_vectors()
    _softmax_rows_with(x, out, lo, hi, one, _exp_sum32_wide)


# The same loops on oneDNN's OpenMP team (omp_team.py), float32 rows. Each block starts with
# x, out, rows and width (_team_rows), then the kernel's own entries (floats as float64 bits).
@inlined
def _team_rows(b: Any) -> tuple[Any, Any, int, int]:
    """x and out of a team kernel's block, and the calling thread's rows [lo, hi)."""
    rows, width = b[2], b[3]
    lo, hi = my_rows(rows)
    return float32_at(b[0], (rows, width)), float32_at(b[1], (rows, width)), lo, hi


@team_kernel
def _layer_norm_team(data: Any) -> None:
    b = carray(data, (7,), np.int64)
    x, out, lo, hi = _team_rows(b)
    _layer_norm_rows(x, float32_at(b[4], (b[3],)), float32_at(b[5], (b[3],)), out,
                     b[6:7].view(np.float64)[0], lo, hi)


@team_kernel
def _rms_norm_team(data: Any) -> None:
    b = carray(data, (6,), np.int64)
    x, out, lo, hi = _team_rows(b)
    _rms_norm_rows(x, float32_at(b[4], (b[3],)), out, b[5:6].view(np.float64)[0], lo, hi)


@team_kernel
def _group_norm_team(data: Any) -> None:
    b = carray(data, (10,), np.int64)
    x, out, lo, hi = _team_rows(b)
    channels = b[9]
    _group_norm_rows(x, float32_at(b[4], (channels,)), float32_at(b[5], (channels,)), out,
                     b[6:7].view(np.float64)[0], b[7], b[8], lo, hi)


@team_kernel
def _softmax_team(data: Any) -> None:
    x, out, lo, hi = _team_rows(carray(data, (4,), np.int64))
    _softmax_rows(x, out, lo, hi, np.float32(1))


@team_kernel
def _softmax_team_wide(data: Any) -> None:
    x, out, lo, hi = _team_rows(carray(data, (4,), np.int64))
    _softmax_rows_wide(x, out, lo, hi, np.float32(1))


def on_team(rows: int, width: int) -> bool:
    """Whether a kernel made now splits these rows over oneDNN's OpenMP team (float32 arrays)."""
    return on_team_size(rows, width) and available()


def on_team_size(rows: int, width: int) -> bool:
    """Whether rows of width are enough work for oneDNN's OpenMP team (on_team, its mode aside:
    a kernel asks that once when made)."""
    return rows * width >= TEAM_ELEMENTS and rows > 1


class OtherPath:
    """The compiled code of the path a size other than a kernel's takes, loaded at the kernel's
    first run where a symbolic module runs (`pending`; jit_setup.load_ahead): the function run
    on the calling thread, with that run's argument types, where the rows go to oneDNN's team;
    the team's otherwise (float32 rows alone go there)."""

    def __init__(self, team_function: Callable[[], Any], rows_function: Any) -> None:
        self.pending = jit_setup.other_sizes_expected()
        self.team_function, self.rows_function = team_function, rows_function

    def load(self, team: bool, *args: Any) -> None:
        """Load the other path, given whether this run went to the team and the arguments the
        calling thread's function takes (the first an array of the rows)."""
        self.pending = False
        if team:
            jit_setup.load_ahead(self.rows_function, *args)
        elif available() and args[0].dtype == np.float32:
            self.team_function()


def _split(rows: int, width: int, call: Callable[[int, int], None]) -> Callable[[], None]:
    workers = num_threads() if _spread(rows, width) else 1
    return lambda: parallel_rows(rows, workers, call)


def _spread(rows: int, width: int) -> bool:
    """Whether rows of width are enough work for the runtime's workers."""
    return rows * width >= PARALLEL_ELEMENTS and rows > 1


def _by_block(team: bool, rows: int, width: int, kernel: Callable[[], Any],
              arrays: tuple[Any, ...], values: tuple[Any, ...]) -> bool:
    """Run kernel (a team kernel) on block(*values): on the OpenMP team where team, and while
    a replay records (kernels/replay.py) on the calling thread alone where the rows would run
    there anyway, so that the call can be replayed; True where it ran, False where the
    caller's own loop is to run (arrays not all float32 C-contiguous, or no block path)."""
    if not team_arrays(*arrays):
        return False
    if team:
        run_on_team(kernel(), block(*values))
        return True
    if not _spread(rows, width) and recording_here():
        run_here(kernel(), block(*values))
        return True
    return False


class RowKernel(AnyShape):
    """A row op over the last axis reading its arrays' rows and width at each call: one kernel
    serves every shape of its rank that is not empty (a symbolic module keeps it by size class
    instead of preparing a norm per new prompt shape: a LLaMA stream's 31 shapes made 31).
    Its run returns True where the call was one team kernel on a block (replay.whole_call)."""

    def __call__(self, *arrays: Any) -> None:
        if self.run(*arrays) and replay.active is not None and replay.contiguous(arrays):
            replay.whole_call(self)

    def serves(self, shapes: Sequence[tuple[int, ...]]) -> bool:
        return all(int(d) > 0 for shape in shapes for d in shape)


def _rows_of(x: Any) -> tuple[int, int]:
    """(rows, width) of x seen as rows over its last axis."""
    width = int(x.shape[-1]) if x.ndim else 1
    return x.size // width, width


def layer_norm_rows(shape: tuple[int, ...], epsilon: float, center: bool, scale: bool
                    ) -> RowKernel:
    """run(x, gamma, beta, out) normalizing over the last axis (any shape: shape is the first
    one, whose width decides the ones standing in for a missing gamma or beta)."""
    jit_setup.start()
    team_ok = available()
    ahead = OtherPath(_layer_norm_team, _layer_norm_rows)
    filled: dict[tuple[int, Any], tuple[Any, Any]] = {}  # (width, dtype): stand-ins

    def run(x: Any, gamma: Any, beta: Any, out: Any) -> bool:
        rows, width = _rows_of(x)
        if scale and center:
            g, b = gamma, beta
        else:
            ones = filled.get((width, x.dtype))
            if ones is None:
                ones = filled[(width, x.dtype)] = (np.ones(width, x.dtype),
                                                   np.zeros(width, x.dtype))
            g, b = gamma if scale else ones[0], beta if center else ones[1]
        x2 = x.reshape(rows, width)
        o2 = out.reshape(rows, width)
        team = team_ok and on_team_size(rows, width)
        if ahead.pending:
            ahead.load(team, x2, g, b, o2, epsilon, 0, 0)
        if _by_block(team, rows, width, _layer_norm_team, (x2, g, b, o2),
                     (x2, o2, rows, width, g, b, float(epsilon))):
            return True
        _split(rows, width, lambda lo, hi: _layer_norm_rows(x2, g, b, o2, epsilon, lo, hi))()
        return False
    return RowKernel(run)


def rms_norm_rows(shape: tuple[int, ...], epsilon: float) -> RowKernel:
    """run(x, gamma, out): x / sqrt(mean(x^2) + epsilon) * gamma over the last axis (any
    shape)."""
    jit_setup.start()
    team_ok = available()
    ahead = OtherPath(_rms_norm_team, _rms_norm_rows)

    def run(x: Any, gamma: Any, out: Any) -> bool:
        rows, width = _rows_of(x)
        x2 = x.reshape(rows, width)
        o2 = out.reshape(rows, width)
        team = team_ok and on_team_size(rows, width)
        if ahead.pending:
            ahead.load(team, x2, gamma, o2, epsilon, 0, 0)
        if _by_block(team, rows, width, _rms_norm_team, (x2, gamma, o2),
                     (x2, o2, rows, width, gamma, float(epsilon))):
            return True
        _split(rows, width, lambda lo, hi: _rms_norm_rows(x2, gamma, o2, epsilon, lo, hi))()
        return False
    return RowKernel(run)


def softmax_rows(shape: tuple[int, ...]) -> RowKernel:
    """run(x, out): softmax over the last axis (any shape)."""
    jit_setup.start()
    ones: dict[Any, Any] = {}  # 1 in each dtype: a float64 one would widen float32 arithmetic
    team_ok = available()
    # (team kernel, rows function, the other path ahead) by vector width (wide_rows)
    paths = {wide: (team_fn, rows_fn, OtherPath(team_fn, rows_fn)) for wide, team_fn, rows_fn in
             ((False, _softmax_team, _softmax_rows), (True, _softmax_team_wide,
                                                      _softmax_rows_wide))}

    def run(x: Any, out: Any) -> bool:
        rows, width = _rows_of(x)
        x2 = x.reshape(rows, width)
        o2 = out.reshape(rows, width)
        one = ones.get(x.dtype)
        if one is None:
            one = ones[x.dtype] = x.dtype.type(1)
        team = team_ok and on_team_size(rows, width)
        team_fn, rows_fn, ahead = paths[wide_rows(width)]
        if ahead.pending:
            ahead.load(team, x2, o2, 0, 0, one)
        if _by_block(team, rows, width, team_fn, (x2, o2), (x2, o2, rows, width)):
            return True
        _split(rows, width, lambda lo, hi: rows_fn(x2, o2, lo, hi, one))()
        return False
    return RowKernel(run)


def group_norm_rows(n: int, channels: int, groups: int, spatial: int, epsilon: float
                    ) -> Callable[..., None]:
    """run(x, scale, bias, out) for group_norm (instance_norm: groups == channels) over data of
    shape (n, channels, *spatial)."""
    jit_setup.start()
    rows = n * groups
    width = channels // groups * spatial
    # with oneDNN's OpenMP threads holding the cores (wav2vec2's convolutions) the workers are
    # one: its front end's instance norm of 128 rows of 3199 ran on one core (0.28 ms)
    team = on_team(rows, width)
    ahead = OtherPath(_group_norm_team, _group_norm_rows)

    def run(x: Any, scale: Any, bias: Any, out: Any) -> None:
        x2 = x.reshape(rows, width)
        o2 = out.reshape(rows, width)
        if ahead.pending:
            ahead.load(team, x2, scale, bias, o2, epsilon, groups, spatial, 0, 0)
        if team and team_arrays(x2, scale, bias, o2):
            run_on_team(_group_norm_team(), block(x2, o2, rows, width, scale, bias,
                                                  float(epsilon), groups, spatial, channels))
            return
        _split(rows, width, lambda lo, hi: _group_norm_rows(x2, scale, bias, o2, epsilon,
                                                             groups, spatial, lo, hi))()
    return run
