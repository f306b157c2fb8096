"""Transformer patterns rewritten at import: exact and tanh GELU, SiLU, decomposed LayerNorm and
RMSNorm, attention.

As ONNX Runtime's transformer optimizer does, before FuseOps: the prims a pattern computes are
replaced by one standard op producing the same Value, and whatever is left unread is dropped by
emission's liveness pass; an attention's Q/K/V projections of one input become one dense
(fuse_qkv.py). A pattern matches only where its intermediate values are read by the
pattern alone (a value also read elsewhere would be computed twice). Attention: fuse_attention.py.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection

import numpy as np

from ...errors import LibraryError
from ..ir import Prim, Value
from .fuse_attention import match_attention
from .pattern import PatternGraph, near, new_prim, other, scalar, spliced

# -- GELU ---------------------------------------------------------------------------------------

def _gelu_tail(g: PatternGraph, one_plus: Prim, x: Value) -> Value | None:
    """The value 0.5 * x * one_plus computes, reading one_plus's output: its (x * a) * 0.5,
    (a * x) * 0.5, (x * 0.5) * a or x * (a * 0.5) (PyTorch's dynamo exporter) forms; None
    when it is none of them."""
    a = one_plus.outputs[0]
    m1 = g.sole(a)
    if m1 is None or m1.op != "multiply":
        return None
    y = other(m1, a)
    if y is not None and y is not x and near(y, 0.5):
        m2 = g.sole(m1.outputs[0])
        if m2 is not None and m2.op == "multiply" and other(m2, m1.outputs[0]) is x:
            return m2.outputs[0]
        return None
    if y is x:
        m2 = g.sole(m1.outputs[0])
        if m2 is not None and m2.op == "multiply":
            half = other(m2, m1.outputs[0])
            if half is not None and near(half, 0.5):
                return m2.outputs[0]
        return None
    if y is not None and y.producer is not None and y.producer.op == "multiply" \
            and g.sole(y) is m1:
        h = y.producer
        if other(h, x) is not None and near(other(h, x), 0.5):  # type: ignore[arg-type]
            return m1.outputs[0]
    return None


def _add_one(g: PatternGraph, v: Value) -> Prim | None:
    p = g.sole(v)
    if p is None or p.op != "add":
        return None
    operand = other(p, v)
    return p if operand is not None and near(operand, 1.0) else None


def _match_erf_gelu(g: PatternGraph, erf: Prim) -> tuple[Value, Value] | None:
    u = erf.inputs[0]
    div = u.producer
    if div is None or g.sole(u) is not erf:
        return None
    if div.op == "divide" and near(div.inputs[1], math.sqrt(2.0)):
        x = div.inputs[0]
    elif div.op == "multiply":
        x = next((a for a in div.inputs if not near(a, math.sqrt(0.5))), div.inputs[0])
        if other(div, x) is None or not near(other(div, x), math.sqrt(0.5)):  # type: ignore
            return None
    else:
        return None
    plus = _add_one(g, erf.outputs[0])
    out = None if plus is None else _gelu_tail(g, plus, x)
    return None if out is None else (x, out)


def _factors(g: PatternGraph, v: Value) -> list[Value] | None:
    """The operands of the tree of multiplies computing v, in order, each product inside the
    tree read by its parent alone; [v] where v is no product, None where a product inside is
    read elsewhere too."""
    p = v.producer
    if p is None or p.op != "multiply" or len(p.inputs) != 2:
        return [v]
    found: list[Value] = []
    for operand in p.inputs:
        inner = operand.producer
        if inner is not None and inner.op == "multiply":
            if g.sole(operand) is not p:
                return None
            part = _factors(g, operand)
            if part is None:
                return None
            found += part
        else:
            found.append(operand)
    return found


def _scaled(g: PatternGraph, v: Value, constant: float) -> list[Value] | None:
    """The other factors of v where v is constant times them (one constant among its factors,
    _factors'), else None."""
    factors = _factors(g, v)
    if factors is None:
        return None
    consts = [f for f in factors if scalar(f) is not None]
    if len(consts) != 1 or not near(consts[0], constant):
        return None
    return [f for f in factors if scalar(f) is None]


def _power_term(g: PatternGraph, v: Value, x: Value, n: int) -> bool:
    """Whether v is 0.044715 * x^n: x n times among its factors, or one Pow(x, n) read here
    alone."""
    rest = _scaled(g, v, 0.044715)
    if rest is None:
        return False
    if len(rest) == n and all(f is x for f in rest):
        return True
    pw = rest[0].producer if len(rest) == 1 else None
    return pw is not None and pw.op == "power" and pw.inputs[0] is x and \
        near(pw.inputs[1], float(n)) and g.sole(rest[0]) is not None


def _match_tanh_gelu(g: PatternGraph, tanh: Prim) -> tuple[Value, Value] | None:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as GPT-2's exports write it (the cube as
    Pow or products), or as Bloom's: ... tanh(sqrt(2/pi) x (1 + 0.044715 x x)), the same
    function with its terms factored; (x, output) or None."""
    w = tanh.inputs[0]
    rest = _scaled(g, w, math.sqrt(2.0 / math.pi)) if g.sole(w) is tanh else None
    plus = _add_one(g, tanh.outputs[0])
    if rest is None or plus is None:
        return None
    candidates: list[Value] = []
    if len(rest) == 1 and rest[0].producer is not None and rest[0].producer.op == "add" \
            and g.sole(rest[0]) is not None:
        add = rest[0].producer  # x + 0.044715 x^3
        candidates = [x for x in add.inputs
                      if (cube := other(add, x)) is not None and _power_term(g, cube, x, 3)]
    elif len(rest) == 2:  # x (1 + 0.044715 x x), the factors in either order
        for x, sum_ in (rest, rest[::-1]):
            total = sum_.producer
            if total is None or total.op != "add" or g.sole(sum_) is None:
                continue
            one = next((a for a in total.inputs if near(a, 1.0)), None)
            term = None if one is None else other(total, one)
            if term is not None and _power_term(g, term, x, 2):
                candidates.append(x)
    for x in candidates:
        out = _gelu_tail(g, plus, x)
        if out is not None:
            return x, out
    return None


# -- LayerNorm (ReduceMean / Sub / Pow / Sqrt / Div) ---------------------------------------------

def _last_axis_mean(p: Prim | None, rank: int) -> bool:
    if p is None or p.op != "mean" or not p.attrs.get("keepdims", False):
        return False
    axis = p.attrs.get("axis")
    axes = [axis] if isinstance(axis, int) else list(axis or [])
    return len(axes) == 1 and axes[0] in (-1, rank - 1)


def _match_layer_norm(g: PatternGraph, sub: Prim) -> tuple[list[Value], Value, float] | None:
    if sub.op != "subtract":
        return None
    x, mean = sub.inputs
    if not _last_axis_mean(mean.producer, x.rank) or mean.producer.inputs[0] is not x:  # type: ignore
        return None
    d = sub.outputs[0]
    # distinct readers: x * x reads d twice
    readers = list({id(p): p for p in g.readers.get(id(d), [])}.values())
    if len(readers) != 2 or id(d) in g.pinned:
        return None
    pw = next((p for p in readers if p.op == "power" and near(p.inputs[1], 2.0)), None)
    pw = pw or next((p for p in readers if p.op == "multiply" and p.inputs[0] is d
                     and p.inputs[1] is d), None)
    div = next((p for p in readers if p.op == "divide" and p.inputs[0] is d), None)
    if pw is None or div is None:
        return None
    var = g.sole(pw.outputs[0])
    if not _last_axis_mean(var, x.rank):
        return None
    add = g.sole(var.outputs[0])  # type: ignore[union-attr]
    eps = None if add is None or add.op != "add" else other(add, var.outputs[0])  # type: ignore
    if eps is None or scalar(eps) is None or scalar(eps) < 0:  # type: ignore[operator]
        return None
    sqrt = g.sole(add.outputs[0])  # type: ignore[union-attr]
    if sqrt is None or sqrt.op != "sqrt" or g.sole(sqrt.outputs[0]) is not div:
        return None
    out = div.outputs[0]
    width = x.shape[-1]
    gamma = np.ones(width, x.dtype)
    beta = np.zeros(width, x.dtype)
    mul = g.sole(out)
    if mul is not None and mul.op == "multiply":
        scale = other(mul, out)
        if scale is not None and scale.const is not None \
                and np.broadcast_shapes(scale.shape, (width,)) == (width,):
            gamma = np.broadcast_to(scale.const, (width,)).astype(x.dtype)
            out = mul.outputs[0]
            shift = g.sole(out)
            bias = None if shift is None or shift.op != "add" else other(shift, out)
            if bias is not None and bias.const is not None \
                    and np.broadcast_shapes(bias.shape, (width,)) == (width,):
                beta = np.broadcast_to(bias.const, (width,)).astype(x.dtype)
                out = shift.outputs[0]  # type: ignore[union-attr]
    if out.shape != x.shape:
        return None
    return [x, Value("ln_gamma", (width,), x.dtype, const=np.ascontiguousarray(gamma)),
            Value("ln_beta", (width,), x.dtype, const=np.ascontiguousarray(beta))], out, \
        float(scalar(eps))  # type: ignore[arg-type]


# -- RMSNorm (Pow or x * x / ReduceMean / Add / Sqrt / Div or Reciprocal and Mul) --------------

def _match_rms_norm(g: PatternGraph, mean: Prim) -> tuple[list[Value], Value, float] | None:
    """x / sqrt(mean(x^2) + eps) [* gamma] as LLaMA's and T5's exports write it: x / sqrt,
    x * (1 / sqrt) or x * reciprocal(sqrt); ([x, gamma], output, eps) or None."""
    sq = mean.inputs[0]
    square = sq.producer
    if square is None or g.sole(sq) is not mean:
        return None
    if square.op == "power" and near(square.inputs[1], 2.0):
        x = square.inputs[0]
    elif square.op == "multiply" and square.inputs[0] is square.inputs[1]:
        x = square.inputs[0]
    else:
        return None
    if not _last_axis_mean(mean, x.rank):
        return None
    add = g.sole(mean.outputs[0])
    eps = None if add is None or add.op != "add" else other(add, mean.outputs[0])
    if eps is None or scalar(eps) is None or scalar(eps) < 0:  # type: ignore[operator]
        return None
    sqrt = g.sole(add.outputs[0])  # type: ignore[union-attr]
    if sqrt is None or sqrt.op != "sqrt":
        return None
    root = sqrt.outputs[0]
    after = g.sole(root)
    if after is None:
        return None
    if after.op == "divide" and after.inputs[1] is root and after.inputs[0] is x:
        out = after.outputs[0]
    else:
        if not (after.op == "reciprocal" or (after.op == "divide" and after.inputs[1] is root
                                             and near(after.inputs[0], 1.0))):
            return None
        inverse = after.outputs[0]
        mul = g.sole(inverse)
        if mul is None or mul.op != "multiply" or other(mul, inverse) is not x:
            return None
        out = mul.outputs[0]
    width = x.shape[-1]
    gamma = Value("rms_gamma", (width,), x.dtype, const=np.ones(width, x.dtype))
    mul = g.sole(out)
    scale = None if mul is None or mul.op != "multiply" else other(mul, out)
    if scale is not None and scale.dtype == x.dtype and scale.rank <= x.rank \
            and math.prod(scale.shape) == width and scale.shape[-1:] == (width,):
        gamma = scale if scale.shape == (width,) or scale.const is None \
            else Value(scale.name, (width,), x.dtype, const=scale.const.reshape(width))
        out = mul.outputs[0]  # type: ignore[union-attr]
    if out.shape != x.shape or gamma.shape != (width,):
        return None
    return [x, gamma], out, float(scalar(eps))  # type: ignore[arg-type]


def _match_silu(g: PatternGraph, sigmoid: Prim) -> tuple[Value, Value] | None:
    """(x, x * sigmoid(x)'s output) when sigmoid's output is read by that multiply alone."""
    x = sigmoid.inputs[0]
    mul = g.sole(sigmoid.outputs[0])
    if mul is None or mul.op != "multiply" or other(mul, sigmoid.outputs[0]) is not x \
            or mul.outputs[0].shape != x.shape:
        return None
    return x, mul.outputs[0]


# what fuse_transformer can be asked to match
MATCHERS = ("gelu", "silu", "layer-norm", "rms-norm", "attention")


def fuse_transformer(prims: list[Prim], outputs: list[Value],
                     matchers: Collection[str] = MATCHERS) -> tuple[list[Prim], Counter]:
    """prims with the named patterns replaced, and how many of each were fused."""
    counts: Counter = Counter()
    g = PatternGraph(prims, outputs)
    replace: dict[int, list[Prim]] = {}  # id(old producer of a replaced value) -> new prims
    for p in prims:
        try:
            if (p.op == "erf" or p.op == "tanh") and "gelu" in matchers:
                match = _match_erf_gelu(g, p) if p.op == "erf" else _match_tanh_gelu(g, p)
                if match is not None and match[0].dtype in ("float32", "float64"):
                    x, out = match
                    old = out.producer
                    attrs = {} if p.op == "erf" else {"approximate": "tanh"}
                    replace[id(old)] = [new_prim("gelu", [x], attrs, out, p.origin)]
                    counts["gelu" if p.op == "erf" else "gelu_tanh"] += 1
            elif p.op == "sigmoid" and "silu" in matchers:
                silu = _match_silu(g, p)
                if silu is not None and silu[0].dtype in ("float32", "float64"):
                    x, out = silu
                    old = out.producer
                    replace[id(old)] = [new_prim("silu", [x], {}, out, p.origin)]
                    counts["silu"] += 1
            elif p.op == "subtract" and "layer-norm" in matchers:
                ln = _match_layer_norm(g, p)
                if ln is not None and ln[0][0].dtype in ("float32", "float64"):
                    ins, out, eps = ln
                    old = out.producer
                    replace[id(old)] = [new_prim("layer_norm", ins,
                                                  {"axis": -1, "epsilon": eps}, out, p.origin)]
                    counts["layer_norm"] += 1
            elif p.op == "mean" and "rms-norm" in matchers:
                rms = _match_rms_norm(g, p)
                if rms is not None and rms[0][0].dtype in ("float32", "float64"):
                    ins, out, eps = rms
                    old = out.producer
                    replace[id(old)] = [new_prim("rms_norm", ins, {"axis": -1, "epsilon": eps},
                                                 out, p.origin)]
                    counts["rms_norm"] += 1
            elif p.op in ("batch_matmul", "matmul") and "attention" in matchers:
                found = match_attention(g, p)
                if found is not None:
                    new, old = found
                    replace[id(old)] = new
                    counts["attention"] += 1
                    if "kv_heads" in new[-1].attrs or "kv_heads" in new[-2].attrs:
                        counts["grouped_kv"] += 1  # k and v read un-repeated
        except (ValueError, KeyError, TypeError, IndexError, LibraryError):
            continue  # a shape or attribute this matcher did not expect: leave the prims
    if not replace:
        return prims, counts
    return spliced(prims, replace), counts
