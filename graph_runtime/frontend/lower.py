"""Lowering: walk an ONNX graph once, folding constants and turning each node into standard ops."""
from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import FrontendError
from .convert import CONVERTERS, Context
from .fusion.fuse_qdq import FUSED_DOMAIN
from .passes import OnnxState, run_onnx_passes
from .fold import fold
from .inference import check_references, check_shapes, inferred_types, static_specs
from .ir import RUNTIME_DTYPES, Builder, NeedsValue, TooLarge, Unsupported, Value
from .onnx_model import default_opset, np_dtype, tensor_shape
from .onnx_node import OnnxNode, decode_node
from .symdim import decided_unequal, has_sym
from .tensor_data import sparse_to_dense, to_array


@dataclass
class Lowered:
    """The lowered graph: inputs, the prims, outputs in ONNX order, and what the passes did."""

    inputs: list[Value]
    outputs: list[Value]
    output_names: list[str]
    builder: Builder
    opset: int
    num_nodes: int
    folded: Counter = field(default_factory=Counter)
    removed: Counter = field(default_factory=Counter)
    bn_folded: int = 0
    qdq_fused: Counter = field(default_factory=Counter)  # QDQ patterns fused (fuse_qdq.py)
    expanded: int = 0
    # For symbolic import (frontend/symbolic_import.py): every ONNX value known at import (by
    # name) and the names computed at run time, compared across the probe imports.
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    computed: set[str] = field(default_factory=set)


class NeedsRunTimeValues(FrontendError):
    """Every refusal was an input deciding shapes that is computed at run time (the importer
    may then defer the model to specialisation: frontend/deferred.py)."""


def _refusal(model_name: str, opset: int, problems: dict[str, list[str]],
             value_keys: set[str] | frozenset[str] = frozenset()) -> FrontendError:
    parts = []
    for reason, nodes in problems.items():
        shown = ", ".join(repr(n) for n in nodes[:8])
        more = f" and {len(nodes) - 8} more" if len(nodes) > 8 else ""
        parts.append(f"{reason} (node{'s' if len(nodes) > 1 else ''} {shown}{more})")
    kind = NeedsRunTimeValues if value_keys and set(problems) <= value_keys else FrontendError
    return kind(f"cannot import {model_name} (ONNX opset {opset}): "
                f"{len(problems)} unsupported: " + "; ".join(parts))


