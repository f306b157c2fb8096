"""If, Loop and Scan lowered to onnx_if/onnx_loop/onnx_scan ops that hold their sub-graphs.

An If whose condition is known at import is inlined by lower.py; any other If, Loop or Scan
becomes one op whose sub-graphs are models of their own (frontend/subgraph.py), imported and
created on the node's device when the graph is created (lib/ops/control_flow.py).

Shapes stay static (the design): a Loop's scan outputs need its iteration count at import, so
a trip count or condition computed at run time is a shape-deciding value (NeedsValue: the
importer then specialises the model on it, frontend/deferred.py). A body that may stop early
(a condition it computes) with scan outputs makes their length data: the import names it
(`Loop_<first scan output>`, convert_data_dependent.py) and the node becomes
onnx_loop_dynamic, which the runtime cuts the graph at (lib/ops/loop_dynamic.py). An If whose
branches give different shapes specialises on its condition the same way.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import LibraryError
from ..lib.library import TensorSpec
from .convert import Context, converts, norm_axis
from .ir import NeedsValue, Unsupported, Value
from .onnx_model import np_dtype
from .onnx_node import OnnxNode
from .subgraph import body_model, fed_values, outer_reads


def _declared(ctx: Context, names: Sequence[str], drop: int = 0) -> list[Any]:
    """[shape, dtype] the outer model's shape inference states per name (None if unknown)."""
    out: list[Any] = []
    for name in names:
        known = ctx.expected.get(name) if name else None
        out.append(None if known is None else
                   [list(known[0])[drop:], np_dtype(known[1])])
    return out


def _body_outputs(op: str, b64: str, specs: Sequence[TensorSpec],
                  declared: list[Any]) -> list[Any] | None:
    """declared, when the body's import leaves an output's shape to its run; else None."""
    from ..lib.subgraph_module import body_import
    try:
        found = body_import(op, b64, specs).output_specs
    except LibraryError as e:
        raise Unsupported(str(e)) from e  # listed with the import's other refusals
    return declared if any(s is None for s in found) else None


# An If's condition picks between branches of different shapes: deferred import freezes it.
@converts("If", value_inputs=(0,))
def _if(ctx: Context, node: OnnxNode, args: list) -> Sequence[Value | None]:
    from ..lib.ops.control_flow import branch_specs
    then_g, else_g = node.attr("then_branch"), node.attr("else_branch")
    for g in (then_g, else_g):
        if len(g.output) != len(node.outputs):
            raise Unsupported(f"branch {g.name!r} has {len(g.output)} outputs; the node has "
                              f"{len(node.outputs)}")
    names, embedded = outer_reads([then_g, else_g], ctx.scope, f"If {node.label!r}")
    fed = fed_values(names, ctx.scope)
    specs = [v.spec for v in fed.values()]
    attrs: dict[str, Any] = {"then_branch": body_model(then_g, ctx.model, [], fed, embedded),
                             "else_branch": body_model(else_g, ctx.model, [], fed, embedded)}
    declared = _declared(ctx, node.outputs)
    for key in ("then_branch", "else_branch"):
        attrs[f"{key}_outputs"] = _body_outputs("onnx_if", attrs[key], specs, declared)
    try:
        then, other = branch_specs(attrs, specs)
    except LibraryError as e:
        raise Unsupported(str(e)) from e
    if [(s.shape, s.dtype) for s in then] != [(s.shape, s.dtype) for s in other]:
        raise NeedsValue("input 0 (the condition) decides the output shapes: the branches "
                         "give different ones")
    return ctx.b.ops("onnx_if", [args[0], *fed.values()], **attrs)


