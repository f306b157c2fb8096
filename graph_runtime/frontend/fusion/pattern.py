"""Pattern matching over the importer's prims: readers of each value and small matchers."""
from __future__ import annotations

from typing import Any

from ...lib.registry import OPS
from ..ir import Prim, Value


class PatternGraph:
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


def scalar(v: Value) -> float | None:
    """The value of a one-element float constant, else None."""
    if v.const is None or v.const.size != 1 or v.const.dtype.kind != "f":
        return None
    return float(v.const.reshape(-1)[0])


def near(v: Value, want: float, tol: float = 1e-4) -> bool:
    """Whether v is a one-element constant within tol (relative) of want."""
    got = scalar(v)
    return got is not None and abs(got - want) <= tol * max(1.0, abs(want))


def other(p: Prim, v: Value) -> Value | None:
    """The operand of binary p that is not v (None when p reads v twice or not at all)."""
    if len(p.inputs) != 2:
        return None
    if p.inputs[0] is v and p.inputs[1] is not v:
        return p.inputs[1]
    if p.inputs[1] is v and p.inputs[0] is not v:
        return p.inputs[0]
    return None


def new_prim(op: str, inputs: list[Value], attrs: dict[str, Any], out: Value | None,
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