def lower(model: Any, model_name: str, shapes: Mapping[str, Sequence[int]],
          unfold: frozenset[str] = frozenset(),
          data_sizes: Mapping[str, int] | None = None,
          disabled: Collection[str] = frozenset(),
          symbolic: Mapping[str, Mapping[int, str]] | None = None) -> Lowered:
    """Lower every node; one FrontendError listing every unsupported op/attr/dtype otherwise.

    unfold: ONNX value names whose nodes are computed by ops instead of folded at import (their
    values follow symbolic dims: frontend/convert_dims.py).
    data_sizes: the probe size of each data-dependent output (NonZero's...) by ONNX value name;
    the shapes ONNX states for them and for what follows them are not checked (they hold for
    one input only).
    disabled: names of import passes to skip (frontend/passes.py).
    symbolic: {input name: {axis: dim name}} for inputs whose named or unknown dims stay
    symbolic (frontend/symdim.py): shapes, shape-valued tensors and attrs are expressions of them.
    """
    shapes = check_shapes(model, shapes)
    check_references(model, model_name)
    if symbolic:
        from .symdim import reset
        reset()
    num_nodes = len(model.graph.node)

    def reinfer(changed: Any) -> dict[str, Any]:
        check_references(changed, model_name)
        return inferred_types(changed, shapes, model_name)
    # NOTE: types are inferred before the QDQ and integer passes: the ops they make are not ONNX's
    state = OnnxState(model, inferred_types(model, shapes, model_name), reinfer)
    qdq_fused = run_onnx_passes(state, disabled)
    model, types = state.model, state.types
    expanded = qdq_fused.pop("expanded", 0)
    graph = model.graph
    opset = default_opset(model)
    opsets = {("" if e.domain == "ai.onnx" else e.domain): int(e.version)
              for e in model.opset_import}
    problems: dict[str, list[str]] = {}
    env: dict[str, Value | None] = {}
    uses: Counter = Counter()
    _count_uses(graph.node, uses)
    uses.update(o.name for o in graph.output)
    b = Builder()
    expected = static_specs(types)
    if data_sizes:
        from .convert_data_dependent import downstream
        for name in downstream(model, data_sizes):
            expected.pop(name, None)
    ctx = Context(b, uses, opsets)
    ctx.data_sizes = dict(data_sizes or {})
    b.sizes_may_be_zero = bool(data_sizes)
    ctx.expected = dict(expected)
    ctx.unfold = unfold
    ctx.scope = env  # type: ignore[assignment]
    ctx.model = model
    lowered = Lowered([], [], [o.name for o in graph.output], b, opset, num_nodes)
    walk = _Walk(ctx, env, problems, expected, model, lowered, opsets)
    walk.constants(graph, "graph")
    inputs: list[Value] = []
    unknown = set(shapes) - {i.name for i in graph.input}
    if unknown:
        raise FrontendError(f"shape given for {', '.join(sorted(unknown))}, which the model "
                            "does not have as inputs; its inputs are: "
                            + ", ".join(i.name for i in graph.input if i.name not in env))
    for inp in graph.input:
        if inp.name in env:
            continue
        try:
            kind = inp.type.WhichOneof("value")
            if kind not in (None, "tensor_type"):
                raise Unsupported(f"{kind.replace('_type', '')} type; sequences, optionals and "
                                  "maps are not supported, only tensors")
            dtype = np_dtype(inp.type.tensor_type.elem_type)
            if symbolic and inp.name in symbolic:
                shape = _symbolic_shape(inp, symbolic[inp.name])
            else:
                shape = tensor_shape(inp.type, inp.name, shapes)
        except Unsupported as e:
            problems.setdefault(f"graph input: {e}", []).append(inp.name)
            env[inp.name] = None
            continue
        graph_input = Value(inp.name, shape, dtype, is_input=True)
        env[inp.name] = graph_input
        inputs.append(graph_input)
        if b.anchor is None and inp.name in (symbolic or {}):
            b.anchor = graph_input
        for axis, name in (symbolic or {}).get(inp.name, {}).items():
            b.dims_at.setdefault(name, (graph_input, axis))
    lowered.inputs = inputs
    walk.nodes(graph.node)
    lowered.bn_folded = ctx.bn_folded
    lowered.qdq_fused = qdq_fused
    lowered.expanded = expanded
    lowered.removed = ctx.removed
    for out in graph.output:
        result = env.get(out.name)
        if result is None and (out.name not in env or not problems):
            # NOTE: a name bound to None without a refusal listed is an output a converter did
            # not give: dropping it would misalign the outputs with their names.
            problems.setdefault(f"graph output {out.name!r} is never computed", []).append(
                out.name)
        if result is not None:
            lowered.outputs.append(result)
    if problems:
        raise _refusal(model_name, opset, problems, walk.value_keys)
    return lowered


def _symbolic_shape(inp: Any, names: Mapping[int, str]) -> tuple[Any, ...]:
    """A graph input's shape with its named or unknown dims as symbolic dims."""
    from .symdim import Sym
    dims = inp.type.tensor_type.shape.dim
    return tuple(Sym.name(names[axis]) if axis in names else int(d.dim_value)
                 for axis, d in enumerate(dims))


def _count_uses(nodes: Any, uses: Counter) -> None:
    """Reads of each value name, subgraphs' reads of outer values included."""
    for node in nodes:
        uses.update(n for n in node.input if n)
        for a in node.attribute:
            if a.HasField("g"):
                _count_uses(a.g.node, uses)
                uses.update(o.name for o in a.g.output)


