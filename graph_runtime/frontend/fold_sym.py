"""Folding of shape-valued tensors holding symbolic dims (object arrays of ints and Syms)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .ir import Unsupported
from .onnx_node import OnnxNode
from .symdim import floordiv, has_sym, mod, nonneg, sym_max, sym_min


def normal(array: np.ndarray) -> np.ndarray:
    """An object array with no Sym left as int64; otherwise the object array."""
    array = np.asarray(array, dtype=object)
    if has_sym(array):
        return array
    return array.astype(np.int64)


def _ints(x: np.ndarray, what: str) -> list[int]:
    if has_sym(x):
        raise Unsupported(f"{what} holds symbolic dims; expected numbers known at import")
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _div(a: Any, b: Any) -> Any:
    """ONNX's integer Div, which truncates: floor division where a >= 0 is known, else
    max(a, 0)//b - max(-a, 0)//b (exact for any sign of a, b > 0)."""
    if nonneg(a) and nonneg(b):
        return floordiv(a, b)
    if isinstance(b, int) and b > 0:
        return floordiv(sym_max(a, 0), b) - floordiv(sym_max(-a, 0), b)
    raise Unsupported(f"integer Div of {a} by {b}: the signs are not known at import")


def _eq(a: Any, b: Any) -> bool:
    return bool(a == b)


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Div": _div, "Max": sym_max, "Min": sym_min, "Equal": _eq,
    "Less": lambda a, b: bool(a < b), "Greater": lambda a, b: bool(a > b),
    "LessOrEqual": lambda a, b: bool(a <= b), "GreaterOrEqual": lambda a, b: bool(a >= b)}
_BOOL = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})


def fold_symbolic(node: OnnxNode, inputs: Sequence[np.ndarray | None],
                  opset_imports: Any) -> list[np.ndarray]:
    """node folded on object arrays of ints and Syms; Unsupported where it cannot be."""
    op = node.op_type
    xs: list[Any] = [None if x is None else np.asarray(x) for x in inputs]
    x = xs[0] if xs else None
    if x is None:
        raise Unsupported(f"{op}: input 0 omitted")
    if x.dtype != object and x.dtype.kind not in "iub":
        raise Unsupported(f"{op} of {x.dtype} with symbolic dims")
    if op in ("Identity",):
        return [x]
    if op == "Cast":
        from .onnx_model import np_dtype
        if np_dtype(int(node.attr("to"))) != "int64":
            raise Unsupported("Cast of symbolic dims to a type other than int64")
        return [x]
    if op == "Neg":
        return [normal(-x.astype(object))]
    if op == "Mod":
        if int(node.attr("fmod", 0)):
            raise Unsupported("Mod with fmod=1 of symbolic dims")
        return [normal(np.frompyfunc(mod, 2, 1)(x.astype(object), xs[1].astype(object)))]
    if op in _BINARY and len(xs) == 2 and xs[1] is not None:
        out = np.frompyfunc(_BINARY[op], 2, 1)(x.astype(object), xs[1].astype(object))
        return [np.asarray(out, bool) if op in _BOOL else normal(out)]
    if op in ("Max", "Min", "Sum") and all(v is not None for v in xs):
        fn = {"Max": sym_max, "Min": sym_min, "Sum": lambda a, b: a + b}[op]
        acc = x.astype(object)
        for other in xs[1:]:
            acc = np.frompyfunc(fn, 2, 1)(acc, other.astype(object))
        return [normal(acc)]
    if op == "Where":
        cond = xs[0]
        if has_sym(cond):
            raise Unsupported("Where with a symbolic condition")
        return [normal(np.where(cond.astype(bool), xs[1].astype(object), xs[2].astype(object)))]
    if op == "Gather":
        data, idx = x, xs[1]
        axis = int(node.attr("axis", 0))
        n = data.shape[axis] if data.ndim else 0
        wide = np.array(_ints(idx, "Gather indices"), np.int64).reshape(idx.shape)
        if wide.size and (wide.min() < -n or wide.max() >= n):
            raise Unsupported(f"Gather index out of range for axis {axis} of size {n}")
        return [normal(np.take(data, np.where(wide < 0, wide + n, wide), axis=axis))]
    if op == "Slice":
        return [_slice(node, xs)]
    if op == "Concat":
        return [normal(np.concatenate([v.astype(object) for v in xs if v is not None],
                                      axis=int(node.attr("axis"))))]
    if op in ("Unsqueeze", "Squeeze", "Reshape", "Flatten"):
        return [normal(_reshaped(node, xs, opset_imports))]
    if op == "Expand":
        target = _ints(xs[1], "Expand's shape")
        return [normal(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(target))).copy())]
    if op == "Size":
        return [np.array(x.size, np.int64)]
    if op == "Shape":
        return [np.array(x.shape, np.int64)[int(node.attr("start", 0)):node.attr("end")]]
    raise Unsupported(f"{op} of symbolic dims is not folded at import")


def _slice(node: OnnxNode, xs: list) -> np.ndarray:
    x = xs[0]
    starts = _ints(xs[1], "Slice starts")
    ends = _ints(xs[2], "Slice ends")
    axes = _ints(xs[3], "Slice axes") if len(xs) > 3 and xs[3] is not None \
        else list(range(len(starts)))
    steps = _ints(xs[4], "Slice steps") if len(xs) > 4 and xs[4] is not None \
        else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a % x.ndim] = slice(s, e, st)
    return normal(x[tuple(index)])


def _reshaped(node: OnnxNode, xs: list, opset_imports: Any) -> np.ndarray:
    from .fold import fold
    if has_sym(list(xs[1:])):
        raise Unsupported(f"{node.op_type} to a shape holding symbolic dims is not folded")
    # The index bookkeeping of these ops never reads the values: fold a same-shaped array of
    # positions, then pick the symbolic values by them.
    positions = np.arange(xs[0].size, dtype=np.int64).reshape(xs[0].shape)
    moved = fold(node, [positions, *xs[1:]], opset_imports)[0]
    return xs[0].reshape(-1)[np.asarray(moved)]
