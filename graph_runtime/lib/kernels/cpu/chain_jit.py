"""Compiled fused chains: a CPU chain's elementwise tail generated as one numba loop.

A chain run as NumPy ufuncs makes one pass over memory per op, and exact GELU on a ViT's
197x768 values took 1.1 ms that way (issue 22). Here the tail is written out as Python source, one
line per op in that op's own dtype (so float32 values round as NumPy's would after every op),
compiled by numba once per signature (ops, attrs, dtypes, which inputs broadcast and how) and kept
on disk: the source goes to a file named by its hash in the cache directory and numba's cache=True
keeps the machine code beside it, so a later process loads it instead of compiling. Inputs are
read flat: those with the output's shape at the element's index, broadcast ones through their
strides over the output's collapsed dimensions (an input constant along the innermost one is read
once per row), 1-element ones once. Large tensors are cut into ranges handed to the runtime's
workers (threads.py; the functions release the GIL), as loops_jit.py does rather than numba's
own parallel=True pool; it does not claim uses_workers(), which would hold OpenBLAS at one
thread for the whole graph and halve the transformers' GEMMs. A tail with an op or dtype not in
PY_EXPRS keeps the NumPy path.

GRAPH_RUNTIME_CHAIN_JIT=off turns it off; GRAPH_RUNTIME_CACHE_DIR moves the cache (settings.py).
"""
from __future__ import annotations

import hashlib
import math
import importlib.util
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from .... import settings
from ...._lru import LruCache
from ....errors import LibraryError
from ...attrs import float_attr, str_attr
from ...library import TensorSpec
from ...prepared import PreparedKernel
from ...shapes import size_of
from . import jit_setup
from .jit_cache import install, sources_digest
from ..threads import num_threads, parallel_items
from .. import replay
from .omp_team import available as team_available, block, recording_here, run_here, run_on_team
from .vector_width import wide_rows

install()  # before any cache=True function here (jit_cache.py)

# Part of every generated source, so its hash (the cache key) changes when the helpers the
# generated code calls do: numba's cache only watches the generated file itself.
VERSION = 3
FLOATS = ("float32", "float64")
log = logging.getLogger(__name__)
INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_SQRT1_2 = "0.7071067811865476"
_SQRT_2_PI = "0.7978845608028654"
# Ops costing a few times a multiply per element: they decide when to use both cores.
HEAVY = frozenset({"erf", "tanh", "exp", "log", "gelu", "sigmoid", "silu", "power", "sqrt"})
# Of them, the rational erf and tanh (erf32, tanh32: a division and a dozen multiply-adds, about
# 0.7 ns an element on one core): wav2vec2's GELU over 128 x 1599 took 147 us on one core, under
# PARALLEL_WORK at the weight of exp, and 1.6x less on two.
RATIONAL = frozenset({"erf", "tanh", "gelu"})
# Elements x weight above which a tail runs on the workers (below, the hand-off costs more).
PARALLEL_WORK = 1 << 21
# Array types a chain's team function reads (array_at takes a NumPy number class).
TEAM_DTYPES = frozenset({"float32", "float64", "int32", "int64"})
# Shapes a compiled chain keeps its geometry for (CompiledChain.at: a decoder's lengths met last).
SHAPES_KEPT = 64


def _gelu(attrs: Mapping[str, Any], dtype: str) -> str:
    if str_attr("gelu", attrs, "approximate", "none", ("none", "tanh")) == "tanh":
        inner = f"{{T}}({_SQRT_2_PI}) * ({{0}} + {{T}}(0.044715) * {{0}} * {{0}} * {{0}})"
        return f"{{T}}(0.5) * {{0}} * ({{T}}(1) + math.tanh({inner}))"
    return f"{{T}}(0.5) * {{0}} * ({{T}}(1) + math.erf({{0}} * {{T}}({_SQRT1_2})))"


def _clip(attrs: Mapping[str, Any], dtype: str) -> str:
    lo = float_attr("clip", attrs, "a_min")
    hi = float_attr("clip", attrs, "a_max")
    if dtype in INTS:  # as the host kernel: bounds held to the type (a bound past it is none)
        info = np.iinfo(dtype)
        lo = -np.inf if lo <= info.min else float(math.ceil(lo))
        hi = np.inf if hi >= info.max else float(math.floor(hi))
    expr = "{0}"
    if np.isfinite(hi):
        expr = f"({{T}}({hi!r}) if {{0}} > {hi!r} else {expr})"
    if np.isfinite(lo):
        expr = f"({{T}}({lo!r}) if {{0}} < {lo!r} else {expr})"
    return expr


