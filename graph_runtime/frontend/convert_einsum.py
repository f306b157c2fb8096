"""Converter for Einsum: one or two operands as sum, transpose, reshape and batch_matmul."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .convert import Context, converts
from .ir import Unsupported, Value, check_const_bytes
from .onnx_node import OnnxNode


def _einsum_terms(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise Unsupported(f"equation {equation!r} names {len(terms)} operands, got {len(ranks)}")
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    width = max([r - (len(t) - 3) for t, r in zip(terms, ranks) if "..." in t], default=0)
    ell = "".join(free[:width])
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            t = t.replace("...", ell[width - (r - (len(t) - 3)):])
        if len(t) != r:
            raise Unsupported(f"term {t!r} for an operand of rank {r}")
        out_terms.append(t)
    if "->" not in eq:
        counts = {c: sum(t.count(c) for t in out_terms) for c in set("".join(out_terms))}
        rhs = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        rhs = rhs.replace("...", ell)
    return out_terms, rhs


def _diagonal(ctx: Context, x: Value, term: str) -> tuple[Value, str]:
    """A term with a repeated index ('ii', 'bjj') as the diagonal it names: one take with
    flat positions known at import; the result's indices are the term's distinct letters."""
    letters = "".join(dict.fromkeys(term))
    if len(letters) == len(term):
        return x, term
    dims: dict[str, int] = {}
    for c, d in zip(term, x.shape):
        if dims.setdefault(c, d) != d:
            raise Unsupported(f"index {c!r} of term {term!r} spans sizes {dims[c]} and {d}")
    shape = tuple(dims[c] for c in letters)
    check_const_bytes((len(shape), *shape), np.int64, f"the diagonal index table of {term!r}")
    grids = np.indices(shape, dtype=np.int64)
    source = [grids[letters.index(c)] for c in term]
    flat = np.ravel_multi_index(tuple(source), x.shape) if x.shape else np.zeros(shape, np.int64)
    taken = ctx.b.op("take", ctx.b.reshape(x, (max(math.prod(x.shape), 1),)),
                     ctx.b.const(flat, "einsum_diagonal"), axis=0, mode="clip")
    return taken, letters


def _sum_out(ctx: Context, x: Value, term: str, keep: str) -> tuple[Value, str]:
    drop = [i for i, c in enumerate(term) if c not in keep]
    if not drop:
        return x, term
    y = ctx.b.op("sum", x, axis=drop, keepdims=False)
    return y, "".join(c for c in term if c in keep)


@converts("Einsum")
def einsum(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    terms, out = _einsum_terms(str(node.attr("equation")), [a.rank for a in args])
    if len(set(out)) != len(out):
        raise Unsupported(f"repeated index in the output {out!r}")
    missing = [c for c in out if not any(c in t for t in terms)]
    if missing:
        raise Unsupported(f"output index {missing[0]!r} of {str(node.attr('equation'))!r} is "
                          "in no input term")
    pairs = [_diagonal(ctx, a, t) for a, t in zip(args, terms)]
    args = [p[0] for p in pairs]
    terms = [p[1] for p in pairs]
    if len(args) == 1:
        x, t = _sum_out(ctx, args[0], terms[0], out)
        return [b.transpose(x, [t.index(c) for c in out]) if t != out else x]
    if len(args) != 2:
        raise Unsupported(f"{len(args)} operands (1 or 2 are supported)")
    x, tx = _sum_out(ctx, args[0], terms[0], out + terms[1])
    y, ty = _sum_out(ctx, args[1], terms[1], out + terms[0])
    dims = {c: d for t, v in ((tx, x), (ty, y)) for c, d in zip(t, v.shape)}
    for t, v in ((tx, x), (ty, y)):
        for c, d in zip(t, v.shape):
            if dims[c] != d:
                raise Unsupported(f"index {c!r} has sizes {dims[c]} and {d} (broadcasting)")
    batch = [c for c in tx if c in ty and c in out]
    contract = [c for c in tx if c in ty and c not in out]
    left = [c for c in tx if c not in ty]
    right = [c for c in ty if c not in tx]
    size = lambda cs: math.prod(dims[c] for c in cs)
    xa = b.transpose(x, [tx.index(c) for c in batch + left + contract])
    ya = b.transpose(y, [ty.index(c) for c in batch + contract + right])
    x3 = b.reshape(xa, (size(batch), size(left), size(contract)))
    y3 = b.reshape(ya, (size(batch), size(contract), size(right)))
    z = b.op("batch_matmul", x3, y3, transpose_b=False)
    order = batch + left + right
    z = b.reshape(z, tuple(dims[c] for c in order))
    return [b.transpose(z, [order.index(c) for c in out])]
