"""Index arithmetic as one index_expr op (lib/ops/index_expr.py).

Exporters write a decoder's causal and padding mask as some twenty small ops over the sequence
and past lengths: Ranges (lowered to cumsums of ones), Unsqueezes, comparisons, a Gather of the
attention mask at batch * total + position, logical ands and a Where (transformers' mask
builder, in every architecture it serves). Each such value is worked out here as a function of
its own indices, symbolically, op by op: a cumsum of ones is its index, a reshape that only
adds or drops axes of size one renames indices, an elementwise op combines its operands'
functions as it broadcasts them, a Gather of a flattened value reads it at the index function.
Where the whole cone of a value read by other ops (or given out) is so described, holds a cumsum
and at least three prims, that value becomes one index_expr of the graph inputs it reads and
the inputs whose shapes hold its dims. The expression keeps every op as the NumPy function the
op runs, on the same dtypes, so the value is the same, bit for bit; anything else (a float
input, a constant array, an axis whose size cannot be told equal) leaves the prims as they are.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...graph.symbolic import names_in
from ..ir import Prim, Value
from ..symdim import Sym, is_int, same
from ...lib.ops.index_expr import DTYPES, FUNCTIONS, MAX_STEPS, MODES

# the prims whose operands and output share one dtype, and those giving bool
_ARITHMETIC = ("add", "subtract", "multiply")
_COMPARE = ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")
_LOGICAL = ("logical_and", "logical_or", "logical_not")
_INDEXES = ("int32", "int64")
MIN_PRIMS = 3  # fewer: nothing worth a kernel of its own


@dataclass(frozen=True)
class _Form:
    """A value as a function of its indices: expr over ["idx", axis] of its own axes (None for
    a flattening, read back only by a reshape to flat_of's dims), its shape and dtype, the ids
    of the prims computing it and whether a cumsum (an index) is among them."""

    expr: Any
    shape: tuple[Any, ...]
    dtype: str
    cone: frozenset[int]
    indexed: bool
    flat_of: _Form | None = None
    # its expr's steps, counted as the program will write them out (a value read twice in a
    # cone is written twice: bounded, so a graph doubling a value per op makes no huge tree)
    size: int = 1


def _remap(e: Any, axes: dict[int, Any]) -> Any:
    """e with each ["idx", a] of its grid replaced by axes[a] (a take's data keeps its own)."""
    kind = e[0]
    if kind == "idx":
        return axes[e[1]]
    if kind in ("const", "dim"):
        return e
    if kind == "read":
        return ["read", e[1], [_remap(i, axes) for i in e[2]]]
    if kind == "take":
        return ["take", e[1], e[2], _remap(e[3], axes), e[4]]
    if kind == "cast":
        return ["cast", e[1], _remap(e[2], axes)]
    return [kind] + [_remap(a, axes) for a in e[1:]]


_ZERO = ["const", 0, "int64"]


def _broadcast(form: _Form, shape: tuple[Any, ...]) -> Any:
    """form's expr on the grid of shape (right-aligned, as NumPy broadcasts), or None where an
    axis neither matches nor is one."""
    if form.expr is None or len(form.shape) > len(shape):
        return None
    off = len(shape) - len(form.shape)
    axes = {}
    for a, d in enumerate(form.shape):
        out = shape[a + off]
        if is_int(d, 1):
            axes[a] = _ZERO if not is_int(out, 1) else ["idx", a + off]
        elif same(d, out):
            axes[a] = ["idx", a + off]
        else:
            return None
    return _remap(form.expr, axes)


def _unit_map(src: tuple[Any, ...], dst: tuple[Any, ...]) -> dict[int, Any] | None:
    """src's axes on dst's grid where dst only adds or drops axes of size one."""
    big_src = [a for a, d in enumerate(src) if not is_int(d, 1)]
    big_dst = [b for b, d in enumerate(dst) if not is_int(d, 1)]
    if len(big_src) != len(big_dst) or not all(same(src[a], dst[b])
                                               for a, b in zip(big_src, big_dst)):
        return None
    axes: dict[int, Any] = {a: _ZERO for a in range(len(src))}
    axes.update({a: ["idx", b] for a, b in zip(big_src, big_dst)})
    return axes


def _scalar(v: Value) -> _Form | None:
    if v.const is None or v.const.size != 1 or str(v.const.dtype) not in DTYPES:
        return None
    item = v.const.reshape(-1)[0].item()
    if isinstance(item, float) and not np.isfinite(item):
        return None
    return _Form(["const", item, str(v.const.dtype)], tuple(v.shape), str(v.const.dtype),
                 frozenset(), False)


def _leaf(v: Value) -> _Form | None:
    if not v.is_input or v.const is not None or v.dtype not in ("bool",) + _INDEXES:
        return None
    return _Form(["read", v, [["idx", a] for a in range(v.rank)]], tuple(v.shape), v.dtype,
                 frozenset(), False, size=1 + v.rank)


def _form(p: Prim, forms: dict[int, _Form], dims: dict[str, tuple[Value, int]]) -> _Form | None:
    """p's output as a _Form from its operands' (None where it is none)."""
    if len(p.outputs) != 1:
        return None
    out = p.outputs[0]
    shape, dtype = tuple(out.shape), out.dtype
    if dtype not in DTYPES:
        return None
    ins: list[_Form] = []
    for v in p.inputs:
        f = forms.get(id(v)) or _scalar(v) or _leaf(v)
        if f is None:
            if p.op != "dim_values" and not (p.op == "take" and v is p.inputs[0]):
                return None
            # (a shape read, or a take's data found through its producer below)
            f = _Form(None, tuple(v.shape), v.dtype, frozenset(), False)
        ins.append(f)
    cone = frozenset().union(*(f.cone for f in ins)) | {id(p)}
    indexed = any(f.indexed for f in ins)
    size = 2 + sum(f.size for f in ins)  # (a cumsum's or cast's step and its operands')
    if size > MAX_STEPS:
        return None

    def made(expr: Any, flat_of: _Form | None = None, index: bool = False) -> _Form | None:
        if expr is None and flat_of is None:
            return None
        return _Form(expr, shape, dtype, cone, indexed or index, flat_of, size)
    op = p.op
    if op in FUNCTIONS and op in _ARITHMETIC + _COMPARE + _LOGICAL + ("where",):
        if op in _ARITHMETIC and any(f.dtype != dtype for f in ins):
            return None
        if op in _COMPARE and (dtype != "bool" or len({f.dtype for f in ins}) != 1):
            return None
        if op in _LOGICAL and (dtype != "bool" or any(f.dtype != "bool" for f in ins)):
            return None
        if op == "where" and (ins[0].dtype != "bool" or ins[1].dtype != dtype
                              or ins[2].dtype != dtype):
            return None
        args = [_broadcast(f, shape) for f in ins]
        return None if any(a is None for a in args) else made([op] + args)
    if op == "cast":
        if p.attrs.get("dtype") != dtype or ins[0].dtype not in DTYPES:
            return None
        arg = _broadcast(ins[0], shape)
        return None if arg is None else made(["cast", dtype, arg])
    if op == "broadcast_to":
        return made(_broadcast(ins[0], shape))
    if op == "cumsum":
        const = ins[0].expr
        axis = int(p.attrs.get("axis", 0)) % max(len(shape), 1)
        if const is None or const[0] != "const" or dtype != "int64" or const[2] != "int64" \
                or p.attrs.get("reverse"):
            return None
        index: Any = ["idx", axis]
        if not p.attrs.get("exclusive"):
            index = ["add", index, ["const", 1, "int64"]]
        return made(index if const[1] == 1 else ["multiply", const, index], index=True)
    if op == "dim_values":
        at, values = p.attrs.get("at"), p.attrs.get("values")
        if not at or not isinstance(values, list) or len(values) != 1 \
                or dtype not in _INDEXES or not all(is_int(d, 1) for d in shape):
            return None
        for name, pos, axis in at:
            dims.setdefault(str(name), (p.inputs[int(pos)], int(axis)))
        value: Any = ["dim", values[0]]
        return made(value if dtype == "int64" else ["cast", dtype, value])
    if op == "reshape":
        src = ins[0]
        if src.expr is not None:
            axes = _unit_map(src.shape, shape)
            if axes is not None:
                return made(_remap(src.expr, axes))
            if len(shape) == 1:
                return made(None, flat_of=src)
            return None
        if src.flat_of is not None:
            axes = _unit_map(src.flat_of.shape, shape)
            return None if axes is None else made(_remap(src.flat_of.expr, axes))
        return None
    if op == "take":
        if int(p.attrs.get("axis", 0)) != 0 or p.attrs.get("mode", "clip") not in MODES \
                or p.attrs.get("batch_dims", 0) or ins[1].expr is None \
                or ins[1].dtype not in _INDEXES:
            return None
        data = p.inputs[0]
        if not all(is_int(d, 1) for d in data.shape[1:]):
            return None  # (axis 0 of data then indexes its elements in order)
        source = ins[0] if ins[0].expr is not None else ins[0].flat_of
        if source is None and data.producer is not None and data.producer.op == "reshape":
            # a reshape's elements in order are those of the value it reshapes
            inner = data.producer.inputs[0]
            found = forms.get(id(inner)) or _leaf(inner)
            source = None if found is None else found if found.expr is not None \
                else found.flat_of
            if source is not None:
                cone |= source.cone | {id(data.producer)}
                indexed = indexed or source.indexed
                size += source.size
        if source is None or source.expr is None or size + 3 > MAX_STEPS:
            return None
        size += 3  # (its grid, flat and take steps)
        return made(["take", source.expr, list(source.shape), ins[1].expr,
                     p.attrs.get("mode", "clip")])
    return None


def _text(d: Any) -> Any:
    return str(d) if isinstance(d, Sym) else int(d)


def _program(e: Any, inputs: list[Value], steps: list[list[Any]]) -> None:
    """e's steps (index_expr's program: its operands first) appended to steps, its Values as
    input positions (appended to inputs), its dims as text."""
    kind = e[0]
    if kind in ("idx", "const", "dim"):
        steps.append(list(e))
    elif kind == "read":
        for index in e[2]:
            _program(index, inputs, steps)
        steps.append(["read", _position(inputs, e[1])])
    elif kind == "take":
        steps.append(["grid"] + [_text(d) for d in e[2]])
        _program(e[1], inputs, steps)
        steps.append(["flat"])
        _program(e[3], inputs, steps)
        steps.append(["take", e[4]])
    elif kind == "cast":
        _program(e[2], inputs, steps)
        steps.append(["cast", e[1]])
    else:
        for a in e[1:]:
            _program(a, inputs, steps)
        steps.append([kind])


def _position(inputs: list[Value], v: Value) -> int:
    """v's position among inputs, appended where it is not there yet."""
    k = next((i for i, x in enumerate(inputs) if x is v), len(inputs))
    if k == len(inputs):
        inputs.append(v)
    return k


def _names(steps: list[list[Any]]) -> set[str]:
    """The dim names a program reads."""
    read = [step[1] for step in steps if step[0] == "dim"]
    read += [d for step in steps if step[0] == "grid" for d in step[1:]]
    return {n for d in read for n in _dim_names(d)}


def _dim_names(d: Any) -> list[str]:
    return names_in(d) if isinstance(d, str) else []


def fuse_index_expr(prims: list[Prim], outputs: list[Value],
                    dims_at: dict[str, tuple[Value, int]]) -> tuple[list[Prim], Counter]:
    """Each value whose cone is index arithmetic (see the module docstring) as one
    index_expr prim; dims_at: per dim name, a graph input and axis holding it."""
    dims = dict(dims_at)
    forms: dict[int, _Form] = {}
    for p in prims:
        if p.op == "index_expr":
            continue
        f = _form(p, forms, dims)
        if f is not None:
            forms[id(p.outputs[0])] = f
    readers: dict[int, list[Prim]] = {}
    for p in prims:
        for v in p.inputs:
            readers.setdefault(id(v), []).append(p)
    given = {id(v) for v in outputs}
    counts: Counter = Counter()
    out = list(prims)
    for k, p in enumerate(prims):
        if len(p.outputs) != 1:
            continue
        v = p.outputs[0]
        f = forms.get(id(v))
        if f is None or f.expr is None or not f.indexed or len(f.cone) < MIN_PRIMS:
            continue
        if id(v) not in given and all(len(r.outputs) == 1 and id(r.outputs[0]) in forms
                                      for r in readers.get(id(v), [])):
            continue  # read only by prims of larger regions
        prim = _index_prim(v, f, dims, p.origin)
        if prim is not None:
            out[k] = prim
            counts["index_expr"] += 1
    return out, counts


def _index_prim(v: Value, f: _Form, dims: dict[str, tuple[Value, int]], origin: str
                ) -> Prim | None:
    """The index_expr prim giving v, or None where a dim it reads has no input to read it."""
    inputs: list[Value] = []
    expr: list[list[Any]] = []
    _program(f.expr, inputs, expr)
    if len(expr) > MAX_STEPS:
        return None
    shape = [_text(d) for d in f.shape]
    names = {n for d in shape for n in _dim_names(d)} | _names(expr)
    at = []
    for name in sorted(names):
        if name not in dims:
            return None
        source, axis = dims[name]
        at.append([name, _position(inputs, source), axis])
    prim = Prim("index_expr", {"at": at, "shape": shape, "dtype": f.dtype, "expr": expr},
                inputs, [v], origin)
    v.producer = prim
    return prim
