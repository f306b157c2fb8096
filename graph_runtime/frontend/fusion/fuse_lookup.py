"""An elementwise region from one int8 tensor to one int8 tensor made one table lookup (qlookup).

A QDQ model quantizes between every float op: GELU's Div -> Erf -> Q -> DQ -> Add 1 -> Q -> DQ
-> Mul x -> Q -> DQ -> Mul 0.5 -> Q reads one int8 tensor x and writes one int8 tensor, each
element from the same element of x and scalar constants alone. Such a function of a byte has
256 values: the region's own prims, run here on the 256 bytes with the CPU kernels, give the
table, so a lookup is the value the region computes (the same float32 steps; erf and exp as the
CPU kernels compute them). Applied only where the QDQ fusion already made the model's int8 ops
(CPU-only ones, as qlookup is) and GRAPH_RUNTIME_IMPORT_INT8 is on.
"""
from __future__ import annotations

from collections import Counter

from typing import Callable

import numpy as np

from ..ir import Prim, Value, load_standard_ops
from .pattern import PatternGraph, new_prim

INT8 = ("int8", "uint8")
MIN_PRIMS = 3  # a lone cast or a DQ alone is not worth a table
# Arithmetic a chain compiles into one pass with its neighbours (kernels/cpu/chain_jit.py): a
# region of these alone stays in its chain, where a lookup would split the compiled pass (the
# softmax chain of BERT-tiny's attention took 24 us with one inside, 18 as two nodes without).
# A region with anything else (erf, exp, tanh, qadd's table) is one lookup.
CHEAP = frozenset({"cast", "subtract", "add", "multiply", "divide", "round", "clip", "where",
                   "isnan", "maximum", "minimum", "relu", "copy", "negative", "abs"})


def _elementwise() -> frozenset[str]:
    from ...lib.kernels.gpu_elementwise import ELEMENTWISE_EXPRS
    load_standard_ops()
    return frozenset(ELEMENTWISE_EXPRS) | {"qadd"}


def _cone(y: Value, ops: frozenset[str], stop_at_bytes: bool,
          stop: Callable[[Value], bool] | None = None) -> tuple[list[Prim], Value] | None:
    """The elementwise prims computing y and the one non-constant value they read (an int8 or
    uint8 tensor of y's shape); None when they read another, or a constant of more than one
    value. stop_at_bytes: every int8/uint8 value is a leaf (the smallest region); stop: the
    int8/uint8 values that are leaves besides."""
    prims: dict[int, Prim] = {}
    leaves: dict[int, Value] = {}
    stack = [y]
    while stack:
        v = stack.pop()
        if v.const is not None:
            if v.const.size != 1:
                return None
            continue
        p = v.producer
        leaf = p is None or p.op not in ops or len(p.outputs) != 1 or v.shape != y.shape \
            or (v is not y and v.dtype in INT8 and (stop_at_bytes or (stop and stop(v))))
        if leaf:
            leaves[id(v)] = v
            continue
        assert p is not None
        if id(p) not in prims:
            prims[id(p)] = p
            stack.extend(p.inputs)
    if len(leaves) != 1:
        return None
    x = next(iter(leaves.values()))
    if x.dtype not in INT8 or x.shape != y.shape or x is y:
        return None
    return list(prims.values()), x


def _region(g: PatternGraph, y: Value, ops: frozenset[str]) -> tuple[list[Prim], Value] | None:
    """The largest region making y from one int8 tensor whose inner values nothing else reads."""
    for stop in (False, True):
        found = _cone(y, ops, stop)
        if found is None or len(found[0]) < MIN_PRIMS:
            continue
        if closed(g, found[0], y):
            return found
    return None


def closed(g: PatternGraph, prims: list[Prim], y: Value) -> bool:
    """Whether prims can become one op making y: none of their other outputs is a graph
    output or read by a prim outside them."""
    members = {id(p) for p in prims}
    return all(id(o) not in g.pinned and all(id(r) in members for r in g.readers.get(id(o), []))
               for p in prims for o in p.outputs if o is not y)


def _table(prims: list[Prim], x: Value, y: Value) -> np.ndarray:
    """The region run on the 256 byte values of x's type: y's value for each."""
    return evaluate(prims, x, np.arange(256, dtype=np.uint8).view(x.dtype), y)


def evaluate(prims: list[Prim], x: Value, given: np.ndarray, y: Value) -> np.ndarray:
    """y's value from elementwise prims (scalar constants besides x) run on given as x, with
    the CPU kernels."""
    from ...backends import get_backend
    from ...lib.library import TensorSpec
    from ...lib.registry import get_op
    backend = get_backend("cpu")
    values: dict[int, np.ndarray] = {id(x): given}
    for p in prims:
        args = [v.const.reshape(()) if v.const is not None else values[id(v)]
                for v in p.inputs]
        specs = [TensorSpec(a.shape, str(a.dtype)) for a in args]
        op = get_op(p.op)
        (out_spec,) = op.infer(specs, p.attrs)
        out = np.empty(tuple(out_spec.shape), out_spec.dtype)
        op.kernels["cpu"](backend, 0, specs, [out_spec], p.attrs)(*args, out)
        values[id(p.outputs[0])] = out
    return values[id(y)]


def _ordered(prims: list[Prim], order: dict[int, int]) -> list[Prim]:
    return sorted(prims, key=lambda p: order[id(p)])


def fuse_lookups(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with each region replaced by one qlookup (its prims left unread, for emission to
    drop), and how many; the last regions first, so each takes the most prims it can."""
    from .fuse_qkv import live
    ops = _elementwise()
    alive = live(prims, outputs)
    g = PatternGraph(alive, outputs)
    order = {id(p): i for i, p in enumerate(prims)}
    taken: set[int] = set()
    replace: dict[int, Prim] = {}
    for p in reversed(alive):
        if id(p) in taken or len(p.outputs) != 1 or p.outputs[0].dtype not in INT8 \
                or p.op not in ops:
            continue
        y = p.outputs[0]
        found = _region(g, y, ops)
        if found is None or any(id(q) in taken for q in found[0]) \
                or all(q.op in CHEAP for q in found[0]):
            continue
        region, x = found
        try:
            table = _table(_ordered(region, order), x, y)
        except Exception:  # a kernel refusing these operands: leave the region as it is
            continue
        const = Value(f"{y.name}_table", (256,), y.dtype, const=table)
        replace[id(p)] = new_prim("qlookup", [x, const], {}, y, p.origin)
        taken.update(id(q) for q in region)
    return [replace.get(id(p), p) for p in prims], Counter(qlookup=len(replace))
