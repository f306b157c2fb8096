"""Transformer patterns rewritten at import: exact and tanh GELU, decomposed LayerNorm, attention.

As ONNX Runtime's transformer optimizer does, before FuseOps: the prims a pattern computes are
replaced by one standard op producing the same Value, and whatever is left unread is dropped by
emission's liveness pass. A pattern matches only where its intermediate values are read by the
pattern alone (a value also read elsewhere would be computed twice). Attention is recognised
from what the exporters write for scaled_dot_product_attention and for eager attention: the heads
made by reshape/transpose views of (batch, tokens, heads * head_dim) projections (or of one
packed QKV GEMM split in three), checked by applying the views to an index array, scalar
scales on q, k or the scores, an additive mask, softmax over the last axis, the optional
where(isnan(p), 0, p), the second matmul and the views back to (batch, tokens, width).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from ..lib.registry import OPS
from .ir import Prim, Value

_VIEWS = ("reshape", "transpose")


class _Graph:
    """Readers of each value, and the graph's outputs, over the prims being rewritten."""

    def __init__(self, prims: list[Prim], outputs: list[Value]) -> None:
        self.readers: dict[int, list[Prim]] = {}
        for p in prims:
            for v in p.inputs:
                self.readers.setdefault(id(v), []).append(p)
        self.pinned = {id(v) for v in outputs}

    def sole(self, v: Value) -> Prim | None:
        """The one prim reading v once, when v is no graph output."""
        readers = self.readers.get(id(v), [])
        if len(readers) != 1 or id(v) in self.pinned:
            return None
        return readers[0]


def _scalar(v: Value) -> float | None:
    if v.const is None or v.const.size != 1 or v.const.dtype.kind != "f":
        return None
    return float(v.const.reshape(-1)[0])


def _near(v: Value, want: float, tol: float = 1e-4) -> bool:
    got = _scalar(v)
    return got is not None and abs(got - want) <= tol * max(1.0, abs(want))


def _other(p: Prim, v: Value) -> Value | None:
    """The operand of binary p that is not v (None when p reads v twice or not at all)."""
    if len(p.inputs) != 2:
        return None
    if p.inputs[0] is v and p.inputs[1] is not v:
        return p.inputs[1]
    if p.inputs[1] is v and p.inputs[0] is not v:
        return p.inputs[0]
    return None


def _new_prim(op: str, inputs: list[Value], attrs: dict[str, Any], out: Value | None,
              origin: str) -> Prim:
    """A prim of op whose output is out (or a fresh value), checked by the op's infer."""
    specs = OPS[op].infer([v.spec for v in inputs], attrs)
    if len(specs) != 1:
        raise ValueError(f"{op} gives {len(specs)} outputs")
    spec = specs[0]
    if out is None:
        out = Value(f"{op}#fused{id(inputs[0]) % 100000}", tuple(int(d) for d in spec.shape),
                    str(spec.dtype))
    elif (tuple(spec.shape), spec.dtype) != (tuple(out.shape), out.dtype):
        raise ValueError(f"{op} gives {spec}, the pattern gave {out.spec}")
    prim = Prim(op, attrs, inputs, [out], origin)
    out.producer = prim
    return prim


# -- GELU ---------------------------------------------------------------------------------------

def _gelu_tail(g: _Graph, one_plus: Prim, x: Value) -> Value | None:
    """The value 0.5 * x * one_plus computes, reading one_plus's output: its (x * a) * 0.5,
    (a * x) * 0.5 or (x * 0.5) * a forms; None when it is none of them."""
    a = one_plus.outputs[0]
    m1 = g.sole(a)
    if m1 is None or m1.op != "multiply":
        return None
    y = _other(m1, a)
    if y is x:
        m2 = g.sole(m1.outputs[0])
        if m2 is not None and m2.op == "multiply":
            half = _other(m2, m1.outputs[0])
            if half is not None and _near(half, 0.5):
                return m2.outputs[0]
        return None
    if y is not None and y.producer is not None and y.producer.op == "multiply" \
            and g.sole(y) is m1:
        h = y.producer
        if _other(h, x) is not None and _near(_other(h, x), 0.5):  # type: ignore[arg-type]
            return m1.outputs[0]
    return None


