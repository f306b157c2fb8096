"""Pattern matching: the producer and readers of each value over a graph's nodes (the importer's
prims, or ONNX nodes before lowering), and small matchers over prims."""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from ...lib.registry import OPS
from .. import sym_infer
from ..ir import Prim, Unsupported, Value
from ..symdim import has_sym, is_sym

N = TypeVar("N")
K = TypeVar("K", bound=Hashable)


class Uses(Generic[N, K]):
    """The producer and the readers (one entry per read) of each value, keyed as the nodes name
    their inputs and outputs, and the values the graph gives out (pinned: read from outside)."""

    def __init__(self, nodes: Iterable[N], inputs: Callable[[N], Iterable[K]],
                 outputs: Callable[[N], Iterable[K]], pinned: Iterable[K]) -> None:
        self.producer: dict[K, N] = {}
        self.readers: dict[K, list[N]] = {}
        for n in nodes:
            for k in inputs(n):
                self.readers.setdefault(k, []).append(n)
            for k in outputs(n):
                self.producer[k] = n
        self.pinned = set(pinned)

    def only_reader(self, key: K) -> N | None:
        """The one node reading key, once, when key is no graph output; else None."""
        readers = self.readers.get(key, [])
        if len(readers) != 1 or key in self.pinned:
            return None
        return readers[0]

    def used(self, key: K) -> bool:
        """Whether a node or the graph's outputs read key."""
        return key in self.readers or key in self.pinned


class NodeUses(Uses[Any, str]):
    """Uses over ONNX NodeProtos, keyed by value name."""

    def __init__(self, nodes: Iterable[Any], outputs: Iterable[str]) -> None:
        super().__init__(nodes, lambda n: n.input, lambda n: n.output, outputs)


class PatternGraph(Uses[Prim, int]):
    """Uses over the prims being rewritten, keyed by the id of each Value."""

    def __init__(self, prims: list[Prim], outputs: list[Value]) -> None:
        super().__init__(prims, lambda p: map(id, p.inputs), lambda p: map(id, p.outputs),
                         map(id, outputs))

    def sole(self, v: Value) -> Prim | None:
        """The one prim reading v once, when v is no graph output."""
        return self.only_reader(id(v))


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
    if has_sym([list(v.shape) for v in inputs] + list(attrs.values())):
        try:
            specs = sym_infer.infer(op, [v.spec for v in inputs], attrs)
        except Unsupported as e:  # a shape of symbolic dims the rules cannot tell: no match
            raise ValueError(str(e)) from e
    else:
        specs = OPS[op].infer([v.spec for v in inputs], attrs)
    if len(specs) != 1:
        raise ValueError(f"{op} gives {len(specs)} outputs")
    spec = specs[0]
    if out is None:
        out = Value(f"{op}#fused{id(inputs[0]) % 100000}",
                    tuple(d if is_sym(d) else int(d) for d in spec.shape), str(spec.dtype))
    elif (tuple(spec.shape), spec.dtype) != (tuple(out.shape), out.dtype):
        raise ValueError(f"{op} gives {spec}, the pattern gave {out.spec}")
    prim = Prim(op, attrs, inputs, [out], origin)
    out.producer = prim
    return prim


def last_axis_slice(v: Value) -> tuple[Value, int, int] | None:
    """(input, begin, end) when v is a unit-step strided_slice of its input's last axis (end
    clipped to the axis), else None."""
    p = v.producer
    if p is None or p.op != "strided_slice":
        return None
    x = p.inputs[0]
    axes, begin, end = p.attrs.get("axes"), p.attrs.get("begin"), p.attrs.get("end")
    strides = p.attrs.get("strides") or [1]
    if axes is None or begin is None or end is None or len(axes) != 1 \
            or axes[0] not in (-1, x.rank - 1) or list(strides) != [1]:
        return None
    size = x.shape[-1]
    if is_sym(size) or not all(isinstance(b, int) for b in (begin[0], end[0])):
        return None
    lo, hi = begin[0], min(end[0], size)
    if lo < 0 or hi <= lo:
        return None
    return x, lo, hi


def spliced(prims: list[Prim], by_id: dict[int, list[Prim]]) -> list[Prim]:
    """prims with each prim whose id is in by_id replaced by its list (its fused prims)."""
    result: list[Prim] = []
    for p in prims:
        result.extend(by_id.get(id(p), [p]))
    return result
