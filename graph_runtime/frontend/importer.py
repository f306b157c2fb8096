"""The ONNX import entry points: import_onnx (the CLI's richer result) and from_onnx."""
from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._text import fmt_bytes
from ..errors import FrontendError
from ..lib.library import Module


@dataclass
class ImportResult:
    """Everything an import produced, and what it did, for `graphrun import` to print."""

    graph_json: str
    lib_doc: dict[str, Any]
    params: dict[str, np.ndarray]
    model_name: str
    opset: int
    num_onnx_nodes: int
    func_names: list[str]
    func_origins: list[list[str]]
    folded: Counter = field(default_factory=Counter)
    removed: Counter = field(default_factory=Counter)
    bn_folded: int = 0
    expanded: int = 0
    patterns: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    # How symbolic dims were imported: "propagation" (one import computing on expressions),
    # "probes" (the fallback: imports at probe sizes, fitted), "deferred" (one onnx_region
    # imported per input specs and shape-deciding values) or "" (no symbolic dims).
    symbolic_path: str = ""
    # Why propagation fell back to probes (the refusal that stopped it), or "".
    propagation_refusal: str = ""

    @property
    def params_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.params.values())

    def module(self) -> Module:
        """The kernel library, built from lib_doc exactly as lib.json would be loaded."""
        from ..lib.loader import module_from_json
        return module_from_json(self.lib_doc, "lib.json")

    def summary(self) -> str:
        """What the import did, for people: nodes -> functions, folding, params bytes."""
        kinds = Counter(self.func_names)
        lines = [(f"imported {self.model_name} (ONNX opset {self.opset}) in "
                  f"{self.seconds:.2f} s: {self.num_onnx_nodes} ONNX nodes -> "
                  f"{len(self.func_names)} graph nodes calling "
                  f"{len(self.lib_doc['functions'])} fused functions"),
                 (f"  inputs: {', '.join(self.input_names) or '-'}; outputs: "
                  f"{', '.join(self.output_names)}"),
                 f"  params: {len(self.params)} arrays, {fmt_bytes(self.params_bytes)}"]
        if self.symbolic_path == "propagation":
            lines.append("  symbolic dims: imported once, shapes propagated as expressions")
        elif self.symbolic_path == "probes":
            lines.append("  symbolic dims: imported at probe sizes and fitted (propagation "
                         f"refused: {self.propagation_refusal})")
        elif self.symbolic_path == "deferred":
            lines.append("  symbolic dims: the model is imported per input shape and "
                         "shape-deciding value when it runs (graph inputs decide shapes)")
        if self.folded:
            folded = ", ".join(f"{op} x{n}" for op, n in self.folded.most_common())
            lines.append(f"  folded at import: {sum(self.folded.values())} nodes ({folded})")
        if self.removed:
            removed = ", ".join(f"{op} x{n}" for op, n in self.removed.most_common())
            lines.append(f"  removed: {removed}")
        if self.expanded:
            lines.append(f"  inlined from their ONNX function bodies: {self.expanded} nodes")
        if self.patterns:
            fused = ", ".join(f"{op} x{n}" for op, n in sorted(self.patterns.items()))
            lines.append(f"  patterns fused (transformer, quantized): {fused}")
        if self.bn_folded:
            lines.append(f"  BatchNormalization folded into conv weights: {self.bn_folded}")
        lines.append("  functions (x calls; chain of standard ops <- ONNX nodes):")
        origins: dict[str, list[str]] = {}
        for name, nodes in zip(self.func_names, self.func_origins):
            origins.setdefault(name, []).extend(nodes)
        for name in sorted(kinds):
            ops = self.lib_doc["functions"][name]
            chain = " -> ".join(s["op"] for s in ops.get("ops", [ops]))
            nodes = origins.get(name, [])
            shown = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4
                                             else "")
            lines.append(f"    {name}  x{kinds[name]}  ({chain})" +
                         (f"  <- {shown}" if shown else ""))
        return "\n".join(lines)


