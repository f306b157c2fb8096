"""SymbolicChain: a lib.json chain whose attrs hold symbolic dims, made concrete per binding.

An attr value (or an item of a list attr) may be `{"dim": "seq*4"}` (extension,
docs/symbolic_shapes.md): an expression over the graph's symbolic dim names. The specialiser
passes the names' values in the node's attrs under DIMS_KEY; the chain is built for them once.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from .._lru import LruCache
from ..device import Device
from ..errors import LibraryError
from ..graph.symbolic import UNKNOWN, DimError, check_dim, evaluate, names_in
from .chain import Chain
from .library import TensorSpec

DIMS_KEY = "__dims"
CHAINS_KEPT = 64  # concrete chains kept per function, for the bindings met last
# Attrs that only say an op's output shape, which its CPU kernel reads from the output array
# at each call (an AnyShape kernel): a kernel taking any shape serves every value of the dims
# they read (Binding.values leaves them out).
SHAPE_TARGETS = frozenset({("reshape", "newshape"), ("broadcast_to", "shape")})


class Binding(NamedTuple):
    """What a symbolic chain's kernel depends on besides its arrays' shapes: the values of
    every dim its attrs read (a kernel made for its shapes), and of those read by attrs other
    than shape targets (a kernel taking any shape: PreparedKernel.any_shape)."""

    every: tuple[int, ...]
    values: tuple[int, ...]


def is_symbolic_attr(value: Any) -> bool:
    """Whether an attr value holds a `{"dim": ...}` anywhere."""
    if isinstance(value, Mapping):
        return set(value) == {"dim"}
    if isinstance(value, (list, tuple)):
        return any(is_symbolic_attr(v) for v in value)
    return False


def check_dim_attrs(entries: Sequence[Mapping[str, Any]], where: str, chained: bool) -> None:
    """LibraryError naming the JSON path of a `{"dim": ...}` that holds no int or readable
    expression ('?' too: no producer decides an attr); chained: entries are where's "ops"."""
    for k, entry in enumerate(entries):
        at = f"{where}.ops[{k}]" if chained else where
        for key, value in entry.items():
            for path, dim in _dim_values(value, f"{at}.{key}"):
                if isinstance(dim, int) and not isinstance(dim, bool):
                    continue
                if not isinstance(dim, str):
                    problem = f"expected an int or an expression such as \"seq*4\", got {dim!r}"
                elif dim == UNKNOWN:
                    problem = "'?' has no value here; name the dim (\"seq\") instead"
                else:
                    problem = check_dim(dim) or ""
                if problem:
                    raise LibraryError(f"{path}: {problem}")


def _dim_values(value: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping) and set(value) == {"dim"}:
        return [(f"{path}.dim", value["dim"])]
    if isinstance(value, (list, tuple)):
        return [found for i, v in enumerate(value) for found in _dim_values(v, f"{path}[{i}]")]
    return []


def _substitute(value: Any, env: Mapping[str, int]) -> Any:
    """value (made _plain) with each `{"dim": ...}` evaluated; type checks, not the slower
    isinstance(Mapping): a decoder's step substitutes every attr of a few chains."""
    kind = type(value)
    if kind is dict:
        return evaluate(value["dim"], env)
    if kind is list:
        return [_substitute(v, env) for v in value]
    return value


def _plain(value: Any) -> Any:
    """A symbolic attr value with dicts for its `{"dim": ...}` and lists for its sequences."""
    if isinstance(value, Mapping):
        return {"dim": value["dim"]}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _names(value: Any) -> list[str]:
    if isinstance(value, Mapping) and set(value) == {"dim"}:
        return names_in(value["dim"])
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _names(v)]
    return []


class SymbolicChain:
    """A chain with symbolic attrs; infer() and prepare() build the concrete Chain (cached)."""

    symbolic = True

    def __init__(self, name: str, entries: Sequence[Mapping[str, Any]],
                 make: Callable[[str, Mapping[str, Any]], Chain]) -> None:
        self.name = name
        self._entries = [dict(e) for e in entries]
        self.names = sorted({n for e in self._entries for v in e.values() for n in _names(v)})
        self.value_names = sorted({n for e in self._entries for k, v in e.items()
                                   if (e.get("op", name), k) not in SHAPE_TARGETS
                                   for n in _names(v)})
        # the chains of the bindings met last (a decoder meets a new past length every step)
        self._chains: LruCache[Chain] = LruCache(CHAINS_KEPT)
        # The ops (and so the devices) never depend on the binding: check them once.
        self.template = make(name, {"ops": [{k: (1 if is_symbolic_attr(v) and
                                                 not isinstance(v, list) else
                                                 [1] * len(v) if is_symbolic_attr(v) else v)
                                             for k, v in e.items()} for e in self._entries]})
        # per step: its symbolic attrs, put into the template's step per binding (the concrete
        # chain's attrs are checked when it is planned, as any chain's)
        self._symbolic = [{k: _plain(v) for k, v in e.items() if is_symbolic_attr(v)}
                          for e in self._entries]

    @property
    def steps(self) -> list[Any]:
        """The template's steps (ops as in the file; symbolic attrs shown as 1)."""
        return self.template.steps

    def backends(self) -> list[str]:
        return self.template.backends()

    def binding_key(self, env: Mapping[str, int]) -> Binding:
        """The values of the names its attrs read: equal keys make the same chain (a node
        prepared at one binding serves another that changes only other names), and of those
        that decide more than a shape."""
        return Binding(tuple(int(env.get(n, -1)) for n in self.names),
                       tuple(int(env.get(n, -1)) for n in self.value_names))

    def concrete(self, attrs: Mapping[str, Any]) -> Chain:
        """The chain for the binding in attrs[DIMS_KEY]."""
        env = attrs.get(DIMS_KEY)
        if not isinstance(env, Mapping):
            raise LibraryError(f"{self.name}: its attrs hold symbolic dims "
                               f"({', '.join(self.names)}) and the node gives no values for "
                               "them; a graph calling it must be specialised (create() does)")
        return self._chains.get_or_build(self.binding_key(env).every,
                                        lambda: self._build(env))

    def _build(self, env: Mapping[str, Any]) -> Chain:
        try:
            steps = [replace(step, attrs={**step.attrs, **{k: _substitute(v, env)
                                                           for k, v in symbolic.items()}})
                     for step, symbolic in zip(self.template.steps, self._symbolic)]
        except DimError as e:
            raise LibraryError(f"{self.name}: {e}") from e
        return Chain(self.name, steps)

    def infer(self, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any] | None = None,
              out_dtypes: Sequence[str] | None = None) -> list[TensorSpec]:
        attrs = dict(attrs or {})
        chain = self.concrete(attrs)
        attrs.pop(DIMS_KEY, None)
        return chain.infer(inputs, attrs, out_dtypes)

    def prepare(self, device: Device, inputs: Sequence[TensorSpec],
                outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
        attrs = dict(attrs)
        chain = self.concrete(attrs)
        attrs.pop(DIMS_KEY, None)
        return chain.prepare(device, inputs, outputs, attrs)