def _fixed(template: str) -> Callable[[Mapping[str, Any], str], str]:
    return lambda attrs, dtype: template


# op -> (expr(attrs, input-0 dtype) -> Python expression over {0}, {1}... and {T} (the result's
# scalar type), input dtypes it is compiled for). Each mirrors the op's NumPy kernel, NaN included.
PY_EXPRS: dict[str, tuple[Callable[[Mapping[str, Any], str], str], tuple[str, ...]]] = {
    "add": (_fixed("{0} + {1}"), FLOATS + INTS),
    "subtract": (_fixed("{0} - {1}"), FLOATS + INTS),
    "multiply": (_fixed("{0} * {1}"), FLOATS + INTS),
    "divide": (_fixed("{0} / {1}"), FLOATS),
    "power": (_fixed("{0} ** {1}"), FLOATS),
    "maximum": (_fixed("({0} if ({0} != {0} or {0} > {1}) else {1})"), FLOATS + INTS),
    "minimum": (_fixed("({0} if ({0} != {0} or {0} < {1}) else {1})"), FLOATS + INTS),
    "negative": (_fixed("-{0}"), FLOATS + INTS),
    "exp": (_fixed("math.exp({0})"), FLOATS),
    "log": (_fixed("math.log({0})"), FLOATS),
    "sqrt": (_fixed("math.sqrt({0})"), FLOATS),
    "tanh": (_fixed("math.tanh({0})"), FLOATS),
    "erf": (_fixed("math.erf({0})"), FLOATS),
    "sigmoid": (_fixed("{T}(0.5) * math.tanh({T}(0.5) * {0}) + {T}(0.5)"), FLOATS),
    "silu": (_fixed("{0} * ({T}(0.5) * math.tanh({T}(0.5) * {0}) + {T}(0.5))"), FLOATS),
    "relu": (_fixed("({T}(0) if {0} < 0 else {0})"), FLOATS + INTS),
    "abs": (_fixed("({T}(-{0}) if {0} < 0 else {0})"), FLOATS + INTS),
    "reciprocal": (_fixed("{T}(1) / {0}"), FLOATS),
    "copy": (_fixed("{0}"), FLOATS + INTS + ("bool",)),
    "gelu": (_gelu, FLOATS),
    "clip": (_clip, FLOATS + INTS),
    "round": (_fixed("np.rint({0})"), FLOATS),
    "where": (_fixed("({1} if {0} else {2})"), ("bool",)),
    "equal": (_fixed("{0} == {1}"), FLOATS + INTS + ("bool",)),
    "not_equal": (_fixed("{0} != {1}"), FLOATS + INTS + ("bool",)),
    "less": (_fixed("{0} < {1}"), FLOATS + INTS),
    "less_equal": (_fixed("{0} <= {1}"), FLOATS + INTS),
    "greater": (_fixed("{0} > {1}"), FLOATS + INTS),
    "greater_equal": (_fixed("{0} >= {1}"), FLOATS + INTS),
    "logical_not": (_fixed("not {0}"), ("bool",)),
    "logical_and": (_fixed("{0} and {1}"), ("bool",)),
    "logical_or": (_fixed("{0} or {1}"), ("bool",)),
    "isnan": (_fixed("{0} != {0}"), FLOATS),
    "cast": (_fixed("{0}"), FLOATS + INTS + ("bool",)),
}
# float32 erf and tanh as rational functions (Eigen's and XLA's float kernels): branch-free, so
# LLVM vectorizes the loop around them, where libm's erff/tanhf are one call per element. Their
# error is a few float32 ulps (tests/lib/test_chain_jit.py bounds it against float64). Horner's
# steps are fused multiply-adds (fast_math.mul_add: the exact GELU chain took 0.55-0.85x the
# time on one thread). Past 4 and 7.905 the result is exactly +-1 (float32's erf there; tanh's
# within 5 ulps), so that GELU(-inf) is NaN as NumPy's -inf * 0 (with fused steps the rational
# tanh came out just under 1 there); that select is the only clamp the inputs need.
HELPERS = """\
@numba.njit(inline='always', cache=True, error_model='numpy')
def erf32(v):
    x2 = v * v
    p = mul_add(x2, np.float32(-2.72614225801306e-10), np.float32(2.77068142495902e-08))
    p = mul_add(x2, p, np.float32(-2.10102402082508e-06))
    p = mul_add(x2, p, np.float32(-5.69250639462346e-05))
    p = mul_add(x2, p, np.float32(-7.34990630326855e-04))
    p = mul_add(x2, p, np.float32(-2.95459980854025e-03))
    p = mul_add(x2, p, np.float32(-1.60960333262415e-02))
    q = mul_add(x2, np.float32(-1.45660718464996e-05), np.float32(-2.13374055278905e-04))
    q = mul_add(x2, q, np.float32(-1.68282697438203e-03))
    q = mul_add(x2, q, np.float32(-7.37332916720468e-03))
    q = mul_add(x2, q, np.float32(-1.42647390514189e-02))
    r = np.float32(v * p / q)
    return np.float32(1.0) if v > 4.0 else (np.float32(-1.0) if v < -4.0 else r)


@numba.njit(inline='always', cache=True, error_model='numpy')
def tanh32(v):
    x2 = v * v
    p = mul_add(x2, np.float32(-2.76076847742355e-16), np.float32(2.00018790482477e-13))
    p = mul_add(x2, p, np.float32(-8.60467152213735e-11))
    p = mul_add(x2, p, np.float32(5.12229709037114e-08))
    p = mul_add(x2, p, np.float32(1.48572235717979e-05))
    p = mul_add(x2, p, np.float32(6.37261928875436e-04))
    p = mul_add(x2, p, np.float32(4.89352455891786e-03))
    q = mul_add(x2, np.float32(1.19825839466702e-06), np.float32(1.18534705686654e-04))
    q = mul_add(x2, q, np.float32(2.26843463243900e-03))
    q = mul_add(x2, q, np.float32(4.89352518554385e-03))
    r = np.float32(v * p / q)
    r = np.float32(1.0) if v > 7.90531110763549805 else (
        np.float32(-1.0) if v < -7.90531110763549805 else r)
    return v if abs(v) < 0.0004 else r
"""
_TYPES = {d: f"np.{d}" for d in FLOATS + INTS}
# float -> int casts compiled: the target's range as float literals (QuantizeLinear's round+cast)
_TO_WIDE_INT = {"int32": ("-2147483648.0", "2147483648.0"),
                "int64": ("-9223372036854775808.0", "9223372036854775808.0")}
