"""Converters for indexing ops: Slice, Pad (all modes), Gather, GatherElements, GatherND."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .convert import Context, const_input, converts, ints_of, norm_axis, required_ints
from .fold import fold_gather, fold_gather_elements
from .fold_size import size_gather, size_pad
from .ir import Unsupported, Value, check_const_bytes
from .onnx_node import OnnxNode
from .fold_sym import normal
from .symdim import has_sym, slice_range


def _slice_attrs(x: Value, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
                 steps: Sequence[int], node: OnnxNode) -> tuple[list, list, list, list]:
    begin: list[Any] = []  # ints, or symbolic dims (frontend/symdim.py)
    end: list[Any] = []
    strides: list[int] = []
    picked: list[int] = []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, x.rank, node, "axes")
        if st == 0:
            raise Unsupported("a zero step")
        dim = x.shape[a]
        if has_sym([dim, s, e]):
            first, last, _ = slice_range(dim, s, e, st)  # Undecidable for a negative step
            begin.append(first)
            end.append(last)
            strides.append(st)
            picked.append(a)
            continue
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


@converts("Slice", shape_inputs=(1, 2, 3, 4))
def slice_(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
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


@converts("Pad", shape_inputs=(1, 3), value_inputs=(2,), predict=size_pad)
def pad(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise Unsupported(f"mode {mode!r}")
    computed: Value | None = None
    if node.opset < 11:
        pads = node.ints("pads")
        value = float(node.attr("value", 0.0))
        axes = list(range(x.rank))
    else:
        pads = required_ints(node, args, 1, "pads")
        computed = args[2] if len(args) > 2 and args[2] is not None and \
            args[2].const is None else None
        given = None if computed is not None else const_input(node, args, 2, "constant_value")
        if given is not None and np.asarray(given).size != 1:
            raise Unsupported(f"input 2 (constant_value) of shape {list(np.shape(given))}; "
                              "expected one value")
        value = 0.0 if given is None else float(np.asarray(given).reshape(-1)[0])
        axes = ints_of(const_input(node, args, 3, "axes")) or list(range(x.rank))
    axes = [norm_axis(a, x.rank, node, "axes") for a in axes]
    n = len(axes)
    if len(set(axes)) != n:
        raise Unsupported(f"axes {axes} name an axis twice")
    if len(pads) != 2 * n:
        raise Unsupported(f"{len(pads)} pads for {n} axes; expected {2 * n} (all begins, "
                          "then all ends)")
    widths = [[0, 0] for _ in range(x.rank)]
    for k, a in enumerate(axes):
        widths[a] = [pads[k], pads[n + k]]
        if x.shape[a] + pads[k] + pads[n + k] < 0:
            raise Unsupported(f"pads {pads[k]} and {pads[n + k]} on axis {a} of size "
                              f"{x.shape[a]}; they crop more than the axis holds")
    if any(w < 0 for pair in widths for w in pair):
        # Negative pads crop: slice first, then pad with what is left.
        begin = [-min(p[0], 0) for p in widths]
        end = [x.shape[i] + min(p[1], 0) for i, p in enumerate(widths)]
        x = b.op("strided_slice", x, begin=begin, end=end, strides=[1] * x.rank,
                 axes=list(range(x.rank)))
        widths = [[max(p[0], 0), max(p[1], 0)] for p in widths]
    if not any(w for pair in widths for w in pair):
        return [x]
    if mode != "constant":
        return [_pad_from_data(ctx, x, widths, mode)]
    if np.dtype(x.dtype).kind in "iu" and value != int(value):
        raise Unsupported(f"constant_value {value} for {x.dtype}")
    if computed is None and not np.isfinite(value):
        # lib.json holds finite numbers only: an infinite pad value goes through a param.
        computed = b.const(np.array(value, x.dtype), "pad_value")
        value = 0.0
    padded = b.op("pad", x, pad_width=widths, pad_value=value)
    if computed is None:
        return [padded]
    # The pad value is computed at run time (or infinite): select it where the padding went.
    check_const_bytes(padded.shape, bool, "Pad border mask")
    border = np.ones(padded.shape, bool)
    border[tuple(slice(lo, lo + d) for (lo, _), d in zip(widths, x.shape))] = False
    fill = b.reshape(computed, ())
    return [b.op("where", b.const(border, "border"), fill, padded)]


def _pad_from_data(ctx: Context, x: Value, widths: list[list[int]], mode: str) -> Value:
    """edge / reflect / wrap padding: slices of x concatenated around it, one axis at a time."""
    b = ctx.b

    def piece(v: Value, axis: int, start: int, stop: int | None, step: int) -> Value:
        return b.op("strided_slice", v, begin=[start], end=[stop], strides=[step], axes=[axis])

    def edge(v: Value, axis: int, at: int, width: int) -> Value:
        # NOTE: one broadcast, not `width` slices: the import stays O(1) in the pad width.
        shape = list(v.shape)
        shape[axis] = width
        return b.op("broadcast_to", piece(v, axis, at, at + 1, 1), shape=shape)

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
                parts.append(edge(y, axis, 0, lo))
            elif mode == "reflect":
                parts.append(piece(y, axis, lo, 0, -1))
            else:
                parts.append(piece(y, axis, n - lo, n, 1))
        parts.append(y)
        if hi:
            if mode == "edge":
                parts.append(edge(y, axis, n - 1, hi))
            elif mode == "reflect":
                parts.append(piece(y, axis, n - 2, n - 2 - hi if n - 2 - hi >= 0 else None,
                                   -1))
            else:
                parts.append(piece(y, axis, 0, hi, 1))
        y = b.op("concatenate", *parts, axis=axis)
    return y


@converts("Gather", fold=fold_gather, predict=size_gather)
def gather(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x, idx = args[0], args[1]
    axis = norm_axis(int(node.attr("axis", 0)), x.rank, node)
    if idx.const is not None and has_sym(x.shape[axis]):
        # Indices 0 and -1 hold for any size from 1 (take's rule refuses an empty axis when the
        # module is specialised); others must be decided in range.
        n = x.shape[axis]
        for i in _ints_of_index(idx):
            if i not in (0, -1) and not (-n <= i < n):
                raise Unsupported(f"index {i} is out of range for axis {axis} of size {n}")
    elif idx.const is not None:
        n = x.shape[axis]
        bad = (idx.const < -n) | (idx.const >= n)
        if np.any(bad):
            raise Unsupported(f"index {idx.const[bad].reshape(-1)[0]} is out of range for axis "
                              f"{axis} of size {n}")
    # NOTE: 'wrap' maps ONNX's negative indices (-1 = last) to their place.
    return [ctx.b.op("take", x, ctx.b.cast(idx, "int64") if idx.dtype not in ("int32", "int64")
                     else idx, axis=axis, mode="wrap")]


def _ints_of_index(idx: Value) -> list[int]:
    if idx.const is None or has_sym(idx.const):
        raise Unsupported("indices holding symbolic dims into a symbolic axis")
    return [int(i) for i in idx.const.reshape(-1)]


@converts("GatherElements", fold=fold_gather_elements)
def gather_elements(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    axis = norm_axis(int(node.attr("axis", 0)), x.rank, node)
    return [ctx.b.op("gather_elements", x, args[1], axis=axis)]


@converts("GatherND")
def gather_nd(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
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
    # Symbolic dims (frontend/symdim.py) stay expressions: the tables below read them as data
    # through dim_values nodes.
    strides = normal(np.array([math.prod(dims[j + 1:]) for j in range(k)], object))
    lookup = tuple(idx.shape[nb:-1])
    check_const_bytes((batch,), np.int64, "GatherND's batch offsets")
    offsets = (np.arange(batch, dtype=np.int64) * math.prod(dims)).reshape(
        (batch,) + (1,) * len(lookup))
    if idx.const is not None:
        wrapped = np.mod(idx.const.astype(np.int64), np.array(dims, np.int64))
        flat_idx = (wrapped * strides).sum(axis=-1).reshape((batch,) + lookup) + offsets
        flat = b.const(flat_idx, "gather_nd_index")
    else:
        wrapped = b.op("mod", b.cast(idx, "int64"), b.const(normal(np.array(dims, object)),
                                                            "dims"))
        summed = b.op("sum", b.op("multiply", wrapped, b.const(strides, "strides")), axis=[-1],
                      keepdims=False)
        flat = b.op("add", b.reshape(summed, (batch,) + lookup), b.const(offsets, "offsets"))
    data = b.reshape(x, (batch * math.prod(dims),) + tuple(rest))
    out = b.op("take", data, flat, axis=0, mode="clip")
    return [b.reshape(out, tuple(x.shape[:nb]) + lookup + tuple(rest))]


def _scatter(ctx: Context, node: OnnxNode, data: Value, updates: Value,
             targets: np.ndarray) -> Value:
    """data with updates written at the flat positions targets (one per update element).

    Positions known at import make it a gather and a select: each written position takes the
    last update aimed at it (reduction 'none') or data plus the sum of them ('add').
    """
    b = ctx.b
    reduction = node.attr("reduction", "none")
    size = int(np.prod(data.shape))
    flat_targets = targets.reshape(-1)
    if reduction == "none":
        source = np.full(size, -1, np.int64)
        source[flat_targets] = np.arange(flat_targets.size, dtype=np.int64)
        written = source >= 0
        picked = b.op("take", b.reshape(updates, (max(flat_targets.size, 1),)),
                      b.const(np.maximum(source, 0).reshape(data.shape), "scatter_source"),
                      axis=0, mode="clip")
        return b.op("where", b.const(written.reshape(data.shape), "scatter_mask"), picked, data)
    if reduction == "add" and np.dtype(data.dtype).kind == "f":
        check_const_bytes((size, flat_targets.size), data.dtype, "the scatter routing matrix")
        routing = np.zeros((size, flat_targets.size), data.dtype)
        routing[flat_targets, np.arange(flat_targets.size)] = 1
        added = b.op("dense", b.reshape(updates, (1, flat_targets.size)),
                     b.const(routing, "scatter_routing"))
        return b.op("add", data, b.reshape(added, data.shape))
    raise Unsupported(f"reduction {reduction!r} on {data.dtype}")


def scatter(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    """Scatter with indices known at import (convert_scatter.py's converter calls it)."""
    data, updates = args[0], args[2]
    indices = const_input(node, args, 1, "indices")
    if indices is None:
        raise Unsupported("indices are missing")
    indices = np.asarray(indices, np.int64)
    # NOTE: data is computed at run time and may be of any size; its tables here are not.
    check_const_bytes(data.shape, np.int64, "the scatter position table")
    check_const_bytes((max(data.rank, 1), *indices.shape), np.int64, "the scatter index table")
    positions = np.arange(int(np.prod(data.shape)), dtype=np.int64).reshape(data.shape)
    if node.op_type in ("ScatterElements", "Scatter"):
        axis = norm_axis(int(node.attr("axis", 0)), data.rank, node)
        if indices.shape != tuple(updates.shape) or indices.ndim != data.rank:
            raise Unsupported(f"indices {indices.shape} for updates {updates.shape}")
        wrapped = np.where(indices < 0, indices + data.shape[axis], indices)
        if np.any((wrapped < 0) | (wrapped >= data.shape[axis])):
            raise Unsupported("indices out of range")
        coords: list[np.ndarray] = list(np.indices(indices.shape, dtype=np.int64))
        coords[axis] = wrapped
        targets = positions[tuple(coords)]
    else:
        k = indices.shape[-1]
        dims = np.array(data.shape[:k], np.int64)
        wrapped = np.where(indices < 0, indices + dims, indices)
        if np.any((wrapped < 0) | (wrapped >= dims)):
            raise Unsupported("indices out of range")
        targets = positions[tuple(np.moveaxis(wrapped, -1, 0))]
        if targets.shape != tuple(updates.shape):
            raise Unsupported(f"indices {indices.shape} for updates {updates.shape}")
    return [_scatter(ctx, node, data, updates, targets)]
