"""Converters for shape and data-movement ops: reshape ... slice, pad, gather, einsum."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .convert import Context, const_input, converts, ints_of, norm_axis, required_ints
from .ir import Unsupported, Value, has_op
from .onnx_model import Node


@converts("Shape")
def shape(ctx: Context, node: Node, args: list) -> list[Value]:
    dims = np.array(args[0].shape, dtype=np.int64)
    start = int(node.attr("start", 0))
    end = node.attr("end")
    return [ctx.b.const(dims[start:None if end is None else int(end)], "shape")]


@converts("Size")
def size(ctx: Context, node: Node, args: list) -> list[Value]:
    return [ctx.b.const(np.array(math.prod(args[0].shape), np.int64), "size")]


@converts("Reshape")
def reshape(ctx: Context, node: Node, args: list) -> list[Value]:
    x = args[0]
    if node.opset < 5:
        target = node.ints("shape")
    else:
        target = required_ints(node, args, 1, "shape")
    allowzero = int(node.attr("allowzero", 0))
    out = []
    for i, d in enumerate(target or []):
        out.append(x.shape[i] if d == 0 and not allowzero else d)
    if out.count(-1) > 1:
        raise Unsupported(f"shape {target} has more than one -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0:
            raise Unsupported(f"shape {target} with -1 and a zero dim")
        out[out.index(-1)] = math.prod(x.shape) // known
    if math.prod(out) != math.prod(x.shape):
        raise Unsupported(f"cannot reshape {x.shape} to {target}")
    return [ctx.b.reshape(x, out) if tuple(out) != x.shape else ctx.b.copy(x)]


@converts("Flatten")
def flatten(ctx: Context, node: Node, args: list) -> list[Value]:
    x = args[0]
    axis = int(node.attr("axis", 1))
    axis = axis + x.rank if axis < 0 else axis
    if not 0 <= axis <= x.rank:
        raise Unsupported(f"axis {node.attr('axis')} for rank {x.rank}")
    out = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return [ctx.b.reshape(x, out) if out != x.shape else ctx.b.copy(x)]


@converts("Transpose")
def transpose(ctx: Context, node: Node, args: list) -> list[Value]:
    x = args[0]
    perm = node.ints("perm", list(range(x.rank))[::-1])
    if perm == list(range(x.rank)):
        return [ctx.b.copy(x)]
    return [ctx.b.transpose(x, perm)]


def _axes(ctx: Context, node: Node, args: list, index: int) -> list[int] | None:
    if node.opset >= 13:
        return ints_of(const_input(node, args, index, "axes"))
    return node.opt_ints("axes")


@converts("Squeeze")
def squeeze(ctx: Context, node: Node, args: list) -> list[Value]:
    x = args[0]
    axes = _axes(ctx, node, args, 1)
    if axes is None:
        picked = {i for i, d in enumerate(x.shape) if d == 1}
    else:
        picked = {norm_axis(a, x.rank, node, "axes") for a in axes}
        for a in picked:
            if x.shape[a] != 1:
                raise Unsupported(f"axis {a} has size {x.shape[a]}, not 1")
    out = tuple(d for i, d in enumerate(x.shape) if i not in picked)
    return [ctx.b.reshape(x, out) if out != x.shape else ctx.b.copy(x)]


@converts("Unsqueeze")
def unsqueeze(ctx: Context, node: Node, args: list) -> list[Value]:
    x = args[0]
    axes = _axes(ctx, node, args, 1) or []
    rank = x.rank + len(axes)
    picked = sorted(norm_axis(a, rank, node, "axes") for a in axes)
    out = list(x.shape)
    for a in picked:
        out.insert(a, 1)
    return [ctx.b.reshape(x, out)]


@converts("Concat")
def concat(ctx: Context, node: Node, args: list) -> list[Value]:
    values = [a for a in args if a is not None]
    axis = norm_axis(int(node.attr("axis")), values[0].rank, node)
    nonempty = [v for v in values if v.shape[axis] != 0]
    if not nonempty:
        shape = list(values[0].shape)
        shape[axis] = 0
        return [ctx.b.const(np.zeros(shape, values[0].dtype), "empty")]
    if len(nonempty) == 1:
        return [ctx.b.copy(nonempty[0])]
    return [ctx.b.op("concatenate", *nonempty, axis=axis)]


@converts("Split")
def split(ctx: Context, node: Node, args: list) -> list[Value]:
    x = args[0]
    axis = norm_axis(int(node.attr("axis", 0)), x.rank, node)
    dim = x.shape[axis]
    count = len(node.outputs)
    if node.opset >= 13:
        sizes = ints_of(const_input(node, args, 1, "split"))
    else:
        sizes = node.opt_ints("split")
    if sizes is None:
        parts = int(node.attr("num_outputs", count))
        step = -(-dim // parts)
        sizes = [min(step, dim - i * step) for i in range(parts)]
    if sum(sizes) != dim or len(sizes) != count:
        raise Unsupported(f"split sizes {sizes} for axis {axis} of size {dim} and {count} "
                          "outputs")
    if count == 1:
        return [ctx.b.copy(x)]
    indices = list(np.cumsum(sizes)[:-1])
    return ctx.b.ops("split", [x], indices_or_sections=indices, axis=axis)


def _slice_attrs(x: Value, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
                 steps: Sequence[int], node: Node) -> tuple[list, list, list, list]:
    begin: list[int] = []
    end: list[int | None] = []
    strides: list[int] = []
    picked: list[int] = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, x.rank, node, "axes")
        if st == 0:
            raise Unsupported("a zero step")
        dim = x.shape[a]
        chosen = range(dim)[slice(max(min(s, 2 ** 62), -2 ** 62), max(min(e, 2 ** 62), -2 ** 62),
                                  st)]
        if len(chosen) == 0:
            begin.append(0)
            end.append(0)
            strides.append(1)
        else:
            begin.append(chosen.start)
            end.append(chosen.stop if chosen.stop >= 0 else None)
            strides.append(st)
        picked.append(a)
    return begin, end, strides, picked


@converts("Slice")
def slice_(ctx: Context, node: Node, args: list) -> list[Value]:
    x = args[0]
    if node.opset < 10:
        starts, ends = node.ints("starts"), node.ints("ends")
        axes = node.ints("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = required_ints(node, args, 1, "starts")
        ends = required_ints(node, args, 2, "ends")
        axes = ints_of(const_input(node, args, 3, "axes")) or list(range(len(starts)))
        steps = ints_of(const_input(node, args, 4, "steps")) or [1] * len(starts)
    begin, end, strides, picked = _slice_attrs(x, starts, ends, axes, steps, node)
    if len(set(picked)) != len(picked):
        raise Unsupported(f"repeated axes {axes}")
    return [ctx.b.op("strided_slice", x, begin=begin, end=end, strides=strides, axes=picked)]


@converts("Pad")
def pad(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise Unsupported(f"mode {mode!r}")
    if node.opset < 11:
        pads = node.ints("pads")
        value = float(node.attr("value", 0.0))
        axes = list(range(x.rank))
    else:
        pads = required_ints(node, args, 1, "pads")
        computed = args[2] if len(args) > 2 and args[2] is not None and \
            args[2].const is None else None
        given = None if computed is not None else const_input(node, args, 2, "constant_value")
        value = 0.0 if given is None else float(np.asarray(given).reshape(-1)[0])
        axes = ints_of(const_input(node, args, 3, "axes")) or list(range(x.rank))
    axes = [norm_axis(a, x.rank, node, "axes") for a in axes]
    n = len(axes)
    widths = [[0, 0] for _ in range(x.rank)]
    for k, a in enumerate(axes):
        widths[a] = [pads[k], pads[n + k]]
    if any(w < 0 for pair in widths for w in pair):
        # Negative pads crop: slice first, then pad with what is left.
        begin = [-min(p[0], 0) for p in widths]
        end = [x.shape[i] + min(p[1], 0) for i, p in enumerate(widths)]
        x = b.op("strided_slice", x, begin=begin, end=end, strides=[1] * x.rank,
                 axes=list(range(x.rank)))
        widths = [[max(p[0], 0), max(p[1], 0)] for p in widths]
    if not any(w for pair in widths for w in pair):
        return [b.copy(x)]
    if mode != "constant":
        return [_pad_from_data(ctx, x, widths, mode)]
    if np.dtype(x.dtype).kind in "iu" and value != int(value):
        raise Unsupported(f"constant_value {value} for {x.dtype}")
    padded = b.op("pad", x, pad_width=widths, pad_value=value)
    if computed is None:
        return [padded]
    # The pad value is computed at run time: select it where the padding went.
    border = np.ones(padded.shape, bool)
    border[tuple(slice(lo, lo + d) for (lo, _), d in zip(widths, x.shape))] = False
    fill = b.reshape(computed, ())
    return [b.op("where", b.const(border, "border"), fill, padded)]


def _pad_from_data(ctx: Context, x: Value, widths: list[list[int]], mode: str) -> Value:
    """edge / reflect / wrap padding: slices of x concatenated around it, one axis at a time."""
    b = ctx.b

    def piece(v: Value, axis: int, start: int, stop: int | None, step: int) -> Value:
        return b.op("strided_slice", v, begin=[start], end=[stop], strides=[step], axes=[axis])

    y = x
    for axis, (lo, hi) in enumerate(widths):
        if not lo and not hi:
            continue
        n = y.shape[axis]
        if n == 0 or (mode == "reflect" and max(lo, hi) >= n) or (mode == "wrap" and
                                                                   max(lo, hi) > n):
            raise Unsupported(f"mode {mode!r} with pads {lo}, {hi} for an axis of size {n}")
        parts: list[Value] = []
        if lo:
            if mode == "edge":
                parts += [piece(y, axis, 0, 1, 1)] * lo
            elif mode == "reflect":
                parts.append(piece(y, axis, lo, 0, -1))
            else:
                parts.append(piece(y, axis, n - lo, n, 1))
        parts.append(y)
        if hi:
            if mode == "edge":
                parts += [piece(y, axis, n - 1, n, 1)] * hi
            elif mode == "reflect":
                parts.append(piece(y, axis, n - 2, n - 2 - hi if n - 2 - hi >= 0 else None,
                                   -1))
            else:
                parts.append(piece(y, axis, 0, hi, 1))
        y = b.op("concatenate", *parts, axis=axis)
    return y


def _broadcast(ctx: Context, x: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(d) for d in shape)
    if shape == x.shape:
        return ctx.b.copy(x)
    if has_op("broadcast_to"):
        return ctx.b.op("broadcast_to", x, shape=list(shape))
    if x.dtype == "bool":
        raise Unsupported("broadcasting a bool tensor needs op broadcast_to")
    return ctx.b.op("add", x, ctx.b.const(np.zeros(shape, x.dtype), "zeros"))


@converts("Expand")
def expand(ctx: Context, node: Node, args: list) -> list[Value]:
    x = args[0]
    target = required_ints(node, args, 1, "shape")
    try:
        out = np.broadcast_shapes(x.shape, tuple(target))
    except ValueError:
        raise Unsupported(f"cannot expand {x.shape} to {target}") from None
    return [_broadcast(ctx, x, out)]


@converts("Tile")
def tile(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    reps = required_ints(node, args, 1, "repeats")
    if len(reps) != x.rank:
        raise Unsupported(f"repeats {reps} for rank {x.rank}")
    if has_op("tile"):
        return [b.op("tile", x, reps=reps)]
    y = x
    for axis, r in enumerate(reps):
        if r == 0:
            shape = list(y.shape)
            shape[axis] = 0
            return [b.const(np.zeros([d * k for d, k in zip(x.shape, reps)], x.dtype), "empty")]
        if r > 1:
            y = b.op("concatenate", *([y] * r), axis=axis)
    return [y if y is not x else b.copy(x)]


@converts("Gather")
def gather(ctx: Context, node: Node, args: list) -> list[Value]:
    x, idx = args[0], args[1]
    axis = norm_axis(int(node.attr("axis", 0)), x.rank, node)
    if idx.const is not None:
        n = x.shape[axis]
        bad = (idx.const < -n) | (idx.const >= n)
        if np.any(bad):
            raise Unsupported(f"indices out of range [-{n}, {n})")
    # NOTE: 'wrap' maps ONNX's negative indices (-1 = last) to their place.
    return [ctx.b.op("take", x, ctx.b.cast(idx, "int64") if idx.dtype not in ("int32", "int64")
                     else idx, axis=axis, mode="wrap")]


@converts("GatherElements")
def gather_elements(ctx: Context, node: Node, args: list) -> list[Value]:
    x = args[0]
    axis = norm_axis(int(node.attr("axis", 0)), x.rank, node)
    return [ctx.b.op("gather_elements", x, args[1], axis=axis)]


@converts("EyeLike")
def eye_like(ctx: Context, node: Node, args: list) -> list[Value]:
    from .onnx_model import np_dtype
    x = args[0]
    if x.rank != 2:
        raise Unsupported(f"input of rank {x.rank}")
    dtype = np_dtype(int(node.attr("dtype"))) if node.attr("dtype") is not None else x.dtype
    eye = np.eye(x.shape[0], x.shape[1], k=int(node.attr("k", 0)), dtype=dtype)
    return [ctx.b.const(eye, "eye")]


@converts("ConstantOfShape", "Range")
def needs_constants(ctx: Context, node: Node, args: list) -> list[Value]:
    raise Unsupported("its inputs are computed at run time (a dynamic shape); only constant "
                      "inputs are supported")


@converts("Trilu")
def trilu(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    k = ints_of(const_input(node, args, 1, "k"))
    k0 = 0 if k is None else k[0]
    if x.rank < 2:
        raise Unsupported(f"input of rank {x.rank}")
    rows, cols = x.shape[-2:]
    upper = int(node.attr("upper", 1))
    keep = np.triu(np.ones((rows, cols), bool), k0) if upper else \
        np.tril(np.ones((rows, cols), bool), k0)
    zero = b.const(np.zeros((), x.dtype), "zero")
    return [b.op("where", b.const(keep, "mask"), x, zero)]


@converts("DepthToSpace", "SpaceToDepth")
def depth_space(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    if x.rank != 4:
        raise Unsupported(f"input of rank {x.rank}")
    bs = int(node.attr("blocksize"))
    n, c, h, w = x.shape
    if node.op_type == "SpaceToDepth":
        y = b.reshape(x, (n, c, h // bs, bs, w // bs, bs))
        crd = node.attr("mode", "DCR") == "CRD"
        y = b.transpose(y, [0, 1, 3, 5, 2, 4] if crd else [0, 3, 5, 1, 2, 4])
        return [b.reshape(y, (n, c * bs * bs, h // bs, w // bs))]
    mode = node.attr("mode", "DCR")
    if mode == "DCR":
        y = b.transpose(b.reshape(x, (n, bs, bs, c // (bs * bs), h, w)), [0, 3, 4, 1, 5, 2])
    else:
        y = b.transpose(b.reshape(x, (n, c // (bs * bs), bs, bs, h, w)), [0, 1, 4, 2, 5, 3])
    return [b.reshape(y, (n, c // (bs * bs), h * bs, w * bs))]


# -- einsum ---------------------------------------------------------------------------------------

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
    for t in out_terms:
        if len(set(t)) != len(t):
            raise Unsupported(f"repeated index in {t!r} (diagonals)")
    return out_terms, rhs


def _sum_out(ctx: Context, x: Value, term: str, keep: str) -> tuple[Value, str]:
    drop = [i for i, c in enumerate(term) if c not in keep]
    if not drop:
        return x, term
    y = ctx.b.op("sum", x, axis=drop, keepdims=False)
    return y, "".join(c for c in term if c in keep)


@converts("Einsum")
def einsum(ctx: Context, node: Node, args: list) -> list[Value]:
    b = ctx.b
    terms, out = _einsum_terms(str(node.attr("equation")), [a.rank for a in args])
    if len(args) == 1:
        x, t = _sum_out(ctx, args[0], terms[0], out)
        return [b.transpose(x, [t.index(c) for c in out]) if t != out else b.copy(x)]
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


@converts("Resize", "Upsample")
def resize(ctx: Context, node: Node, args: list) -> list[Value]:
    from .convert_resize import convert_resize
    return convert_resize(ctx, node, args)


@converts("GatherND")
def gather_nd(ctx: Context, node: Node, args: list) -> list[Value]:
    """A take along the flattened indexed dims: flat = sum(wrap(idx) * strides) + batch offset."""
    b = ctx.b
    x, idx = args[0], args[1]
    nb = int(node.attr("batch_dims", 0))
    k = idx.shape[-1] if idx.rank else 0
    if idx.rank < 1 or k < 1 or nb + k > x.rank or tuple(idx.shape[:nb]) != x.shape[:nb]:
        raise Unsupported(f"indices {idx.shape} with batch_dims {nb} for data {x.shape}")
    batch = math.prod(x.shape[:nb])
    dims = x.shape[nb:nb + k]
    rest = x.shape[nb + k:]
    strides = np.array([math.prod(dims[j + 1:]) for j in range(k)], np.int64)
    lookup = tuple(idx.shape[nb:-1])
    offsets = (np.arange(batch, dtype=np.int64) * math.prod(dims)).reshape(
        (batch,) + (1,) * len(lookup))
    if idx.const is not None:
        wrapped = np.mod(idx.const.astype(np.int64), np.array(dims, np.int64))
        flat_idx = (wrapped * strides).sum(axis=-1).reshape((batch,) + lookup) + offsets
        flat = b.const(flat_idx, "gather_nd_index")
    else:
        wrapped = b.op("mod", b.cast(idx, "int64"), b.const(np.array(dims, np.int64), "dims"))
        summed = b.op("sum", b.op("multiply", wrapped, b.const(strides, "strides")), axis=[-1],
                      keepdims=False)
        flat = b.op("add", b.reshape(summed, (batch,) + lookup), b.const(offsets, "offsets"))
    data = b.reshape(x, (batch * math.prod(dims),) + tuple(rest))
    out = b.op("take", data, flat, axis=0, mode="clip")
    return [b.reshape(out, tuple(x.shape[:nb]) + lookup + tuple(rest))]