_TYPES["bool"] = "np.bool_"


def work_weight(ops: Sequence[str]) -> int:
    """What a loop running these ops costs an element, in multiplies (PARALLEL_WORK's unit):
    12 for the rational erf and tanh, 4 for another heavy op, 0 for a view op (it moves
    nothing), 1 for the rest."""
    return sum(0 if op in VIEWS else 12 if op in RATIONAL else 4 if op in HEAVY else 1
               for op in ops)


def enabled() -> bool:
    """Whether chains compile (GRAPH_RUNTIME_CHAIN_JIT is not off)."""
    return settings.word(settings.CHAIN_JIT) != "off"


def cache_dir() -> str:
    """Where generated chain sources and their machine code are kept."""
    return str(settings.cache_dir() / "chain_jit")


_fallback_dir: str | None = None


def _writable_dir() -> str:
    """cache_dir(), or (unwritable: a read-only home) a folder of this process's own, once."""
    global _fallback_dir
    folder = cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    if _fallback_dir is None:
        _fallback_dir = tempfile.mkdtemp(prefix="graph_runtime_chain_jit_")
        log.warning("chain_jit: %s is not writable; compiled chains are kept in %s for this "
                    "process only (set %s to a writable folder)", folder, _fallback_dir,
                    settings.CACHE_DIR.name)
    return _fallback_dir


# Ops that keep the elements in their flat order (a contiguous input): in a flat loop they are
# the identity, valid where every other input of the tail is whole or one value (tail_ok).
VIEWS = frozenset({"reshape", "squeeze", "expand_dims", "flatten", "batch_flatten"})


def tail_ok(ops: Sequence[str], inputs: Sequence[TensorSpec], output: TensorSpec) -> bool:
    """Whether a tail with these ops and free inputs runs as one loop: with a view op in it,
    inputs broadcast against another shape than the output's, so each must be whole or one
    value (a flat loop), or the views all come last (before_views)."""
    if not VIEWS.intersection(ops):
        return True
    shapes = [tuple(s.shape) for s in inputs]
    return reads_flat(shapes, tuple(output.shape)) or before_views(
        ops, shapes, tuple(output.shape)) is not None


def reads_flat(shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]) -> bool:
    """Whether inputs of these shapes are each whole or one value against the output: a flat
    loop (a view op in the tail) reads them at the element's flat index."""
    n = size_of(out_shape)
    return all(size_of(s) in (1, n) for s in shapes)


