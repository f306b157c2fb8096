"""The importer's lowered graph: values with static specs, and standard-op calls built on them."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import EXTENDED_DTYPES
from ..errors import LibraryError
from ..lib.library import TensorSpec
from ..lib.registry import OPS, load_standard_ops

# Ops whose result on narrow integers equals the result on wider ones cast back (wrapping
# arithmetic, comparisons, selections, bit operations): the importer runs those of them the op
# library lacks for int8/int16/uint8/uint16/uint32 on int32/int64 instead.
WIDEN_SAFE = frozenset({"add", "subtract", "multiply", "negative", "abs", "maximum", "minimum",
                        "clip", "where", "relu", "equal", "not_equal", "less", "less_equal",
                        "greater", "greater_equal", "bitwise_and", "bitwise_or", "bitwise_xor",
                        "bitwise_not", "left_shift", "sum", "max", "min", "sign", "copy",
                        "floor_divide", "mod"})
WIDER = {"int8": "int32", "int16": "int32", "uint8": "int32", "uint16": "int32",
         "uint32": "int64"}


class Unsupported(Exception):
    """A node the importer cannot express exactly; the message says what (op, attr value, dtype)."""


class NeedsValue(Unsupported):
    """An input that decides shapes (a Reshape's target, a TopK's k) is computed at run time."""


class TooLarge(Unsupported):
    """A value the import would make is over its byte budget or a graph entry's limits (final:
    no converter may retry)."""


# A constant the import makes (folded, or a table a converter builds) may hold this many bytes,
# or as many as 8x its inputs when they are larger (a Cast or Transpose of weights): a model of a
# few hundred bytes cannot make the import allocate gigabytes.
MADE_CONST_BYTES = 64 << 20


def check_const_bytes(shape: Sequence[int], dtype: Any, what: str, inputs_bytes: int = 0) -> None:
    """Refuse, before it is allocated, a constant larger than the import's budget."""
    count = 1
    for d in shape:
        count *= max(int(d), 0)
    nbytes = count * np.dtype(dtype).itemsize
    limit = max(MADE_CONST_BYTES, 8 * inputs_bytes)
    if nbytes > limit:
        from .._text import fmt_bytes
        raise TooLarge(f"{what}: a constant of shape {list(shape)} {np.dtype(dtype)} "
                          f"({fmt_bytes(nbytes)}) made at import; expected at most "
                          f"{fmt_bytes(limit)}")


# The most dims a value may have: the graph format's limit (graph/checks.py), and NumPy's for
# broadcasting (np.broadcast raises RuntimeError past 32).
MAX_RANK = 32


def check_rank(shape: Sequence[int], what: str) -> None:
    """Refuse a shape of more dims than a graph entry may have."""
    if len(shape) > MAX_RANK:
        raise TooLarge(f"{what}: {len(shape)} dims; expected at most {MAX_RANK} (the "
                       "graph format's limit)")


def check_entry(shape: Sequence[int], dtype: Any, what: str) -> None:
    """Refuse a shape no graph entry may have: too many dims, or 2^63 bytes or more (zero
    dims counted as 1, as the graph format counts them)."""
    check_rank(shape, what)
    nbytes = np.dtype(dtype).itemsize
    for d in shape:
        if not isinstance(d, (int, np.integer)):
            return  # a symbolic dim: checked when the module is specialised for its value
        nbytes *= max(int(d), 1)
    if nbytes >= 1 << 63:
        kind = np.dtype(dtype)
        name = f"{kind.itemsize}-byte elements" if kind.kind == "V" else str(kind)
        raise TooLarge(f"{what}: shape {[int(d) for d in shape][:8]} of {name} would hold "
                       "2^63 bytes or more (zero dims counted as 1); no array can")


# ONNX dtypes the runtime can hold in an entry (params format and backends).
RUNTIME_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                  "uint16", "uint32", "uint64", "bool") + EXTENDED_DTYPES


@dataclass(eq=False)
class Value:
    """One tensor: a graph input, a constant known at import, or a prim's output."""

    name: str
    shape: tuple[Any, ...]  # ints, or symbolic dims (frontend/symdim.py's Sym)
    dtype: str
    # Known at import; an object array of ints and Syms for a shape-valued tensor that follows
    # symbolic dims (a prim reading it as data gets it from a dim_values node).
    const: np.ndarray | None = None
    producer: Prim | None = None
    is_input: bool = False
    # A value computed by ops whose value at this import's shapes is known too (it follows
    # symbolic dims: frontend/convert_dims.py): data reads take the ops' output, a slot read
    # at import (a Reshape's target, a Range's limit) takes this.
    known: np.ndarray | None = None

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.shape, self.dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(eq=False)
class Prim:
    """One standard-op call: op name, lib attrs, input values, output values, ONNX node name."""

    op: str
    attrs: dict[str, Any]
    inputs: list[Value]
    outputs: list[Value] = field(default_factory=list)
    origin: str = ""


