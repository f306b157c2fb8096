"""Import with symbolic dims, the fallback: lower at probe sizes, name every number that follows.

(The import first propagates the dims as expressions, frontend/symdim.py; this runs where that
refuses, and for data-dependent sizes.)

A model whose inputs have named or unknown dims (and no `--shape` for them) is lowered once at
distinct prime probe sizes and once more per dim with that dim changed. The imports must agree
in everything but numbers; each number that changes is written as the expression of the dims
that explains every probe (`batch`, `seq*4`, `batch*seq`, `seq+1`, `seq*seq`): shapes in the
graph's `shape` column, attrs in lib.json as `{"dim": ...}`. A difference no such expression
explains (a float, a graph whose structure changes) refuses the import, naming where, with the
fix (`--shape`). A constant folded at import that changes with the dims and is read as data
(a slice of position ids, a causal mask) is not folded: its nodes are lowered to ops computing
it for each shape (unfold_names, frontend/convert_dims.py) and the probes run again.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FrontendError

# (base, other) probe size per symbol: primes no tiny model is likely to hold as a constant.
PROBES = [(37, 53), (41, 59), (43, 67), (47, 71), (31, 73), (29, 79), (61, 83), (23, 89)]
_IDENT = re.compile(r"[^A-Za-z0-9_]")
# Sizes a data-dependent symbol is checked at after fitting (frontend/convert_data_dependent.py).
CHECK_SIZES = (2, 1009)
# Rounds of probe imports that may each unfold more nodes before the import gives up.
UNFOLD_ROUNDS = 4


@dataclass(frozen=True)
class Symbol:
    """One symbolic dim: its name and the (input, axis) places it appears."""

    name: str
    places: tuple[tuple[str, int], ...]


def symbols_of(model: Any, given: Mapping[str, Sequence[int]]) -> list[Symbol]:
    """The named or unknown dims of the graph inputs that have no shape given."""
    inits = {t.name for t in model.graph.initializer}
    places: dict[str, list[tuple[str, int]]] = {}
    for inp in model.graph.input:
        if inp.name in given or inp.name in inits or not inp.type.HasField("tensor_type"):
            continue
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            continue
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                continue
            name = _IDENT.sub("_", d.dim_param) if d.dim_param else f"{inp.name}_dim{axis}"
            if not name or name[0].isdigit():
                name = f"d_{name}"
            places.setdefault(name, []).append((inp.name, axis))
    return [Symbol(name, tuple(p)) for name, p in places.items()]


def probe_shapes(model: Any, given: Mapping[str, Sequence[int]], symbols: Sequence[Symbol],
                 sizes: Mapping[str, int]) -> dict[str, list[int]]:
    """Every input's shape with each symbol at its probe size (given shapes kept)."""
    shapes = {name: list(dims) for name, dims in given.items()}
    for inp in model.graph.input:
        for sym in symbols:
            for name, axis in sym.places:
                if name != inp.name:
                    continue
                if name not in shapes:
                    dims = inp.type.tensor_type.shape.dim
                    shapes[name] = [d.dim_value if d.HasField("dim_value") else 0 for d in dims]
                shapes[name][axis] = sizes[sym.name]
    return shapes


def fit_imports(docs: Sequence[Any], symbols: Sequence[Symbol], model_name: str) -> Any:
    """The first import's document with each changing number replaced by its expression.

    docs[0] is the import at the base probes, docs[1 + i] the one with symbol i changed.
    """
    names = [s.name for s in symbols]
    base = [PROBES[i][0] for i in range(len(symbols))]
    other = [PROBES[i][1] for i in range(len(symbols))]

    def fail(path: str, what: str) -> FrontendError:
        return FrontendError(
            f"cannot import {model_name} with symbolic dims ({', '.join(names)}): {what} at "
            f"{path}; give concrete shapes with --shape (or shape=) for this model")

    def number(a: int, bs: list[int], path: str, as_dim: bool) -> Any:
        expr = _expression(a, bs, names, base, other)
        if expr is None:
            raise fail(path, f"the value {a} changes with the dims ({bs}) in a way no "
                             "product or sum of them explains")
        return expr if as_dim else {"dim": expr}

    def walk(a: Any, bs: list[Any], path: str, as_dim: bool) -> Any:
        if isinstance(a, dict):
            if any(not isinstance(b, dict) or set(b) != set(a) for b in bs):
                raise fail(path, "the import's structure changes with the dims")
            return {k: walk(v, [b[k] for b in bs], f"{path}.{k}", as_dim) for k, v in a.items()}
        if isinstance(a, list):
            if any(not isinstance(b, list) or len(b) != len(a) for b in bs):
                raise fail(path, "a list's length changes with the dims")
            return [walk(v, [b[i] for b in bs], f"{path}[{i}]", as_dim) for i, v in enumerate(a)]
        if isinstance(a, np.ndarray):
            if any(not isinstance(b, np.ndarray) or b.shape != a.shape or b.dtype != a.dtype
                   or not np.array_equal(a, b, equal_nan=a.dtype.kind == "f") for b in bs):
                raise fail(path, "a constant made at import depends on the dims")
            return a
        if all(type(b) is type(a) and b == a for b in bs):
            return a
        if isinstance(a, int) and not isinstance(a, bool) and all(
                isinstance(b, int) and not isinstance(b, bool) for b in bs):
            return number(a, bs, path, as_dim)
        raise fail(path, f"{a!r} changes with the dims ({bs!r})")

    first, rest = docs[0], list(docs[1:])
    graph = dict(first["graph"])
    attrs = dict(graph["attrs"])
    others = [d["graph"] for d in rest]
    # Storage ids are planned again for each specialisation: take the first import's.
    graph["attrs"] = {k: (v if k == "storage_id" else
                          walk(v, [o["attrs"][k] for o in others], f"$.attrs.{k}", k == "shape"))
                      for k, v in attrs.items()}
    graph = {k: (v if k == "attrs" else walk(v, [o[k] for o in others], f"$.{k}", False))
             for k, v in graph.items()}
    lib = walk(first["lib"], [d["lib"] for d in rest], "lib.json", False)
    params = walk(first["params"], [d["params"] for d in rest], "params", False)
    return {"graph": graph, "lib": lib, "params": params}