def _add_one(g: _Graph, v: Value) -> Prim | None:
    p = g.sole(v)
    if p is None or p.op != "add":
        return None
    other = _other(p, v)
    return p if other is not None and _near(other, 1.0) else None


def _match_erf_gelu(g: _Graph, erf: Prim) -> tuple[Value, Value] | None:
    u = erf.inputs[0]
    div = u.producer
    if div is None or g.sole(u) is not erf:
        return None
    if div.op == "divide" and _near(div.inputs[1], math.sqrt(2.0)):
        x = div.inputs[0]
    elif div.op == "multiply":
        x = next((a for a in div.inputs if not _near(a, math.sqrt(0.5))), div.inputs[0])
        if _other(div, x) is None or not _near(_other(div, x), math.sqrt(0.5)):  # type: ignore
            return None
    else:
        return None
    plus = _add_one(g, erf.outputs[0])
    out = None if plus is None else _gelu_tail(g, plus, x)
    return None if out is None else (x, out)


def _match_tanh_gelu(g: _Graph, tanh: Prim) -> tuple[Value, Value] | None:
    w = tanh.inputs[0]
    scale = w.producer
    if scale is None or scale.op != "multiply" or g.sole(w) is not tanh:
        return None
    inner = next((a for a in scale.inputs if not _near(a, math.sqrt(2.0 / math.pi))), None)
    if inner is None or _other(scale, inner) is None or inner.producer is None \
            or inner.producer.op != "add" or g.sole(inner) is not scale:
        return None
    add = inner.producer
    for x in add.inputs:
        cube = _other(add, x)
        if cube is None or cube.producer is None or cube.producer.op != "multiply":
            continue
        mul = cube.producer
        powered = next((a for a in mul.inputs if not _near(a, 0.044715)), None)
        if powered is None or powered.producer is None:
            continue
        pw = powered.producer
        cubed = pw.op == "power" and pw.inputs[0] is x and _near(pw.inputs[1], 3.0)
        if not cubed:
            continue
        plus = _add_one(g, tanh.outputs[0])
        out = None if plus is None else _gelu_tail(g, plus, x)
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


def _match_layer_norm(g: _Graph, sub: Prim) -> tuple[list[Value], Value, float] | None:
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
    pw = next((p for p in readers if p.op == "power" and _near(p.inputs[1], 2.0)), None)
    pw = pw or next((p for p in readers if p.op == "multiply" and p.inputs[0] is d
                     and p.inputs[1] is d), None)
    div = next((p for p in readers if p.op == "divide" and p.inputs[0] is d), None)
    if pw is None or div is None:
        return None
    var = g.sole(pw.outputs[0])
    if not _last_axis_mean(var, x.rank):
        return None
    add = g.sole(var.outputs[0])  # type: ignore[union-attr]
    eps = None if add is None or add.op != "add" else _other(add, var.outputs[0])  # type: ignore
    if eps is None or _scalar(eps) is None:
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
        scale = _other(mul, out)
        if scale is not None and scale.const is not None \
                and np.broadcast_shapes(scale.shape, (width,)) == (width,):
            gamma = np.broadcast_to(scale.const, (width,)).astype(x.dtype)
            out = mul.outputs[0]
            shift = g.sole(out)
            bias = None if shift is None or shift.op != "add" else _other(shift, out)
            if bias is not None and bias.const is not None \
                    and np.broadcast_shapes(bias.shape, (width,)) == (width,):
                beta = np.broadcast_to(bias.const, (width,)).astype(x.dtype)
                out = shift.outputs[0]  # type: ignore[union-attr]
    if out.shape != x.shape:
        return None
    return [x, Value("ln_gamma", (width,), x.dtype, const=np.ascontiguousarray(gamma)),
            Value("ln_beta", (width,), x.dtype, const=np.ascontiguousarray(beta))], out, \
        float(_scalar(eps))  # type: ignore[arg-type]