def has_op(name: str) -> bool:
    """Whether the op library defines name (a converter asking for another is refused)."""
    load_standard_ops()
    return name in OPS


def _dim(d: Any) -> Any:
    """A dim as a Python int, or the symbolic dim itself."""
    from .symdim import Sym
    return d if isinstance(d, Sym) else int(d)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    return value


class Builder:
    """Collects prims in topological order; every prim's outputs come from its op's infer."""

    def __init__(self) -> None:
        load_standard_ops()
        self.prims: list[Prim] = []
        self.origin = ""
        self._count = 0
        # Set when some size is decided by the data (and may be 0 at run time): a reshape's 0
        # is then a size, never relay's "copy this dim" (lib reshape's allowzero).
        self.sizes_may_be_zero = False
        # A graph input whose shape holds symbolic dims: what dim_values nodes read (their
        # values come from the bound dims, the input only orders them after binding).
        self.anchor: Value | None = None
        # per dim name, the graph input and axis holding it: a dim_values node reading only
        # such names takes those inputs and reads their shapes at run time
        self.dims_at: dict[str, tuple[Value, int]] = {}

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}#{self._count}"

    def const(self, array: Any, hint: str = "const", dtype: Any = None) -> Value:
        """A constant value (becomes a param if a prim reads it)."""
        from .symdim import has_sym
        if has_sym(array):
            data = np.asarray(array, dtype=object)
            check_rank(data.shape, f"constant {hint!r}")
            return Value(self.fresh(hint), tuple(int(d) for d in data.shape),
                         str(np.dtype(dtype or "int64")), const=data)
        data = np.asarray(array, dtype=dtype)
        if data.dtype == object and data.size and all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                for v in data.reshape(-1)):
            data = data.astype(np.int64)  # shape arithmetic whose symbolic dims all cancelled
        check_rank(data.shape, f"constant {hint!r}")
        if data.dtype == np.float64 and dtype is None and not isinstance(array, np.ndarray):
            data = data.astype(np.float32)
        return Value(self.fresh(hint), tuple(int(d) for d in data.shape), str(data.dtype),
                     const=data)

    def scalar(self, value: float, like: Value) -> Value:
        """A 0-d constant of like's dtype."""
        return self.const(np.array(value, dtype=like.dtype), "scalar")

    def ops(self, op: str, inputs: Sequence[Value], **attrs: Any) -> list[Value]:
        """Call a standard op; its infer checks the inputs and gives the output specs."""
        if not has_op(op):
            raise Unsupported(f"needs standard op {op!r}, which the op library does not have")
        for k, v in enumerate(inputs):
            if v is None:
                raise Unsupported(f"{op}: its input {k} would be an omitted ('') ONNX input; "
                                  "the conversion needs it")
        from .symdim import has_sym
        if any(v.const is not None and has_sym(v.const) for v in inputs):
            inputs = [self.dim_values(v) for v in inputs]
        clean = {k: _jsonable(v) for k, v in attrs.items() if v is not None}
        for name, value in clean.items():
            if isinstance(value, float) and not np.isfinite(value):
                raise Unsupported(f"{op}: attribute {name!r} = {value} (lib.json holds finite "
                                  "numbers only)")
        try:
            if has_sym([list(v.shape) for v in inputs] + list(clean.values())):
                from .sym_infer import infer
                specs = infer(op, [v.spec for v in inputs], clean)
            else:
                specs = OPS[op].infer([v.spec for v in inputs], clean)
        except LibraryError as e:
            widened = self._widened(op, inputs, clean)
            if widened is None:
                raise Unsupported(str(e)) from e
            return widened
        for k, spec in enumerate(specs):
            check_entry(spec.shape, spec.dtype, f"{op} output {k}")
        prim = Prim(op, clean, list(inputs), [], self.origin)
        prim.outputs = [Value(self.fresh(op), tuple(_dim(d) for d in s.shape), str(s.dtype),
                              producer=prim) for s in specs]
        self.prims.append(prim)
        return prim.outputs

    def _widened(self, op: str, inputs: Sequence[Value],
                 attrs: dict[str, Any]) -> list[Value] | None:
        """op on narrow integers computed on wider ones and cast back; None when not exact."""
        narrow = {v.dtype for v in inputs if v.dtype != "bool"}
        if "bfloat16" in narrow and op not in ("cast", "convert_type"):
            # bfloat16 storage, float32 arithmetic (each result rounded back once).
            wide = [self.cast(v, "float32") if v.dtype == "bfloat16" else v for v in inputs]
            try:
                outs = self.ops(op, wide, **attrs)
            except Unsupported:
                return None
            return [self.cast(v, "bfloat16") if v.dtype == "float32" else v for v in outs]
        if op not in WIDEN_SAFE or len(narrow) != 1 or next(iter(narrow)) not in WIDER:
            return None
        dtype = next(iter(narrow))
        wide = [v if v.dtype == "bool" else self.cast(v, WIDER[dtype]) for v in inputs]
        try:
            outs = self.ops(op, wide, **attrs)
        except Unsupported:
            return None
        return [self.cast(v, dtype) if v.dtype == WIDER[dtype] else v for v in outs]

    def dim_values(self, v: Value) -> Value:
        """v itself, or, for a shape-valued constant holding symbolic dims, a node computing it
        from the bound dims at run time (lib op dim_values)."""
        from .symdim import has_sym
        if v.const is None or not has_sym(v.const):
            return v
        if self.anchor is None:
            raise Unsupported(f"{v.name}: a value holding symbolic dims and no input to bind them")
        values = [_dim(d) for d in v.const.reshape(-1)]
        from .symdim import Sym
        names = {n for d in values if isinstance(d, Sym) for n in d.names()}
        if names.issubset(self.dims_at):
            # its inputs are the graph inputs holding the names, whose shapes it reads per
            # run: one kernel serves every value of them (a decoder's past length)
            inputs: list[Value] = []
            at = []
            for name in sorted(names):
                source, axis = self.dims_at[name]
                position = next((k for k, x in enumerate(inputs) if x is source), len(inputs))
                if position == len(inputs):
                    inputs.append(source)
                at.append([name, position, axis])
            return self.op("dim_values", *inputs, at=at, shape=list(v.const.shape),
                           dtype=v.dtype, values=[str(d) if isinstance(d, Sym) else d
                                                  for d in values])
        return self.op("dim_values", self.anchor, values=values, shape=list(v.const.shape),
                       dtype=v.dtype)

    def op(self, op: str, *inputs: Value, **attrs: Any) -> Value:
        """A one-output standard op."""
        outs = self.ops(op, inputs, **attrs)
        if len(outs) != 1:
            raise Unsupported(f"standard op {op!r} gave {len(outs)} outputs, expected 1")
        return outs[0]

    # -- shorthands ---------------------------------------------------------------------------

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        from .symdim import same
        shape = tuple(_dim(d) for d in shape)
        if len(shape) == len(x.shape) and all(same(a, b) for a, b in zip(shape, x.shape)):
            return x
        if x.const is not None:
            return self.const(x.const.reshape(shape), x.name)
        if self.sizes_may_be_zero or any(isinstance(d, int) and d == 0 for d in shape):
            return self.op("reshape", x, newshape=list(shape), allowzero=1)
        return self.op("reshape", x, newshape=list(shape))

    def copy(self, x: Value) -> Value:
        """A new entry equal to x (cast to its own dtype where copy lacks the dtype, e.g. bool)."""
        try:
            return self.op("copy", x)
        except Unsupported:
            kind = "convert_type" if x.dtype in EXTENDED_DTYPES else "cast"
            return self.op(kind, x, dtype=x.dtype)

    def cast(self, x: Value, dtype: str) -> Value:
        if x.dtype == dtype:
            return x
        from .symdim import has_sym
        if x.const is not None and not has_sym(x.const):
            return self.const(x.const.astype(dtype), x.name)
        if x.dtype in EXTENDED_DTYPES or dtype in EXTENDED_DTYPES:
            return self.op("convert_type", x, dtype=dtype)
        try:
            return self.op("cast", x, dtype=dtype)
        except Unsupported:
            # NOTE: cast covers what every backend can; convert_type (cpu) all NumPy types.
            return self.op("convert_type", x, dtype=dtype)

    def transpose(self, x: Value, axes: Sequence[int]) -> Value:
        axes = [int(a) for a in axes]
        if axes == list(range(x.rank)):
            return x
        if x.const is not None:
            return self.const(np.ascontiguousarray(x.const.transpose(axes)), x.name)
        return self.op("transpose", x, axes=axes)