def fit_disagrees(fitted: Mapping[str, Any], doc: Mapping[str, Any],
                  env: Mapping[str, int]) -> str | None:
    """Where the fitted graph and lib, evaluated at env, differ from an import at env (the
    JSON path), or None. Storage ids and params are not compared."""
    from ..graph.symbolic import evaluate

    def walk(a: Any, b: Any, path: str, as_dim: bool) -> str | None:
        if isinstance(a, dict) and set(a) == {"dim"} and not isinstance(b, dict):
            return None if evaluate(a["dim"], env) == b else path
        if isinstance(a, str) and as_dim and not isinstance(b, str):
            return None if evaluate(a, env) == b else path
        if isinstance(a, dict):
            if not isinstance(b, dict) or set(a) != set(b):
                return path
            pairs = [(a[k], b[k], f"{path}.{k}") for k in a]
        elif isinstance(a, (list, tuple)):
            if not isinstance(b, (list, tuple)) or len(a) != len(b):
                return path
            pairs = [(x, y, f"{path}[{k}]") for k, (x, y) in enumerate(zip(a, b))]
        else:
            return None if isinstance(a, np.ndarray) or a == b else path
        for x, y, inner in pairs:
            where = walk(x, y, inner, as_dim)
            if where:
                return where
        return None

    graph, other = fitted["graph"], doc["graph"]
    for key in graph:
        if key == "attrs":
            for name, column in graph["attrs"].items():
                if name == "storage_id":
                    continue
                where = walk(column, other["attrs"].get(name), f"$.attrs.{name}",
                             name == "shape")
                if where:
                    return where
        else:
            where = walk(graph[key], other.get(key), f"$.{key}", False)
            if where:
                return where
    return walk(fitted["lib"], doc["lib"], "lib.json", False)


def _expression(a: int, bs: Sequence[int], names: Sequence[str], base: Sequence[int],
                other: Sequence[int]) -> str | None:
    """c * prod(name**e) or c + sum(k * name) matching every probe; None when neither does."""
    moved = [i for i, b in enumerate(bs) if b != a]
    # A product: each changed symbol's exponent e has b * base**e == a * other**e.
    powers: dict[int, int] = {}
    for i in moved:
        for e in (1, 2, 3):
            if bs[i] * base[i] ** e == a * other[i] ** e:
                powers[i] = e
                break
    if len(powers) == len(moved):
        denominator = 1
        for i, e in powers.items():
            denominator *= base[i] ** e
        if denominator and a % denominator == 0 and a != 0:
            c = a // denominator
            factors = [n for i in sorted(powers) for n in [names[i]] * powers[i]]
            return "*".join(([str(c)] if c != 1 else []) + factors)
    # A sum: k_i = (b_i - a) / (other_i - base_i), the rest a constant.
    terms = []
    constant = a
    for i in moved:
        step = other[i] - base[i]
        if (bs[i] - a) % step:
            return None
        k = (bs[i] - a) // step
        constant -= k * base[i]
        terms.append(names[i] if k == 1 else f"{k}*{names[i]}")
    if not terms:
        return None
    text = "+".join(terms)
    if constant:
        text += f"+{constant}" if constant > 0 else f"-{-constant}"
    return text


def shape_slots() -> dict[str, tuple[int, ...]]:
    """Each op's input slots whose value a converter reads at import to decide shapes or attrs
    (OpFacts.shape_inputs, registered with its converter): a folded constant changing with the
    dims there becomes a `{"dim": ...}` attr, so it stays folded."""
    from .convert import FACTS
    return {op: f.shape_inputs for op, f in FACTS.items() if f.shape_inputs}


