"""The size of a constant folding would make, predicted from its inputs before it is computed.

Ops whose output can be much larger than their inputs (ConstantOfShape, Range, Tile, Expand,
OneHot, Pad, Resize, Gather, MatMul, broadcasting) get their output shape worked out in Python
integers, so a 150-byte model asking for a 16 GiB table is refused before NumPy allocates (or,
for Tile with repeats near 2^62, crashes).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from .ir import Unsupported, check_const_bytes, check_entry
from .onnx_node import OnnxNode

Shape = tuple[int, ...]


def _ints(x: np.ndarray | None, what: str) -> list[int]:
    if x is None:
        raise Unsupported(f"{what} is missing")
    flat = np.asarray(x).reshape(-1)
    if flat.dtype.kind not in "iub":
        raise Unsupported(f"{what}: expected integers, got {flat.dtype}")
    return [int(v) for v in flat]


def broadcast(shapes: Sequence[Shape], what: str) -> Shape:
    """NumPy's broadcast of shapes, in Python integers (no overflow, no allocation)."""
    from .symdim import broadcast_dims, has_sym
    rank = max((len(s) for s in shapes), default=0)
    if has_sym(list(shapes)):
        # Symbolic dims: literal 1s first (broadcast(seq, 1) is seq), then equal expressions.
        return cast(Shape, tuple(broadcast_dims([s[len(s) - rank + k] for s in shapes
                                                 if len(s) - rank + k >= 0], what)
                                 for k in range(rank)))
    out = []
    for k in range(rank):
        dims = {s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0} - {1}
        if len(dims) > 1:
            raise Unsupported(f"{what}: shapes {[list(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


# The predictions (OpFacts.predict, registered with each op's converter in frontend/convert*.py):
# the output shape of folding node from its inputs xs.
def size_constant_of_shape(node: OnnxNode, xs: list) -> Shape:
    return tuple(_ints(xs[0], "input 0 (shape)"))


def size_range(node: OnnxNode, xs: list) -> Shape:
    start, limit, delta = (float(np.asarray(x).reshape(-1)[0]) if x is not None and
                           np.asarray(x).size else math.nan for x in xs[:3])
    if not all(math.isfinite(v) for v in (start, limit, delta)) or delta == 0:
        raise Unsupported(f"start {start}, limit {limit}, delta {delta}; expected finite "
                          "numbers and a delta other than 0")
    return (max(math.ceil((limit - start) / delta), 0),)


def size_tile(node: OnnxNode, xs: list) -> Shape:
    reps = _ints(xs[1], "input 1 (repeats)")
    if len(reps) != xs[0].ndim or any(r < 0 for r in reps):
        raise Unsupported(f"repeats {reps} for an input of shape {list(xs[0].shape)}; expected "
                          f"{xs[0].ndim} counts >= 0")
    return tuple(d * r for d, r in zip(xs[0].shape, reps))


def size_expand(node: OnnxNode, xs: list) -> Shape:
    return broadcast([xs[0].shape, tuple(_ints(xs[1], "input 1 (shape)"))], "Expand")


def size_one_hot(node: OnnxNode, xs: list) -> Shape:
    depth = np.asarray(xs[1]).reshape(-1)
    if depth.size != 1 or not np.isfinite(depth[0]) or depth[0] < 1:
        raise Unsupported(f"depth {depth.tolist()[:4]}; expected one number >= 1")
    return tuple(xs[0].shape) + (int(depth[0]),)


def size_pad(node: OnnxNode, xs: list) -> Shape:
    pads = node.ints("pads") if node.opset < 11 else _ints(xs[1], "input 1 (pads)")
    axes = list(range(xs[0].ndim)) if node.opset < 11 or len(xs) < 4 or xs[3] is None \
        else _ints(xs[3], "input 3 (axes)")
    if len(pads) != 2 * len(axes):
        raise Unsupported(f"{len(pads)} pads for {len(axes)} axes; expected {2 * len(axes)}")
    shape = list(xs[0].shape)
    for k, a in enumerate(axes):
        if not -len(shape) <= a < len(shape):
            raise Unsupported(f"axes {axes} for rank {len(shape)}")
        shape[a] = max(shape[a] + pads[k] + pads[len(axes) + k], 0)
    return tuple(shape)


def size_resize(node: OnnxNode, xs: list) -> Shape:
    x = xs[0]
    sizes = xs[3] if len(xs) > 3 else None
    if sizes is not None and np.asarray(sizes).size:
        given = _ints(sizes, "input 3 (sizes)")
        return tuple(given) if len(given) == x.ndim else tuple(x.shape)
    scales = node.attr("scales") if node.opset < 9 else (
        xs[1] if node.op_type == "Upsample" or node.opset < 11 else (xs[2] if len(xs) > 2
                                                                     else None))
    if scales is None:
        return tuple(x.shape)
    factors = [float(s) for s in np.asarray(scales, dtype=np.float64).reshape(-1)]
    if not all(math.isfinite(f) and f >= 0 for f in factors):
        raise Unsupported(f"scales {factors[:8]}; expected finite numbers >= 0")
    if len(factors) != x.ndim:
        return tuple(x.shape)
    return tuple(math.floor(d * f) for d, f in zip(x.shape, factors))


def size_gather(node: OnnxNode, xs: list) -> Shape:
    data, idx = xs[0], np.asarray(xs[1])
    axis = int(node.attr("axis", 0))
    if not -data.ndim <= axis < max(data.ndim, 1) or data.ndim == 0:
        raise Unsupported(f"axis {axis} for data of rank {data.ndim}")
    axis %= data.ndim
    return tuple(data.shape[:axis]) + tuple(idx.shape) + tuple(data.shape[axis + 1:])


def size_matmul(node: OnnxNode, xs: list) -> Shape:
    a, b = (tuple(x.shape) for x in xs[:2])
    if len(a) < 2 or len(b) < 2:
        return broadcast([a, b], "MatMul")
    return broadcast([a[:-2], b[:-2]], "MatMul") + (a[-2], b[-1])


def _count(x: np.ndarray | None, what: str) -> int:
    values = _ints(x, what)
    if len(values) != 1 or values[0] < 0:
        raise Unsupported(f"{what} is {values[:8]}; expected one size >= 0")
    return values[0]


def size_window(node: OnnxNode, xs: list) -> Shape:
    return (_count(xs[0], "input 0 (size)"),)


def size_dft(node: OnnxNode, xs: list) -> Shape:
    """At most: the signal axis as long as dft_length, the last axis (real, imaginary)."""
    x = xs[0]
    given = xs[1] if len(xs) > 1 and xs[1] is not None else None
    if node.opset < 20:
        axis = int(node.attr("axis", 1))
    else:
        axis = _ints(xs[2], "input 2 (axis)")[0] if len(xs) > 2 and xs[2] is not None else -2
    if not -x.ndim <= axis < x.ndim:
        raise Unsupported(f"axis {axis} for a signal of rank {x.ndim}")
    shape = list(x.shape[:-1]) + [2]
    axis %= x.ndim
    if given is not None and axis < x.ndim - 1:
        shape[axis] = max(shape[axis], _count(given, "input 1 (dft_length)"))
    return tuple(shape)


def size_stft(node: OnnxNode, xs: list) -> Shape:
    x = xs[0]
    step = _count(xs[1], "input 1 (frame_step)")
    window = xs[2] if len(xs) > 2 else None
    length = xs[3] if len(xs) > 3 else None
    if x.ndim != 3:
        raise Unsupported(f"signal of shape {list(x.shape)}; expected [batch, length, 1 or 2]")
    frame = _count(length, "input 3 (frame_length)") if length is not None else \
        np.asarray(window).shape[0] if window is not None and np.asarray(window).ndim else \
        x.shape[1]
    if x.ndim != 3 or step < 1 or not 0 < frame <= x.shape[1]:
        raise Unsupported(f"signal of shape {list(x.shape)}, frame_step {step}, frame length "
                          f"{frame}; expected [batch, length, 1 or 2], a step >= 1 and a frame "
                          "within the signal")
    return (x.shape[0], 1 + (x.shape[1] - frame) // step, frame, 2)


def size_mel(node: OnnxNode, xs: list) -> Shape:
    return (_count(xs[1], "input 1 (dft_length)") // 2 + 1, _count(xs[0], "input 0 (bins)"))


def size_affine_grid(node: OnnxNode, xs: list) -> Shape:
    size = _ints(xs[1], "input 1 (size)")
    if len(size) not in (4, 5) or any(d < 0 for d in size):
        raise Unsupported(f"size {size[:8]}; expected [N, C, H, W] or [N, C, D, H, W] >= 0")
    return (size[0], *size[2:], len(size) - 2)


def size_max_unpool(node: OnnxNode, xs: list) -> Shape:
    if len(xs) > 2 and xs[2] is not None:
        return tuple(_ints(xs[2], "input 2 (output_shape)"))
    x = xs[0]
    kernel = node.ints("kernel_shape")
    n = len(kernel)
    strides = node.ints("strides", [1] * n)
    pads = node.ints("pads", [0] * 2 * n)
    if x.ndim != n + 2 or len(strides) != n or len(pads) != 2 * n:
        raise Unsupported(f"input of shape {list(x.shape)} for kernel_shape {kernel}, strides "
                          f"{strides}, pads {pads}")
    return tuple(x.shape[:2]) + tuple(max((d - 1) * s + k - pads[i] - pads[n + i], 0) for i, (
        d, s, k) in enumerate(zip(x.shape[2:], strides, kernel)))


def size_of_input(node: OnnxNode, xs: list) -> Shape:
    """Input 0's shape (Quantize/DequantizeLinear: per-axis scales and zero points run along
    `axis`, not NumPy's trailing dims)."""
    return tuple(xs[0].shape)


Work = list[tuple[Shape, str, str]]


# The workspaces (OpFacts.workspace, frontend/convert.py): what the evaluation allocates on the
# way, where that is more than its output (the ONNX reference computes these ops in float64 or
# complex128). Ops whose intermediates are larger still (Tile's per axis, Expand's target) have
# fast paths in fold.py allocating the output only.
def resize_tables(node: OnnxNode, xs: list, out: Shape) -> Work:
    """Resize's workspace: the reference's float64 result and, per resized axis, its (out,
    taps) float64 table (a cubic kernel spans 4 input steps; with antialias a downscale widens
    it by the ratio)."""
    antialias = bool(node.attr("antialias", 0))
    work = [(out, "float64", "its float64 result")]
    for axis, (d_in, d_out) in enumerate(zip(xs[0].shape, out)):
        if d_in != d_out:
            widen = -(-d_in // max(d_out, 1)) if antialias else 1
            work.append(((d_out, 4 * widen + 2), "float64",
                         f"the interpolation table of axis {axis}"))
    return work


def float64_copies(copies: int) -> Callable[[OnnxNode, list, Shape], Work]:
    """The workspace of copies float64 arrays of the output's shape."""
    return lambda node, xs, out: [((copies, *out), "float64", f"{copies} float64 working copies")]


def check_fold_size(node: OnnxNode, inputs: Sequence[np.ndarray | None],
                    expected: Sequence[Shape | None]) -> None:
    """Refuse folding node when its output would pass the import's constant budget."""
    from .convert import op_facts
    facts = op_facts(node.op_type)
    present = [np.asarray(x) for x in inputs if x is not None]
    in_bytes = sum(int(x.nbytes) for x in present)
    itemsize = max([x.dtype.itemsize for x in present] + [4])
    shapes = [s for s in expected if s is not None]
    predict = facts.predict
    if predict is not None and present:
        shapes.append(predict(node, list(inputs)))
    elif len(present) > 1:
        try:
            shapes.append(broadcast([tuple(x.shape) for x in present], node.op_type))
        except Unsupported:
            pass  # not an elementwise op; its own evaluation checks its inputs
    for shape in shapes:
        check_const_bytes(shape, np.dtype(f"V{itemsize}"), f"folding {node.op_type}", in_bytes)
        check_entry(shape, np.dtype(f"V{itemsize}"), f"folding {node.op_type}")  # empty ones
    work = facts.workspace
    if work is not None and predict is not None and present:
        for shape, dtype, what in work(node, list(inputs), shapes[-1]):
            check_const_bytes(shape, dtype, f"folding {node.op_type} ({what})", in_bytes)


def check_folded(node: OnnxNode, results: Sequence[Any],
                 inputs: Sequence[np.ndarray | None]) -> None:
    """The same budget on what folding made (for ops no prediction covers)."""
    in_bytes = sum(int(np.asarray(x).nbytes) for x in inputs if x is not None)
    for r in results:
        if r is not None:
            array = np.asarray(r)
            check_const_bytes(array.shape, array.dtype, f"folding {node.op_type}", in_bytes)