def before_views(ops: Sequence[str], shapes: Sequence[tuple[int, ...]],
                 out_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape a tail whose view ops all come after its other ops computes before them (its
    inputs' broadcast), where that has the output's size: the loop runs over it and the views
    keep the elements' order (wav2vec2's group norm affine and GELU, then a reshape to 4-D,
    were two NumPy passes and one compiled; its per-channel inputs are neither whole nor one
    value); else None."""
    first_view = next((i for i, op in enumerate(ops) if op in VIEWS), len(ops))
    if first_view == len(ops) or any(op not in VIEWS for op in ops[first_view:]):
        return None
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        return None
    return shape if size_of(shape) == size_of(out_shape) else None


def step_expr(op: str, attrs: Mapping[str, Any], inputs: Sequence[TensorSpec],
              out_dtype: str) -> str | None:
    """The op's Python expression for these input dtypes, or None when it does not compile."""
    if op in VIEWS:
        return "{0}" if len(inputs) == 1 and out_dtype in _TYPES else None
    entry = PY_EXPRS.get(op)
    if entry is None:
        return None
    make, dtypes = entry
    dtype = inputs[0].dtype
    check = inputs[1:] if op == "where" else inputs
    if op == "where":
        if dtype != "bool" or inputs[1].dtype not in _TYPES:
            return None
    elif any(s.dtype not in dtypes for s in check):
        return None
    if op == "cast":
        if out_dtype == "bool":
            return "{0} != 0"
        if dtype in FLOATS and out_dtype in _TO_WIDE_INT:
            # NOTE: LLVM's conversion of NaN or an out-of-range float is undefined; NumPy's (x86's
            # cvtt*2si) gives the type's minimum, and so does this.
            low, high = _TO_WIDE_INT[out_dtype]
            return f"({{T}}({{0}}) if {low} <= {{0}} < {high} else {{T}}({low}))"
        if dtype in FLOATS and out_dtype not in FLOATS:
            return None  # NaN and out-of-range floats convert differently in NumPy and LLVM
    if out_dtype not in _TYPES:
        return None
    template = make(attrs, dtype)
    if dtype == "float32":
        template = template.replace("math.erf(", "erf32(").replace("math.tanh(", "tanh32(")
        template = template.replace("math.exp(", "exp_f32(")
    return template


Step = tuple[str, list[int], str]  # (expression template, operand value numbers, result dtype)


# the rows table of an input read at the element's index or as one value (none; never written)
_NO_ROWS = np.zeros((0, 3), np.int64)


def _collapse(shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]
              ) -> tuple[list[int], list[list[int]]]:
    """The output's dims merged where every input's strides allow, and each input's strides."""
    rank = len(out_shape)
    strides = []
    for shape in shapes:  # shapes.broadcast_strides, inlined (a decode step's chains ask it)
        pad = rank - len(shape)
        own = [0] * rank
        acc = 1
        for i in range(len(shape) - 1, -1, -1):
            d = int(shape[i])
            if d != 1 and i + pad >= 0:  # an input of higher rank (a flat tail): its last dims
                own[i + pad] = acc
            acc *= d if d > 1 else 1
        strides.append(own)
    dims: list[int] = []
    merged: list[list[int]] = [[] for _ in shapes]
    for d, size in enumerate(out_shape):
        if size == 1:
            continue  # a stride over one element never matters
        if dims and all(m[-1] == st[d] * size for m, st in zip(merged, strides)):
            dims[-1] *= size
            for m, st in zip(merged, strides):
                m[-1] = st[d]
            continue
        dims.append(size)
        for m, st in zip(merged, strides):
            m.append(st[d])
    if not dims:
        dims = [1]
        merged = [[0] for _ in shapes]
    return dims, merged


def _whole_or_one(shapes: Sequence[tuple[int, ...]], counts: Sequence[int],
                  out_shape: tuple[int, ...], size: int) -> bool:
    """Whether each input (of these element counts) is one value or the output's own shape
    (leading ones aside): _collapse then merges every dim into one of size elements."""
    rank = len(out_shape)
    for shape, count in zip(shapes, counts):
        if count == 1:
            continue
        if count != size or len(shape) > rank or tuple(shape) != out_shape[rank - len(shape):]:
            return False
    return True


def _kinds(shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...], dims: list[int],
           strides: list[list[int]]) -> list[str]:
    """How each input (of these shapes) is read: c (at the element's index), s (one value), r (a
    row with its own base), o (one value per row)."""
    kinds = []
    n = size_of(out_shape)
    for shape, st in zip(shapes, strides):
        count = size_of(shape)
        if count == 1:
            kinds.append("s")
        elif count == n:
            kinds.append("c")
        else:
            kinds.append("r" if st[-1] == 1 else "o")
    return kinds