def _passes_condition(body: Any) -> bool:
    """Whether the body's condition output is its condition input (or constant true): then
    only the trip count and the initial condition decide the iteration count."""
    if not body.output or len(body.input) < 2:
        return False  # a body ONNX's Loop cannot run: check_node refuses it
    producers = {o: n for n in body.node for o in n.output if o}
    name = body.output[0].name
    for _ in range(len(body.node) + 1):
        if name == body.input[1].name:
            return True
        node = producers.get(name)
        if node is None:
            return False
        if node.op_type == "Identity":
            name = node.input[0]
            continue
        if node.op_type == "Constant" and node.attribute:
            from onnx import numpy_helper
            attr = node.attribute[0]
            if attr.name == "value" and attr.HasField("t"):
                value = numpy_helper.to_array(attr.t)
                return value.size == 1 and bool(value.reshape(-1)[0])
        return False
    return False


def _iterations(ctx: Context, node: OnnxNode, args: list, body: Any) -> int:
    """The iteration count a Loop with scan outputs runs, known at import."""
    from ..settings import loop_max_iterations
    trips, cond = args[0], args[1]
    if trips is None:
        raise Unsupported("scan outputs with no trip count (the loop would not end)")
    # NOTE: `known` is a value following symbolic dims (a trip count read from a shape): the
    # symbolic import then writes the count as an expression of the dims.
    trip = trips.const if trips.const is not None else trips.known
    go = None if cond is None else cond.const if cond.const is not None else cond.known
    if trip is None or (cond is not None and go is None):
        raise NeedsValue("inputs 0 and 1 (trip count, condition) decide the length of its scan "
                         "outputs and are computed at run time")
    count = max(int(np.asarray(trip).reshape(-1)[0]), 0)
    if go is not None and not bool(np.asarray(go).reshape(-1)[0]):
        count = 0
    if count > loop_max_iterations():
        raise Unsupported(f"a trip count of {count} with scan outputs; at most "
                          f"{loop_max_iterations()} iterations (GRAPH_RUNTIME_LOOP_MAX_ITERATIONS)")
    return count


# A Loop's trip count and condition give its scan outputs' length: deferred import freezes
# them.
@converts("Loop", value_inputs=(0, 1))
def _loop(ctx: Context, node: OnnxNode, args: list) -> Sequence[Value | None]:
    body = node.attr("body")
    carried = list(args[2:])
    if any(v is None for v in carried):
        raise Unsupported("an omitted loop-carried input")
    scans = len(body.output) - 1 - len(carried)
    if len(body.input) != 2 + len(carried) or scans < 0:
        raise Unsupported(f"body {body.name!r} has {len(body.input)} inputs and "
                          f"{len(body.output)} outputs for {len(carried)} carried values")
    size = None
    if scans and not _passes_condition(body):
        # The body may stop early: the scan outputs' length is a data-dependent size.
        size = ctx.data_sizes.get(node.outputs[len(carried)])
        if size is None:
            raise Unsupported("scan outputs whose length depends on the condition its body "
                              "computes (a size only the data decides) need the import to "
                              "name that size (import_onnx does: the graph then runs in "
                              "segments cut at the Loop)")
    iterations = _iterations(ctx, node, args, body) if scans and size is None else -1
    b = ctx.b
    trips = args[0] if args[0] is not None else b.const(np.array(np.iinfo(np.int64).max),
                                                        "trip_count")
    cond = args[1] if args[1] is not None else b.const(np.array(True), "cond")
    trips = b.reshape(b.cast(trips, "int64"), ())
    cond = b.reshape(cond, ())
    names, embedded = outer_reads([body], ctx.scope, f"Loop {node.label!r}")
    fed = fed_values(names, ctx.scope)
    formal: list[Any] = [((), "int64"), ((), "bool"), *carried]
    b64 = body_model(body, ctx.model, formal, fed, embedded)
    declared = [[[], "bool"]] + _declared(ctx, node.outputs[:len(carried)]) + \
        _declared(ctx, node.outputs[len(carried):], drop=1)
    specs = [TensorSpec((), "int64"), TensorSpec((), "bool"), *[v.spec for v in carried],
             *[v.spec for v in fed.values()]]
    if size is not None:
        return b.ops("onnx_loop_dynamic", [trips, cond, *carried, *fed.values()], body=b64,
                     body_outputs=_body_outputs("onnx_loop_dynamic", b64, specs, declared),
                     num_carried=len(carried), count=int(size))
    return b.ops("onnx_loop", [trips, cond, *carried, *fed.values()], body=b64,
                 body_outputs=_body_outputs("onnx_loop", b64, specs, declared),
                 num_carried=len(carried), iterations=iterations)