def unfold_names(model: Any, docs: Sequence[Mapping[str, Any]],
                 slots_by_op: Mapping[str, tuple[int, ...]] | None = None) -> set[str]:
    """ONNX value names to compute by ops: folded constants that change with the dims and are
    read as data by a node computed at run time, and, back along their data inputs, the folded
    ones they are made from (a value read only in a slots_by_op slot, shape_slots() when None,
    stays folded).

    Each doc holds "consts" ({name: array} of every value known at import) and "computed" (the
    names computed at run time) of one probe import; docs[0] is the base probe's.
    """
    consts = [d["consts"] for d in docs]
    changing = {name for name, a in consts[0].items()
                if any(name not in c or c[name].shape != a.shape or c[name].dtype != a.dtype
                       or not np.array_equal(c[name], a) for c in consts[1:])}
    if not changing:
        return set()
    producer = {out: node for node in model.graph.node for out in node.output if out}
    unfold: set[str] = set()
    if slots_by_op is None:
        slots_by_op = shape_slots()

    def data_inputs(node: Any) -> list[str]:
        slots = slots_by_op.get(node.op_type, ())
        if node.op_type == "Shape":
            slots = ()  # its input's shape, not its value: unfold only a changing input
        return [name for slot, name in enumerate(node.input)
                if name in changing and slot not in slots]

    def visit(name: str) -> None:
        node = producer.get(name)
        if node is None or node.op_type == "Constant" or name in unfold:
            return
        unfold.update(out for out in node.output if out)
        for inp in data_inputs(node):
            visit(inp)

    computed = docs[0]["computed"]
    for node in model.graph.node:
        if any(out in computed for out in node.output):
            for inp in data_inputs(node):
                visit(inp)
    return unfold


def import_with_probes(run: Callable[[dict[str, list[int]], frozenset[str], dict[str, int]], Any],
                       model: Any,
                       given: Mapping[str, Sequence[int]], symbols: Sequence[Symbol],
                       model_name: str) -> tuple[Any, dict[str, Any]]:
    """(first import, fitted documents): run(shapes, unfold, sizes) imports at one set of probe
    shapes (computing the ONNX values named in unfold by ops; sizes holds every symbol's probe
    size, for the symbols no input carries: data-dependent sizes) and returns (result, {"graph": doc,
    "lib": doc, "params": {name: array}, "consts": {...}, "computed": {...}})."""
    if len(symbols) > len(PROBES):
        raise FrontendError(f"cannot import {model_name}: {len(symbols)} symbolic dims "
                            f"({', '.join(s.name for s in symbols)}); at most {len(PROBES)} are "
                            "supported; give some with --shape")
    base = {s.name: PROBES[i][0] for i, s in enumerate(symbols)}
    unfold: frozenset[str] = frozenset()
    slots = shape_slots()
    if any(not s.places for s in symbols):
        # With sizes the data decides, a TopK's k that follows them (Min(n, 100)) is computed
        # at run time and read by the cut, not folded into an expression the probes fit.
        slots = {op: s for op, s in slots.items() if op != "TopK"}
    for _ in range(UNFOLD_ROUNDS):
        first, first_docs = run(probe_shapes(model, given, symbols, base), unfold, base)
        docs = [first_docs]
        for i, sym in enumerate(symbols):
            sizes = dict(base)
            sizes[sym.name] = PROBES[i][1]
            docs.append(run(probe_shapes(model, given, symbols, sizes), unfold, sizes)[1])
        more = unfold_names(model, docs, slots) - unfold
        if not more:
            break
        unfold = unfold | more
    fitted = fit_imports(docs, symbols, model_name)
    for i, sym in enumerate(symbols):
        if sym.places:
            continue
        # A size the data decides may be small or large where the probes were neither: a
        # Min(n, 100) fits "n" at both probes. Import once more at each end and refuse where
        # the fitted expressions disagree with it.
        for size in CHECK_SIZES:
            sizes = dict(base)
            sizes[sym.name] = size
            doc = run(probe_shapes(model, given, symbols, sizes), unfold, sizes)[1]
            where = fit_disagrees(fitted, doc, sizes)
            if where:
                raise FrontendError(
                    f"cannot import {model_name}: the data-dependent size {sym.name} decides "
                    f"{where} in a way the probe imports do not explain (checked at "
                    f"{sym.name} = {size})")
    # The inputs' own dims carry the symbol names (a dim equal to a probe is that symbol).
    shapes = fitted["graph"]["attrs"]["shape"][1]
    eid_of = {}
    for nid in fitted["graph"]["arg_nodes"]:
        eid_of[fitted["graph"]["nodes"][nid]["name"]] = fitted["graph"]["node_row_ptr"][nid]
    for sym in symbols:
        for name, axis in sym.places:
            if name in eid_of:
                shapes[eid_of[name]][axis] = sym.name
    return first, fitted