def source_header() -> str:
    """The opening of a generated module: its version and the folder's numba sources (the
    helpers it inlines, fast_math's exp: their digest in the text, so the file's hash), imports,
    erf32 and tanh32."""
    return "\n".join([f"# graph_runtime chain_jit v{VERSION}, sources {sources_digest()[:16]}",
                      "import math", "import numba", "import numpy as np",
                      "from graph_runtime.lib.kernels.cpu.fast_math import exp_f32, mul_add",
                      "", "", HELPERS, ""])


def chain_source(inputs: Sequence[TensorSpec], output: TensorSpec, steps: Sequence[Step],
                 kinds: Sequence[str], in_place: Sequence[int] = (), wide: bool = False) -> str:
    """The generated module: run(lo, hi, inner, out, a0.., m0..) computes flat elements [lo, hi).

    Inputs numbered in in_place are the output array itself and are read through out: LLVM
    then sees the same array at the same index, where two arguments that overlap fail its
    run-time alias check and send the loop down its scalar path (10x slower for GELU).
    wide: its loop 16 float32 lanes wide (vector_width.py: rows long enough, a CPU that keeps
    its clock; only then made, so its cached code is always of that width).
    """
    n = len(inputs)
    args = ["lo", "hi", "inner", "out"] + [f"a{i}" for i in range(n)] + [f"m{i}" for i in range(n)]
    lines = [source_header()]
    if wide:
        lines += ["from graph_runtime.lib.kernels.cpu.vector_width import wide_vectors", "", ""]
    lines += ["@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)",
              f"def run({', '.join(args)}):"]
    body = ["wide_vectors()"] if wide else []
    body += [f"s{i} = a{i}[0]" for i, k in enumerate(kinds) if k == "s"]
    body += ["r = lo // inner", "j0 = lo - r * inner", "pos = lo", "while pos < hi:"]
    row = ["j1 = min(inner, j0 + (hi - pos))", "base = r * inner"]
    for i, k in enumerate(kinds):
        if k in "ro":
            row.append(f"b{i} = 0")
            row.append(f"for d in range(m{i}.shape[0]):")
            row.append(f"    b{i} += ((r // m{i}[d, 0]) % m{i}[d, 1]) * m{i}[d, 2]")
        if k == "o":
            row.append(f"u{i} = a{i}[b{i}]")
    # NOTE: row slices indexed from 0: with indices base + j LLVM left the GELU loop scalar
    # (11x slower, measured); the slices are views, nothing is copied.
    row.append("orow = out[base + j0:base + j1]")
    for i, k in enumerate(kinds):
        if k == "c" and i not in in_place:
            row.append(f"c{i} = a{i}[base + j0:base + j1]")
        elif k == "r":
            row.append(f"c{i} = a{i}[b{i} + j0:b{i} + j1]")
    row.append("for j in range(j1 - j0):")
    inner = []
    for i, k in enumerate(kinds):
        load = {"c": f"c{i}[j]", "r": f"c{i}[j]", "o": f"u{i}", "s": f"s{i}"}[k]
        if k == "c" and i in in_place:
            load = "orow[j]"
        inner.append(f"v{i} = {load}")
    for step, (template, operands, dtype) in enumerate(steps):
        ctype = _TYPES[dtype]
        expr = template.format(*[f"v{s}" for s in operands], T=ctype)
        inner.append(f"v{n + step} = {ctype}({expr})")
    inner.append(f"orow[j] = v{n + len(steps) - 1}")
    row += ["    " + line for line in inner]
    row += ["pos += j1 - j0", "r += 1", "j0 = 0"]
    body += ["    " + line for line in row]
    lines += ["    " + line for line in body]
    # A tile of a 2-D view (rows [r0, r1), columns [c0, c1) of rows `width` long): a dense
    # product's tail run per tile while it is in cache (dense_tiles.py); compiled on first use.
    call = ", ".join(["r * width + c0", "r * width + c1", "inner", "out"] + args[4:])
    lines += ["", "", "@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)",
              f"def run_block(r0, r1, c0, c1, width, {', '.join(args[2:])}):",
              "    for r in range(r0, r1):", f"        run({call})"]
    lines += _team_source([spec.dtype for spec in inputs], output.dtype)
    return "\n".join(lines) + "\n"