# -- attention ----------------------------------------------------------------------------------

def _trace_back(g: _Graph, v: Value) -> tuple[Value, np.ndarray, float] | None:
    """The array v is a view of, v's elements as indices into it, and the scalar factor."""
    steps: list[tuple[str, Any]] = []
    scale = 1.0
    cur = v
    while cur.producer is not None and g.sole(cur) is not None:
        p = cur.producer
        if p.op in _VIEWS:
            steps.append((p.op, p.attrs))
            cur = p.inputs[0]
        elif p.op in ("multiply", "divide") and _scalar(p.inputs[1]) is not None:
            factor = _scalar(p.inputs[1])
            scale = scale * factor if p.op == "multiply" else scale / factor  # type: ignore
            cur = p.inputs[0]
        elif p.op == "multiply" and _scalar(p.inputs[0]) is not None:
            scale *= _scalar(p.inputs[0])  # type: ignore[operator]
            cur = p.inputs[1]
        else:
            break
    src = cur
    idx = np.arange(math.prod(src.shape)).reshape(src.shape)
    if src.producer is not None and src.producer.op == "split" and src.rank >= 2:
        split = src.producer
        axis = split.attrs.get("axis", 0)
        base = split.inputs[0]
        if axis in (-1, base.rank - 1):
            start = 0
            for o in split.outputs:
                if o is src:
                    break
                start += o.shape[-1]
            src = base
            idx = np.arange(math.prod(src.shape)).reshape(src.shape)[..., start:start + cur.shape[-1]]
    for op, attrs in reversed(steps):
        idx = idx.reshape(attrs["newshape"]) if op == "reshape" else idx.transpose(attrs["axes"])
    return src, idx, scale


def _heads(src: Value, idx: np.ndarray, tokens: int, dim: int, key_t: bool
           ) -> tuple[int, int, int] | None:
    """(batch, heads, column offset) when idx holds src's heads as (batch*heads, tokens, dim)
    (or (batch*heads, dim, tokens) with key_t), else None."""
    width = src.shape[-1]
    total = math.prod(src.shape)
    if width * tokens == 0 or total % (width * tokens):
        return None
    batch = total // (width * tokens)
    flat = idx.reshape(-1)
    heads = idx.shape[0] // batch if batch and idx.shape[0] % batch == 0 else 0
    if heads < 1:
        return None
    offset = int(flat.min()) % width
    if offset + heads * dim > width:
        return None
    want = np.arange(total).reshape(batch, tokens, width)[:, :, offset:offset + heads * dim]
    want = want.reshape(batch, tokens, heads, dim)
    want = want.transpose(0, 2, 3, 1) if key_t else want.transpose(0, 2, 1, 3)
    if want.size != idx.size or not np.array_equal(want.reshape(idx.shape), idx):
        return None
    return batch, heads, offset