def data_dependent_loop(node: Any) -> str | None:
    """The first scan output of an ONNX Loop node whose body computes its own condition (how
    many rows its scan outputs get is data); None for any other node."""
    if node.op_type != "Loop" or node.domain not in ("", "ai.onnx"):
        return None
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    carried = len(node.input) - 2
    scans = list(node.output[carried:])
    if body is None or carried < 0 or not scans or not scans[0] or _passes_condition(body):
        return None
    return str(scans[0])


@converts("Scan")
def _scan(ctx: Context, node: OnnxNode, args: list) -> Sequence[Value | None]:
    body = node.attr("body")
    n_scan = int(node.attr("num_scan_inputs"))
    batched = node.opset < 9
    if batched:
        if args and args[0] is not None:
            raise Unsupported("input 0 (sequence_lens) is given; only full-length sequences "
                              "are supported")
        args = list(args[1:])
    n_states = len(args) - n_scan
    if n_states < 0 or any(v is None for v in args):
        raise Unsupported(f"{len(args)} inputs for {n_scan} scan inputs (an omitted input?)")
    if len(body.input) != len(args) or len(body.output) != len(node.outputs):
        raise Unsupported(f"body {body.name!r} declares {len(body.input)} inputs and "
                          f"{len(body.output)} outputs; the node passes {len(args)} ({n_states} "
                          f"state values, {n_scan} scanned) and takes {len(node.outputs)} (the "
                          "state values, then the scan outputs): expected as many each")
    n_out = len(body.output) - n_states
    b = ctx.b
    in_dirs = node.ints("directions" if batched else "scan_input_directions", [0] * n_scan)
    out_dirs = [0] * n_out if batched else node.ints("scan_output_directions", [0] * n_out)
    in_axes = [0] * n_scan if batched else node.ints("scan_input_axes", [0] * n_scan)
    out_axes = [0] * n_out if batched else node.ints("scan_output_axes", [0] * n_out)
    if len(in_dirs) != n_scan or len(in_axes) != n_scan or len(out_dirs) != n_out \
            or len(out_axes) != n_out:
        raise Unsupported("scan axes or directions do not match the scan inputs/outputs")
    states, scanned = args[:n_states], args[n_states:]
    moved = []
    for x, axis in zip(scanned, in_axes):
        a = norm_axis(axis, x.rank, node, "scan_input_axes")
        moved.append(b.transpose(x, [a] + [d for d in range(x.rank) if d != a]))
    lead = 2 if batched else 1
    formal = [(v.shape[1:] if batched else v.shape, v.dtype) for v in states]
    formal += [(v.shape[lead:], v.dtype) for v in moved]
    names, embedded = outer_reads([body], ctx.scope, f"Scan {node.label!r}")
    fed = fed_values(names, ctx.scope)
    b64 = body_model(body, ctx.model, formal, fed, embedded)
    declared = [None] * len(body.output)
    specs = [TensorSpec(tuple(s), d) for s, d in formal] + [v.spec for v in fed.values()]
    outs = b.ops("onnx_scan", [*states, *moved, *fed.values()], body=b64,
                 body_outputs=_body_outputs("onnx_scan", b64, specs, declared),
                 num_states=n_states, num_scan_inputs=n_scan, batched=batched,
                 input_reverse=[int(d) for d in in_dirs],
                 output_reverse=[int(d) for d in out_dirs])
    result = list(outs[:n_states])
    for y, axis in zip(outs[n_states:], out_axes):
        a = norm_axis(axis, y.rank, node, "scan_output_axes")
        result.append(b.transpose(y, list(range(1, a + 1)) + [0] + list(range(a + 1, y.rank))))
    return result