def _team_source(dtypes: Sequence[str], out_dtype: str) -> list[str]:
    """team: run on oneDNN's OpenMP team (omp_team.py), each thread over its share of the
    elements, the arrays read from a block (team_block); compiled at its first use. None where
    an array's type has no NumPy number class numba takes (bool)."""
    if any(d not in TEAM_DTYPES for d in (*dtypes, out_dtype)):
        return ["", "team = None"]
    n = len(dtypes)
    body = ["b = carray(data, (%d,), np.int64)" % (4 + 4 * n), "lo, hi = my_rows(b[0])",
            "if lo >= hi:", "    return", f"out = array_at(b[2], (b[3],), np.{out_dtype})"]
    for i, dtype in enumerate(dtypes):
        body.append(f"a{i} = array_at(b[{4 + 2 * i}], (b[{5 + 2 * i}],), np.{dtype})")
    for i in range(n):
        at = 4 + 2 * n + 2 * i
        body.append(f"m{i} = array_at(b[{at}], (b[{at + 1}], 3), np.int64)")
    call = ", ".join(["lo", "hi", "b[1]", "out"] + [f"a{i}" for i in range(n)]
                     + [f"m{i}" for i in range(n)])
    body.append(f"run({call})")
    return ["", "", "from numba import carray",
            "from graph_runtime.lib.kernels.cpu.omp_team import array_at, my_rows, team_kernel",
            "", "", "def _team(data):"] + ["    " + line for line in body] + [
            "", "", "team = team_kernel(_team)"]


def team_block(geometry: Any, out: Any, ins: Sequence[Any]) -> np.ndarray:
    """The block a chain's team function reads: the output's size and innermost dim, then each
    array's address and length (out, the inputs), then each input's metas and their rows."""
    values: list[Any] = [geometry.size, geometry.inner, out, out.size]
    for a in ins:
        values += [a, a.size]
    for m in geometry.metas:
        values += [m, m.shape[0]]
    return block(*values)


# (input dtypes, output dtype, kinds, wide, steps, in_place) -> the module made from their source,
# which depends on nothing else (chain_source): a symbolic module's new shape prepares its
# chains again, and generating and hashing the same source cost a decode step ~40 us per chain
_compiled: dict[tuple, Any] = {}
_lock = threading.Lock()