class _Walk:
    """Lowers nodes in order into env; an If with a constant condition lowers its branch."""

    def __init__(self, ctx: Context, env: dict[str, Value | None],
                 problems: dict[str, list[str]], expected: dict[str, tuple], model: Any,
                 lowered: Lowered, opsets: Mapping[str, int]) -> None:
        self.ctx = ctx
        self.env = env
        self.problems = problems
        self.expected = expected
        self.model = model
        self.lowered = lowered
        self.opsets = opsets
        self.value_keys: set[str] = set()  # problems that are run-time shape-deciding values

    def nodes(self, protos: Any) -> None:
        for proto in protos:
            self.node(proto)

    def node(self, proto: Any) -> None:
        env, problems = self.env, self.problems
        try:
            node = decode_node(proto, self.opsets)
        except Unsupported as e:
            problems.setdefault(f"{proto.op_type}: {e}", []).append(proto.name or proto.op_type)
            return
        args = [env.get(n) if n else None for n in node.inputs]
        missing = [n for n, v in zip(node.inputs, args) if n and v is None]
        if missing:
            # An input already refused: report this node only if its op itself is unknown.
            if node.op_type not in CONVERTERS and node.op_type != "If":
                problems.setdefault(_unknown_op(node), []).append(node.label)
            for name in node.outputs:
                env[name] = None
            return
        self.ctx.b.origin = node.label
        try:
            if node.op_type == "If" and node.domain == "" and args and args[0] is not None \
                    and args[0].const is not None:
                self.branch(node, args[0].const)
                return
            outs = _lower_node(self.ctx, node, args, self.model, self.lowered, self.expected)
            if node.op_type in ("MaxPool", "AveragePool") and int(node.attr("ceil_mode", 0)):
                self.forget_inferred(node, outs)
            _check_outputs(node, outs, self.expected)
        except NeedsValue as e:
            key = f"{node.op_type}: {e}"
            self.value_keys.add(key)
            problems.setdefault(key, []).append(node.label)
            outs = [None] * len(node.outputs)
        except Unsupported as e:
            key = _unknown_op(node) if str(e) == "__unknown__" else f"{node.op_type}: {e}"
            problems.setdefault(key, []).append(node.label)
            outs = [None] * len(node.outputs)
        except (ArithmeticError, LookupError, TypeError, ValueError, MemoryError) as e:
            # NOTE: a converter that trips over an input it did not expect refuses the node
            # (one line, listed with the others) instead of ending the import in a traceback.
            key = f"{node.op_type}: internal error: {type(e).__name__}: {e}"
            problems.setdefault(key, []).append(node.label)
            outs = [None] * len(node.outputs)
        for name, out_value in zip(node.outputs, outs):
            if name:
                env[name] = out_value
                if out_value is not None and out_value.const is not None:
                    self.lowered.consts[name] = out_value.const
                elif out_value is not None:
                    self.lowered.computed.add(name)

    def forget_inferred(self, node: OnnxNode, outs: Sequence[Value | None]) -> None:
        """Stop checking the inferred shapes from a ceil_mode pool on where they disagree with
        ours: onnx's shape inference (1.23) keeps a last window that would start in the end
        padding, which ONNX's operator text and ONNX Runtime drop (as the converter does), and
        its shapes downstream carry that window."""
        from .convert_data_dependent import downstream
        for name, value in zip(node.outputs, outs):
            known = self.expected.get(name)
            if value is None or known is None or tuple(known[0]) == tuple(value.shape):
                continue
            for stale in downstream(self.model, [name]):
                self.expected.pop(stale, None)
                self.ctx.expected.pop(stale, None)

    def branch(self, node: OnnxNode, condition: np.ndarray) -> None:
        """The taken branch's nodes, as if they stood in the graph (its outer reads resolve)."""
        if condition.size != 1:
            raise Unsupported(f"condition of shape {list(condition.shape)}; expected one element")
        graph = node.attr("then_branch" if bool(condition.reshape(-1)[0]) else "else_branch")
        if len(graph.output) != len(node.outputs):
            raise Unsupported(f"the branch {graph.name!r} has {len(graph.output)} outputs; "
                              f"expected {len(node.outputs)}, as the node has")
        self.constants(graph, f"branch {graph.name!r}")
        self.nodes(graph.node)
        self.lowered.folded["If"] += 1
        for name, out in zip(node.outputs, graph.output):
            if name:
                self.env[name] = self.env.get(out.name)

    def constants(self, graph: Any, where: str) -> None:
        """A graph's initializers and sparse initializers as constants (None where refused)."""
        tensors = [(t.name, t, False) for t in graph.initializer]
        tensors += [(s.values.name, s, True) for s in graph.sparse_initializer]
        for name, tensor, sparse in tensors:
            what = f"{where} initializer {name!r}"
            try:
                array = sparse_to_dense(tensor, what) if sparse else to_array(tensor, what)
            except Unsupported as e:
                if self.ctx.uses[name]:  # an unused initializer of an odd dtype does not matter
                    self.problems.setdefault(str(e), []).append(name)
                self.env[name] = None
                continue
            self.env[name] = self.ctx.b.const(array, name)