def import_onnx(model: Any, shape: Mapping[str, Sequence[int]] | None = None,
                name: str | None = None,
                base_dir: str | os.PathLike[str] | None = None,
                freeze: bool = False, disable: Iterable[str] = ()) -> ImportResult:
    """Import an ONNX model (a ModelProto or a path): graph JSON, lib.json document, params.

    name is how messages call the model (default: the file name, or the graph's name).
    base_dir is the only folder external data is read from (default: the model file's folder;
    a ModelProto with external data and no base_dir is refused).

    Inputs with named or unknown dims and no shape given keep them: the graph carries symbolic
    dims and create() specialises it per input shape. They are propagated through one import
    (frontend/symdim.py); where that refuses, the model is imported at probe sizes and fitted
    (frontend/symbolic_import.py); ImportResult.symbolic_path says which. freeze=True refuses
    such inputs instead, asking for shapes (the behaviour before symbolic dims).

    disable names rewrite passes to skip (frontend/passes.py; an unknown name is refused).

    Raises FrontendError listing every unsupported op, attribute value or dtype (with node
    names and the opset) before anything is produced.
    """
    from .emit import emit
    from .inference import check_references
    from .lower import NeedsRunTimeValues, lower
    from .passes import check_disabled, fuse_lowered
    from .onnx_model import load_model
    from .convert_data_dependent import data_only_topk, data_symbols
    from .symbolic_import import import_with_probes, symbols_of
    from .ir import Unsupported
    start = time.perf_counter()
    disabled = check_disabled(disable)
    proto, default_name = load_model(model, base_dir)
    name = name or default_name
    check_references(proto, name)  # before the probes read the inputs' declared shapes
    given = dict(shape or {})
    symbols = [] if freeze else symbols_of(proto, given)
    # Sizes only the data decides (NonZero's...): symbols the probes name like input dims.
    data = data_symbols(proto, [s.name for s in symbols])
    fused: list[Any] = []

    def once(shapes: Mapping[str, Sequence[int]], unfold: frozenset[str] = frozenset(),
             sizes: Mapping[str, int] | None = None,
             symbolic: Mapping[str, Mapping[int, str]] | None = None
             ) -> tuple[Any, dict[str, Any]]:
        data_sizes = {out: sizes[sym.name] for out, sym in data.items()} if sizes else None
        lowered = lower(proto, name, shapes, unfold, data_sizes, disabled, symbolic)
        fused[:] = [fuse_lowered(lowered, disabled) + lowered.qdq_fused]
        emitted = emit(lowered, f"imported from {name} (ONNX opset {lowered.opset})")
        return (lowered, emitted), {"graph": emitted.graph_doc, "lib": emitted.lib_doc,
                                    "params": emitted.params, "consts": lowered.consts,
                                    "computed": lowered.computed}

    path, refusal = "", ""
    if symbols and not data:
        path = "propagation"
        try:
            (lowered, emitted), _ = once(given, symbolic=_places(symbols))
        except (FrontendError, Unsupported, ArithmeticError, LookupError, TypeError,
                ValueError) as e:
            # Propagation could not express something (an undecidable comparison of dims, an
            # op whose shape rule needs numbers): today's probe import, recorded as such.
            path = "probes"
            refusal = str(e) if isinstance(e, (FrontendError, Unsupported)) else \
                f"internal error: {type(e).__name__}: {e}"
    if (symbols or data) and path != "propagation":
        path = "probes"
        try:
            (lowered, emitted), docs = import_with_probes(
                once, proto, given, [*symbols, *data.values()], name)
        except NeedsRunTimeValues:
            # A Reshape's shape from an input besides a TopK's k: the model is deferred as
            # before (the region imports it with both values frozen). Sizes that only the data
            # decides cannot be deferred that way: the refusal stands.
            if freeze or (data and (symbols or not data_only_topk(proto, data))):
                raise
            return _deferred(proto, given, name, start, _places(symbols))
        except FrontendError as e:
            if not refusal:
                raise
            # Both ways refused: say why propagation did too (it names the node and the dims).
            raise type(e)(f"{e}; importing by propagation was refused first: {refusal}") from e
        emitted.graph_doc, emitted.lib_doc, emitted.params = (docs["graph"], docs["lib"],
                                                              docs["params"])
    elif not symbols:
        try:
            (lowered, emitted), _ = once(given)
        except NeedsRunTimeValues:
            if freeze:
                raise
            return _deferred(proto, given, name, start)
    patterns = fused[0]
    origins = [list(dict.fromkeys(p.origin for p in g.prims if p.origin)) for g in emitted.groups]
    return ImportResult(
        graph_json=json.dumps(emitted.graph_doc),
        lib_doc=emitted.lib_doc, params=emitted.params, model_name=name, opset=lowered.opset,
        num_onnx_nodes=lowered.num_nodes, func_names=emitted.func_names, func_origins=origins,
        folded=lowered.folded, removed=lowered.removed, bn_folded=lowered.bn_folded,
        expanded=lowered.expanded, patterns=patterns,
        seconds=time.perf_counter() - start,
        input_names=[v.name for v in lowered.inputs], output_names=lowered.output_names,
        symbolic_path=path, propagation_refusal=refusal)