def _as_3d(src: Value, batch: int, prims: list[Prim], origin: str) -> Value:
    shape = (batch, math.prod(src.shape) // (batch * src.shape[-1]), src.shape[-1])
    if src.shape == shape:
        return src
    if src.const is not None:
        return Value(src.name, shape, src.dtype, const=src.const.reshape(shape))
    prim = _new_prim("reshape", [src], {"newshape": list(shape)}, None, origin)
    prims.append(prim)
    return prim.outputs[0]


def _match_attention(g: _Graph, bmm: Prim) -> tuple[list[Prim], Prim] | None:
    """New prims computing the attention whose scores bmm makes, and the prim they replace."""
    if bmm.op not in ("batch_matmul", "matmul") or bmm.outputs[0].dtype not in ("float32",
                                                                                 "float64"):
        return None
    qa, ka = bmm.inputs
    if qa.rank < 2 or ka.rank < 2 or (bmm.op == "matmul" and bmm.attrs):
        return None
    # batch_matmul: (batch*heads, tokens, dim) operands; matmul: the same with one matrix
    # (batch and heads 1), which the importer writes as a 4-D by 2-D product.
    key_t = not bmm.attrs.get("transpose_b", False)
    bh = math.prod(qa.shape[:-2])
    q_len, dim = qa.shape[-2:]
    k_len = ka.shape[-1] if key_t else ka.shape[-2]
    if math.prod(ka.shape[:-2]) != bh or (bmm.op == "matmul" and bh != 1):
        return None
    # scores -> [reshape] -> [scale] -> [+ mask] -> softmax
    cur = bmm.outputs[0]
    scale = 1.0
    mask: Value | None = None
    while True:
        p = g.sole(cur)
        if p is None:
            return None
        if p.op == "reshape":
            cur = p.outputs[0]
        elif p.op in ("multiply", "divide") and _scalar(p.inputs[1]) is not None \
                and p.inputs[0] is cur:
            factor = _scalar(p.inputs[1])
            scale = scale * factor if p.op == "multiply" else scale / factor  # type: ignore
            cur = p.outputs[0]
        elif p.op == "add" and mask is None and cur.rank == 4:
            mask = _other(p, cur)
            if mask is None or mask.dtype != cur.dtype:
                return None
            cur = p.outputs[0]
        elif p.op == "softmax" and p.attrs.get("axis", -1) in (-1, cur.rank - 1):
            cur = p.outputs[0]
            break
        else:
            return None
    # probabilities -> [where(isnan(p), 0, p)] -> [reshape] -> matmul with v
    nan_to_zero = False
    readers = g.readers.get(id(cur), [])
    if len(readers) == 2 and id(cur) not in g.pinned:
        isnan = next((p for p in readers if p.op == "isnan"), None)
        where = next((p for p in readers if p.op == "where"), None)
        if isnan is None or where is None or g.sole(isnan.outputs[0]) is not where \
                or where.inputs[0] is not isnan.outputs[0] or where.inputs[2] is not cur \
                or not _near(where.inputs[1], 0.0):
            return None
        nan_to_zero = True
        cur = where.outputs[0]
    p = g.sole(cur)
    if p is not None and p.op == "reshape":
        cur = p.outputs[0]
        p = g.sole(cur)
    if p is None or p.op != bmm.op or p.inputs[0] is not cur \
            or p.attrs.get("transpose_b", False) or p.inputs[1].rank < 2 \
            or math.prod(p.inputs[1].shape[:-2]) != bh:
        return None
    bmm2 = p
    # the three operands as head views of their sources
    found = []
    for operand, tokens, kt in ((qa, q_len, False), (ka, k_len, key_t), (bmm2.inputs[1], k_len,
                                                                          False)):
        traced = _trace_back(g, operand)
        if traced is None:
            return None
        src, idx, factor = traced
        idx = idx.reshape((bh,) + tuple(operand.shape[-2:]))
        layout = _heads(src, idx, tokens, dim, kt)
        if layout is None:
            return None
        found.append((src, layout, factor))
    batch, heads = found[0][1][0], found[0][1][1]
    if any(f[1][:2] != (batch, heads) for f in found) or found[2][2] != 1.0:
        return None
    scale *= found[0][2] * found[1][2]
    if bh != batch * heads:
        return None
    # context (batch*heads, q_len, dim) -> views -> (batch, q_len, heads*dim) or 2-D
    cur = bmm2.outputs[0]
    idx = np.arange(math.prod(cur.shape)).reshape(cur.shape)
    want_all = np.arange(math.prod(cur.shape)).reshape(batch, heads, q_len, dim)
    want_all = want_all.transpose(0, 2, 1, 3)
    final = None
    while True:
        p = g.sole(cur)
        if p is None or p.op not in _VIEWS:
            break
        idx = idx.reshape(p.attrs["newshape"]) if p.op == "reshape" \
            else idx.transpose(p.attrs["axes"])
        cur = p.outputs[0]
        if cur.shape[-1] == heads * dim and cur.rank in (2, 3) \
                and np.array_equal(idx, want_all.reshape(cur.shape)):
            final = cur
    if final is None or final.producer is None:
        return None
    old = final.producer
    # mask broadcast to 4-D
    origin = bmm.origin
    new: list[Prim] = []
    inputs = [_as_3d(f[0], batch, new, origin) for f in found]
    if mask is not None:
        shape4 = (1,) * (4 - mask.rank) + tuple(mask.shape)
        full = (batch, heads, q_len, k_len)
        if len(shape4) != 4 or any(m not in (1, f) for m, f in zip(shape4, full)):
            return None
        if shape4 != mask.shape:
            if mask.const is not None:
                mask = Value(mask.name, shape4, mask.dtype, const=mask.const.reshape(shape4))
            else:
                reshape = _new_prim("reshape", [mask], {"newshape": list(shape4)}, None, origin)
                new.append(reshape)
                mask = reshape.outputs[0]
        inputs.append(mask)
    attrs = {"num_heads": heads, "head_dim": dim, "scale": scale, "q_offset": found[0][1][2],
             "k_offset": found[1][1][2], "v_offset": found[2][1][2], "nan_to_zero": nan_to_zero}
    if final.rank == 3:
        new.append(_new_prim("attention", inputs, attrs, final, origin))
    else:
        att = _new_prim("attention", inputs, attrs, None, origin)
        new.append(att)
        new.append(_new_prim("reshape", [att.outputs[0]], {"newshape": list(final.shape)}, final,
                             origin))
    return new, old


def fuse_transformer(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with the patterns replaced, and how many of each were fused."""
    counts: Counter = Counter()
    g = _Graph(prims, outputs)
    replace: dict[int, list[Prim]] = {}  # id(old producer of a replaced value) -> new prims
    for p in prims:
        try:
            if p.op == "erf" or p.op == "tanh":
                match = _match_erf_gelu(g, p) if p.op == "erf" else _match_tanh_gelu(g, p)
                if match is not None and match[0].dtype in ("float32", "float64"):
                    x, out = match
                    old = out.producer
                    attrs = {} if p.op == "erf" else {"approximate": "tanh"}
                    replace[id(old)] = [_new_prim("gelu", [x], attrs, out, p.origin)]
                    counts["gelu" if p.op == "erf" else "gelu_tanh"] += 1
            elif p.op == "subtract":
                ln = _match_layer_norm(g, p)
                if ln is not None and ln[0][0].dtype in ("float32", "float64"):
                    ins, out, eps = ln
                    old = out.producer
                    replace[id(old)] = [_new_prim("layer_norm", ins,
                                                  {"axis": -1, "epsilon": eps}, out, p.origin)]
                    counts["layer_norm"] += 1
            elif p.op in ("batch_matmul", "matmul"):
                found = _match_attention(g, p)
                if found is not None:
                    new, old = found
                    replace[id(old)] = new
                    counts["attention"] += 1
        except (ValueError, KeyError, TypeError, IndexError):
            continue  # a shape or attribute this matcher did not expect: leave the prims
    if not replace:
        return prims, counts
    result: list[Prim] = []
    for p in prims:
        result.extend(replace.get(id(p), [p]))
    return result, counts



FUSE_ENV = "GRAPH_RUNTIME_IMPORT_FUSE"


def fuse_patterns(lowered: Any) -> Counter:
    """Rewrite lowered.builder.prims in place (GRAPH_RUNTIME_IMPORT_FUSE=off: leave them)."""
    import os
    if os.environ.get(FUSE_ENV, "on").strip().lower() == "off":
        return Counter()
    prims, counts = fuse_transformer(lowered.builder.prims, lowered.outputs)
    lowered.builder.prims[:] = prims
    return counts