def _unknown_op(node: Any) -> str:
    domain = f" (domain {node.domain!r})" if node.domain else ""
    return f"op type {node.op_type}{domain} is not supported"


def _lower_node(ctx: Context, node: Any, args: list[Value | None], model: Any,
                lowered: Lowered, expected: Mapping[str, tuple]) -> list[Value | None]:
    known = [None if a is None else a.const if a.const is not None else a.known for a in args]
    consts = [a is None or k is not None for a, k in zip(args, known)]
    if ctx.unfold and any(name in ctx.unfold for name in node.outputs):
        from .convert_dims import convert_unfolded, keep_known
        outs = convert_unfolded(ctx, node, args)
        if all(consts):
            keep_known(node, outs, known, model.opset_import)
        return outs
    if all(consts) and node.op_type not in ("Dropout",):
        shapes = [expected[n][0] if n in expected else None for n in node.outputs]
        try:
            results = fold(node, known, model.opset_import, shapes)
        except TooLarge:
            raise
        except Unsupported:
            if node.op_type in CONVERTERS:
                results = None
            else:
                raise
        if results is not None:
            lowered.folded[node.op_type] += 1
            out: list[Value | None] = []
            for name, r in zip(node.outputs, results):
                if r is None:
                    out.append(None)
                    continue
                array = np.asarray(r)
                np_dtype_name = str(array.dtype)
                if has_sym(array):
                    out.append(ctx.b.const(array, name))  # int64 holding symbolic dims
                    continue
                if np_dtype_name not in RUNTIME_DTYPES:
                    raise Unsupported(f"folded output {name!r} has dtype {np_dtype_name}")
                out.append(ctx.b.const(array, name))
            return out
    convert = CONVERTERS.get(node.op_type) if node.domain in ("", FUSED_DOMAIN) else None
    if convert is None:
        raise Unsupported("__unknown__")
    if node.inputs and args[0] is None and node.op_type not in ("Scan", "Loop"):
        # NOTE: every converter reads input 0 as its data; a schema may not say it is required.
        raise Unsupported("input 0 is omitted (''); it is required")
    outs = list(convert(ctx, node, args))
    if outs and all(v is not None and v.const is not None for v in outs):
        lowered.folded[node.op_type] += 1  # Shape, Size: known from static shapes
    return outs + [None] * (len(node.outputs) - len(outs))


def _check_outputs(node: Any, outs: Sequence[Value | None], expected: Mapping[str, tuple]) -> None:
    """Our shapes must agree with ONNX shape inference wherever it found static ones."""
    for name, value in zip(node.outputs, outs):
        if not name or value is None or name not in expected:
            continue
        shape, _ = expected[name]
        if has_sym(value.shape):
            # A symbolic dim against a number ONNX states (a declared output shape, the size it
            # was exported at): only a difference decided at import refuses. The graph keeps
            # the expression, which specialising checks against each node's own shape rule.
            if len(shape) == len(value.shape) and not any(
                    decided_unequal(a, b) for a, b in zip(shape, value.shape)):
                continue
        if tuple(shape) != tuple(value.shape):
            raise Unsupported(f"output {name!r}: the import computes shape {value.shape} but "
                              f"ONNX shape inference gives {tuple(shape)}")