def _places(symbols: Sequence[Any]) -> dict[str, dict[int, str]]:
    """{input name: {axis: dim name}} of symbolic_import's Symbols."""
    places: dict[str, dict[int, str]] = {}
    for sym in symbols:
        for name, axis in sym.places:
            places.setdefault(name, {})[axis] = sym.name
    return places


def _deferred(proto: Any, given: Mapping[str, Sequence[int]], name: str, start: float,
              symbolic: Mapping[str, Mapping[int, str]] | None = None) -> ImportResult:
    """The model as one onnx_region node (frontend/deferred.py): its shape-deciding inputs are
    read while specialising. The refusal stands where even that cannot express the model.

    symbolic ({input: {axis: dim name}}) keeps those dims named in the graph: the region is
    imported per input specs and values anyway, so a Reshape's target from a graph input
    serves inputs of any size."""
    from .deferred import deferred_documents, dtype_trial, value_inputs
    from .inference import check_shapes, inferred_types
    from .ir import Unsupported
    from .lower import lower
    from .onnx_model import default_opset, tensor_shape
    from .symbolic_import import PROBES
    shapes = dict(check_shapes(proto, given))
    named: dict[str, list[Any]] = {}
    deciding = value_inputs(proto)
    inits = {t.name for t in proto.graph.initializer}
    try:
        for inp in proto.graph.input:
            if inp.name in inits or inp.name in shapes:
                continue
            axes = (symbolic or {}).get(inp.name)
            if axes and inp.name in deciding:
                raise Unsupported(f"input {inp.name!r} decides shapes and its length is "
                                  "symbolic: the outputs' ranks would not be known")
            if axes:
                dims = inp.type.tensor_type.shape.dim
                named[inp.name] = [axes.get(a, d.dim_value) for a, d in enumerate(dims)]
                # Types and the dtype trial need sizes, any will do: a probe's.
                shapes[inp.name] = tuple(PROBES[0][0] if a in axes else d.dim_value
                                         for a, d in enumerate(dims))
            else:
                shapes[inp.name] = tuple(tensor_shape(inp.type, inp.name, shapes))
        dtype_trial(proto, shapes, name)
        docs = deferred_documents(proto, {**shapes, **named}, inferred_types(proto, shapes, name),
                                  f"imported from {name}: run-time shape inputs "
                                  f"{', '.join(deciding)}, imported per value")
    except Unsupported:
        lower(proto, name, given)  # raises the import's own refusal
        raise
    inputs = [i.name for i in proto.graph.input if i.name not in inits]
    return ImportResult(
        graph_json=json.dumps(docs["graph"]), lib_doc=docs["lib"], params={}, model_name=name,
        opset=default_opset(proto), num_onnx_nodes=len(proto.graph.node),
        func_names=["onnx_region"], func_origins=[[n.name or n.op_type for n in proto.graph.node]],
        seconds=time.perf_counter() - start, input_names=inputs,
        output_names=[o.name for o in proto.graph.output],
        symbolic_path="deferred" if named else "")


def from_onnx(model: Any, shape: Mapping[str, Sequence[int]] | None = None,
              base_dir: str | os.PathLike[str] | None = None, freeze: bool = False,
              disable: Iterable[str] = ()) -> tuple[str, Module, dict[str, np.ndarray]]:
    """(graph_json, lib Module, params) for `graph_runtime.create(graph_json, lib, ctxs)`.

    Inputs with named or unknown dims and no shape given keep them; disable names rewrite
    passes to skip (see import_onnx).
    """
    result = import_onnx(model, shape, base_dir=base_dir, freeze=freeze, disable=disable)
    return result.graph_json, result.module(), result.params