def load_module(form: tuple, source_of: Callable[[], str]) -> Any:
    """The module of a chain's form (run, run_block): from this process, else its source
    (source_of) from the disk cache or a fresh compile."""
    with _lock:
        module = _compiled.get(form)
        if module is not None:
            return module
        source = source_of()
        key = hashlib.sha256(source.encode()).hexdigest()[:24]
        folder = _writable_dir()
        path = os.path.join(folder, f"chain_{key}.py")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(source)
            os.replace(tmp, path)  # atomic: another process never reads half a file
        spec = importlib.util.spec_from_file_location(f"graph_runtime_chain_{key}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # NOTE: numba's cached code names its module and imports it on load: it must be there.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _compiled[form] = module
        return module


class _Geometry(NamedTuple):
    """How a compiled chain runs at one set of shapes: its function (the form's module, whose
    source depends on the inputs' kinds), the output's size and innermost collapsed dim, each
    input's metas, and the work items; team: the form's team function where the work goes to
    oneDNN's OpenMP team instead of the runtime's workers (else None); here: the form's team
    function whatever the work (run on the calling thread alone while a replay records:
    kernels/replay.py), None where its types have none."""

    fn: Callable[..., None]
    form: tuple[tuple[str, ...], bool]  # the module's: the inputs' kinds, 16 lanes or not
    size: int
    inner: int
    metas: tuple[Any, ...]
    workers: int
    bounds: list[tuple[int, int]]
    team: Any
    here: Any


class CompiledChain(PreparedKernel):
    """run(*inputs, out): the tail as one compiled pass, on the workers when it is large.

    Prepared for its specs' shapes; through its call_site (a symbolic module's steps) it runs
    its arrays' shapes at each call, the form's module kept per kinds, so a decoder's next
    length takes it unprepared (any_shape)."""

    def __init__(self, inputs: Sequence[TensorSpec], output: TensorSpec, steps: Sequence[Step],
                 ops: Sequence[str], in_place: Sequence[int] = ()) -> None:
        jit_setup.start()
        self.ops = list(ops)
        self._dtypes = ([s.dtype for s in inputs], output.dtype)
        self._steps = tuple((template, tuple(operands), dtype)
                            for template, operands, dtype in steps)
        self._in_place = tuple(in_place)
        # with a view op in the tail the loop is flat: inputs whole or one value (tail_ok)
        self.flat = bool(VIEWS.intersection(ops))
        self._weight = work_weight(ops)
        shapes = tuple(tuple(int(d) for d in s.shape) for s in inputs) + (
            tuple(int(d) for d in output.shape),)
        self._modules: dict[tuple[tuple[str, ...], bool], Any] = {}
        geometry = self._geometry(shapes)
        assert geometry is not None  # chain.py compiles a tail only where tail_ok holds
        self.module = self._modules[geometry.form]
        (self.fn, _, self.size, self.inner, self.metas, self.workers, self.bounds, self.team,
         self.here) = geometry
        # per shapes met (a flat loop's None is asked again: it is known before compiling)
        self._at: LruCache[_Geometry | None] = LruCache(SHAPES_KEPT)
        self._at.get_or_build(shapes, lambda: geometry)

    def _form(self, form: tuple[tuple[str, ...], bool]) -> tuple:
        return (tuple(self._dtypes[0]), self._dtypes[1], *form, self._steps, self._in_place)

    def _module_of(self, form: tuple[tuple[str, ...], bool], source: Callable[[], str]) -> Any:
        """load_module for these kinds and width, kept here: the form's key hashes every step's
        template (a decode step's new length asked it ~15 us a chain)."""
        module = self._modules.get(form)
        if module is None:
            module = self._modules[form] = load_module(self._form(form), source)
        return module

    def _geometry(self, shapes: tuple[tuple[int, ...], ...]) -> _Geometry | None:
        """How it runs at these shapes (inputs, then the output), or None where its loop
        cannot: a flat one (a view op in the tail) with an input neither whole nor one value.
        A new set of kinds loads (or compiles) that form's module."""
        along = self._along_one_dim(shapes)
        if along is not None:
            return along
        out_shape = shapes[-1]
        size = size_of(out_shape)
        if self.flat and not reads_flat(shapes[:-1], out_shape):
            # an input that is the output itself has its shape, not the loop's
            loop = None if self._in_place else before_views(self.ops, shapes[:-1], out_shape)
            if loop is None:
                return None
            out_shape = loop
        counts = [size_of(s) for s in shapes[:-1]]
        if size > 1 and _whole_or_one(shapes[:-1], counts, out_shape, size):
            # every input whole or one value: one dim, as _collapse would merge it (a decode
            # step's mask chains meet a new length each token, after the weights' stream
            # left Python's data out of cache: _collapse and _kinds were ~half of it)
            dims, kinds = [size], tuple("s" if c == 1 else "c" for c in counts)
            strides: list[list[int]] = [[]] * len(counts)  # read by no "r" or "o" input
        else:
            dims, strides = _collapse(shapes[:-1], out_shape)
            kinds = tuple(_kinds(shapes[:-1], out_shape, dims, strides))
        wide = wide_rows(int(dims[-1]))  # its loop's rows are the innermost collapsed dim
        form = (kinds, wide)
        metas = []
        for k, st in zip(kinds, strides):
            if k not in "ro":
                metas.append(_NO_ROWS)  # read at the element's index or as one value
                continue
            rows = []
            div = 1
            for d in range(len(dims) - 2, -1, -1):
                rows.append((div, dims[d], st[d]))
                div *= dims[d]
            metas.append(np.array(rows[::-1] or [(1, 1, 0)], np.int64).reshape(-1, 3))

        def source() -> str:
            ins = [TensorSpec(s, d) for s, d in zip(shapes[:-1], self._dtypes[0])]
            steps = [(template, list(operands), dtype) for template, operands, dtype
                     in self._steps]
            return chain_source(ins, TensorSpec(out_shape, self._dtypes[1]), steps, kinds,
                                self._in_place, wide)
        module = self._module_of(form, source)
        # (the count of workers read only for a loop that may use them: ~15 us outside a build)
        workers = num_threads() if size * self._weight >= PARALLEL_WORK else 1
        chunks = min(4 * workers, max(1, size // 4096))
        bounds = [(c * size // chunks, (c + 1) * size // chunks)
                  for c in range(chunks)] if workers > 1 else [(0, size)]
        # In OpenMP mode oneDNN's threads spin on the cores after each primitive: the runtime's
        # workers shared them and ran wav2vec2's two GELU chains slower than one thread (0.61-
        # 0.65 against 0.41-0.42 ms a run); the team's threads are the spinning ones
        team = module.team if workers > 1 and module.team is not None and team_available() \
            else None
        return _Geometry(module.run, form, size, int(dims[-1]), tuple(metas), workers, bounds,
                         team, module.team)

    def _along_one_dim(self, shapes: tuple[tuple[int, ...], ...]) -> _Geometry | None:
        """_geometry's answer made directly where the output has one dim over 1 and each input
        is whole or one value (then every path there merges the loop into that dim: a decode
        step's mask chains at each new length, ~12 us a chain the full way), its form's
        module loaded and the work for one worker; else None (the full way decides)."""
        size = 1
        for d in shapes[-1]:
            if d != 1:
                if size != 1:
                    return None
                size = d
        if size <= 1 or size * self._weight >= PARALLEL_WORK:
            return None
        kinds = []
        for shape in shapes[:-1]:
            count = math.prod(shape)
            if count == 1:
                kinds.append("s")
            elif count == size:
                kinds.append("c")
            else:
                return None
        form = (tuple(kinds), wide_rows(size))
        module = self._modules.get(form)
        if module is None:
            return None
        return _Geometry(module.run, form, size, size, (_NO_ROWS,) * len(kinds), 1,
                         [(0, size)], None, module.team)

    def at(self, shapes: tuple[tuple[int, ...], ...]) -> _Geometry | None:
        """_geometry, kept per shapes (the lengths a decoder met last)."""
        return self._at.get_or_build(shapes, partial(self._geometry, shapes))

    def any_shape(self) -> bool:
        return True

    def serves(self, shapes: Sequence[tuple[int, ...]]) -> bool:
        """Whether its loop runs these shapes (a flat one: inputs whole or one value)."""
        return self.at(tuple(tuple(s) for s in shapes)) is not None

    def call_site(self) -> ChainSite:
        return ChainSite(self)

    def flat_arrays(self, arrays: Sequence[Any]) -> tuple[Any, ...]:
        """The arguments run_block takes after the tile: inner, out, the inputs, their metas."""
        flat = [a.reshape(-1) for a in arrays]
        return (self.inner, flat[-1], *flat[:-1], *self.metas)

    def run_block(self, r0: int, r1: int, c0: int, c1: int, width: int,
                  flat: tuple[Any, ...]) -> None:
        """The tail on rows [r0, r1) and columns [c0, c1) of the output seen as rows of width
        (flat: flat_arrays of the call's arrays)."""
        self.module.run_block(r0, r1, c0, c1, width, *flat)

    def __call__(self, *arrays: Any) -> None:
        if self.run(self, arrays) and replay.active is not None and replay.contiguous(arrays):
            replay.whole_call(self)

    @staticmethod
    def run(geometry: Any, arrays: Sequence[Any]) -> bool:
        """The loop over arrays, as geometry (the kernel's own, or a _Geometry) says; True
        where it was one team function on a block (replay.whole_call)."""
        size = geometry.size
        if size == 0:
            return False
        flat = [a.reshape(-1) for a in arrays]
        out = flat[-1]
        ins = flat[:-1]
        fn, inner, metas = geometry.fn, geometry.inner, geometry.metas
        if geometry.workers == 1:
            if geometry.here is not None and recording_here():
                run_here(geometry.here(), team_block(geometry, out, ins))
                return True
            fn(0, size, inner, out, *ins, *metas)
            return False
        if geometry.team is not None:
            run_on_team(geometry.team(), team_block(geometry, out, ins))
            return True
        bounds = geometry.bounds

        def work(worker: int, item: int) -> None:
            lo, hi = bounds[item]
            fn(lo, hi, inner, out, *ins, *metas)
        parallel_items(len(bounds), geometry.workers, work)
        return False


class ChainSite:
    """A CompiledChain as one node of a symbolic module calls it: at its arrays' shapes, read
    each call (a decoder's next length runs the same kernel)."""

    def __init__(self, chain: CompiledChain) -> None:
        self.chain = chain
        self._shapes: list[tuple[int, ...]] = []
        self._geometry: Any = chain

    def __call__(self, *arrays: Any) -> None:
        shapes = [a.shape for a in arrays]
        if shapes != self._shapes:
            geometry = self.chain.at(tuple(shapes))
            if geometry is None:
                raise LibraryError(
                    f"compiled chain {'+'.join(self.chain.ops)}: prepared for other shapes; "
                    f"its flat loop cannot run {shapes} (an input neither whole nor one value)")
            self._shapes, self._geometry = shapes, geometry
        if CompiledChain.run(self._geometry, arrays) and replay.active is not None and \
                replay.contiguous(arrays):
            replay.whole_call(self)
