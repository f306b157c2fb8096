"""Output specs of standard ops whose shapes or attrs hold symbolic dims (frontend/symdim.py)."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from ..errors import LibraryError
from ..lib.library import TensorSpec
from ..lib.registry import OPS
from .ir import Unsupported
from .symdim import (Sym, Undecidable, as_int, broadcast_dims, clamped_by, decided_unequal,
                     has_sym, index_of_same_size, slice_range, window_length)

Rule = Callable[[Sequence[TensorSpec], Mapping[str, Any]], list[TensorSpec]]


def _spec(shape: Sequence[Any], dtype: str) -> TensorSpec:
    """A TensorSpec whose int slots hold symbolic dims too (the import's use of the type)."""
    return TensorSpec(cast(tuple[int, ...], tuple(shape)), dtype)


def _reshape(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = inputs[0]
    shape = [as_int(d) for d in attrs["newshape"]]
    if any(isinstance(d, int) and d < 0 for d in shape) or (
            not attrs.get("allowzero") and any(isinstance(d, int) and d == 0 for d in shape)):
        raise Unsupported(f"reshape to {[str(d) for d in shape]} with symbolic dims: expected "
                          "every size given (no -1 or copied 0)")
    if decided_unequal(math.prod(shape), math.prod(spec.shape)):
        raise Unsupported(f"cannot reshape {[str(d) for d in spec.shape]} to "
                          f"{[str(d) for d in shape]}")
    return [_spec(shape, spec.dtype)]


def _broadcast_to(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = inputs[0]
    shape = tuple(as_int(d) for d in attrs["shape"])
    pad = len(shape) - len(spec.shape)
    if pad < 0:
        raise Unsupported(f"broadcast_to {[str(d) for d in shape]} of a larger rank input")
    for k, d in enumerate(spec.shape):
        if not broadcast_dims([d, shape[pad + k]], "broadcast_to") == shape[pad + k]:
            raise Unsupported(f"cannot broadcast {[str(x) for x in spec.shape]} to "
                              f"{[str(x) for x in shape]}")
    return [_spec(shape, spec.dtype)]


def _tile(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = inputs[0]
    reps = [as_int(r) for r in attrs["reps"]]
    if len(reps) != len(spec.shape):
        raise Unsupported(f"tile: {len(reps)} repeats for rank {len(spec.shape)}")
    return [_spec([d * r for d, r in zip(spec.shape, reps)], spec.dtype)]


def _strided_slice(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    spec = inputs[0]
    shape: list[Any] = list(spec.shape)
    begin, end, strides = attrs["begin"], attrs["end"], attrs["strides"]
    axes = attrs.get("axes") or list(range(len(begin)))
    for b, e, s, a in zip(begin, end, strides, axes):
        _, _, count = slice_range(shape[a], b, shape[a] if e is None else e, int(s))
        shape[a] = count
    return [_spec(shape, spec.dtype)]


def _dim_values(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    return [TensorSpec(tuple(int(d) for d in attrs["shape"]), str(attrs["dtype"]))]


RULES: dict[str, Rule] = {"reshape": _reshape, "broadcast_to": _broadcast_to, "tile": _tile,
                          "strided_slice": _strided_slice, "dim_values": _dim_values}


def infer(op: str, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    """op's output specs for inputs or attrs holding symbolic dims (Unsupported where neither
    a rule here nor the op's own rule can tell them)."""
    rule = RULES.get(op)
    if rule is not None and has_sym([list(s.shape) for s in inputs] + list(attrs.values())):
        return rule(inputs, attrs)
    inputs = _unclamped(inputs)
    try:
        specs = OPS[op].infer(list(inputs), attrs)
        if op.startswith(_WINDOW_OPS):
            specs = [_spec([window_length(d) for d in s.shape], s.dtype) for s in specs]
        return specs
    except (Undecidable, LibraryError, TypeError, ValueError) as e:
        unified = _unified(inputs)
        if unified is not None:  # one size under two formulas (symdim.same_size)
            try:
                return infer(op, unified, attrs)
            except Unsupported:
                pass
        return _at_markers(op, inputs, attrs, e)


def _unified(inputs: Sequence[TensorSpec]) -> list[TensorSpec] | None:
    """The inputs with each symbolic dim that is the same size as one met before it
    (symdim.same_size, in the inputs' order) written as that one; None where none is."""
    met: list[Sym] = []

    def one(d: Any) -> Any:
        if not isinstance(d, Sym):
            return d
        k = index_of_same_size(d, met)
        if k is not None:
            return met[k]
        met.append(d)
        return d

    out = [TensorSpec(tuple(one(d) for d in s.shape), s.dtype) for s in inputs]
    changed = any(a is not b for s, t in zip(inputs, out) for a, b in zip(s.shape, t.shape))
    return out if changed else None


# Sliding-window ops: their output lengths are floor divisions that exist only where the window
# fits (symdim.window_length).
_WINDOW_OPS = ("conv", "max_pool", "avg_pool", "lp_pool", "deformable_conv")


def _unclamped(inputs: Sequence[TensorSpec]) -> list[TensorSpec]:
    """The inputs with a dim min(seq, c) read as seq where another input has seq (see
    symdim.broadcast_dims: a slice of a c-row table meeting the input it serves)."""
    dims = [d for s in inputs for d in s.shape if isinstance(d, Sym)]
    out = []
    for spec in inputs:
        shape = tuple(next((x for x in dims if clamped_by(d, x)), d) for d in spec.shape)
        out.append(TensorSpec(shape, spec.dtype))
    return out


# Two sets of stand-in values for symbolic dims: distinct primes no model holds as a size.
_MARKERS = ([1000003, 1000033, 1000037, 1000039, 1000081, 1000099, 1000117, 1000121],
            [2000003, 2000029, 2000039, 2000081, 2000083, 2000093, 2000107, 2000113])


def _at_markers(op: str, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
                error: Exception) -> list[TensorSpec]:
    """The op's own rule (which needs numbers) run twice, each symbolic dim standing for one
    of two distinct primes: an output dim that is the same number both times is that number,
    one that is a dim's stand-in both times is that dim; anything else is refused.

    Only whole dims are mapped back (never arithmetic on them), and the specialiser checks
    every node's shapes again with the real values."""
    syms: list[Sym] = []  # distinct by canonical form (== may not be decidable between them)

    def collect(v: Any) -> None:
        if isinstance(v, Sym):
            if all(v.terms != s.terms for s in syms):
                syms.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                collect(x)

    for spec in inputs:
        collect(list(spec.shape))
    for value in attrs.values():
        collect(value)
    shapes = ", ".join("(" + ", ".join(str(d) for d in s.shape) + ")" for s in inputs)
    refusal = Unsupported(f"{op} cannot compute its shape with symbolic dims (inputs {shapes}):"
                          f" {error}")
    if len(syms) > len(_MARKERS[0]):
        raise refusal from error
    runs = []
    for markers in _MARKERS:
        table = {sym.terms: markers[k] for k, sym in enumerate(syms)}

        def put(v: Any) -> Any:
            if isinstance(v, Sym):
                return table[v.terms]
            if isinstance(v, (list, tuple)):
                return type(v)(put(x) for x in v)
            return v

        try:
            runs.append(OPS[op].infer([TensorSpec(put(tuple(s.shape)), s.dtype) for s in inputs],
                                      {k: put(v) for k, v in attrs.items()}))
        except LibraryError as e:
            # Refused with numbers too (a dtype the op lacks): the op's own error, so the
            # builder may widen the dtype as it does for static shapes.
            raise e from error
        except (TypeError, ValueError):
            raise refusal from error
    back = [{m: sym for sym, m in zip(syms, markers)} for markers in _MARKERS]
    out = []
    for first, second in zip(*runs):
        if first.dtype != second.dtype or len(first.shape) != len(second.shape):
            raise refusal from error
        dims: list[Any] = []
        for a, b in zip(first.shape, second.shape):
            a, b = int(a), int(b)
            if a in back[0] and back[0][a] is back[1].get(b):
                dims.append(back[0][a])
            elif a == b and a not in back[0] and a not in back[1]:
                dims.append(a)
            else:
                raise refusal from error
        out.append(TensorSpec(tuple(dims), first.dtype))
    return out
