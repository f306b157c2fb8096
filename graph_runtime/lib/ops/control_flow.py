"""ONNX control flow as ops that hold their sub-graphs as modules: onnx_if, onnx_loop, onnx_scan.

Each sub-graph is an ONNX model (base64, frontend/subgraph.py) imported and created on the
node's device (lib/subgraph_module.py); the kernel feeds it device arrays, runs it and copies its
outputs into the node's, so a body's ops run wherever the node runs. The node's output shapes
are static: both If branches must agree (else the import specialises on the condition's value),
a Loop with scan outputs states its iteration count (`iterations`, from a trip count known at
import; the run checks it), a Scan's length is its inputs'. Node inputs: onnx_if (cond, outer
values...), onnx_loop (trip count, cond, carried..., outer values...), onnx_scan (states...,
scan inputs..., outer values...), scan axes moved to 0 by the importer (1 for opset 8's batch).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...backends.base import Backend
from ...device import device
from ...errors import GraphRuntimeError
from ..attrs import op_error
from ..library import TensorSpec
from ..prepared import HoldsModules
from ..registry import define_op, kernel
from ..subgraph_module import SubModule, body_import, row, sub_module

_SCALAR_I64 = TensorSpec((), "int64")
_SCALAR_BOOL = TensorSpec((), "bool")


def _specs(op: str, attrs: Mapping[str, Any], key: str,
           inputs: Sequence[TensorSpec]) -> list[TensorSpec]:
    """The body's output specs (the shapes the model states where only the run knows)."""
    found = body_import(op, attrs[key], inputs).output_specs
    declared = attrs.get(f"{key}_outputs") or [None] * len(found)
    specs = []
    for k, (spec, stated) in enumerate(zip(found, declared)):
        if spec is None and stated is not None:
            spec = TensorSpec(tuple(int(d) for d in stated[0]), str(stated[1]))
        if spec is None:
            raise op_error(op, f"output {k} of its sub-graph has a shape known only when it "
                               "runs, and the model does not state it")
        specs.append(spec)
    return specs


def _check_scalar(op: str, spec: TensorSpec, what: str) -> None:
    if int(np.prod(spec.shape, dtype=np.int64)) != 1:
        raise op_error(op, f"{what} must hold one element; got shape {tuple(spec.shape)}")


def _same(op: str, what: str, want: TensorSpec, got: TensorSpec) -> None:
    if tuple(want.shape) != tuple(got.shape) or want.dtype != got.dtype:
        raise op_error(op, f"{what}: its sub-graph gives {tuple(got.shape)} {got.dtype} for a "
                           f"value that enters as {tuple(want.shape)} {want.dtype} (a shape or "
                           "dtype changing across iterations is not supported)")


class _RunFailure(RuntimeError):
    """A control-flow kernel failing at run: the executor re-raises it once as a LibraryError
    naming the node (a GraphRuntimeError would pass through it without the node)."""


class _ControlFlow(HoldsModules):
    """A control-flow kernel: run, with its sub-graph's errors turned into _RunFailure (so they
    name the node), and the body modules it holds (memory_report counts them)."""

    def __init__(self, op: str, run: Callable[..., None], bodies: Sequence[SubModule]) -> None:
        super().__init__(run, [body.module for body in bodies])
        self.op = op

    def __call__(self, *arrays: Any) -> None:
        try:
            self.run(*arrays)
        except GraphRuntimeError as e:
            raise _RunFailure(f"{self.op}: its sub-graph failed: {e}") from e


# ---- If -------------------------------------------------------------------------------------

def branch_specs(attrs: Mapping[str, Any],
                 fed: Sequence[TensorSpec]) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The output specs of the then and the else branch for these outer values."""
    return (_specs("onnx_if", attrs, "then_branch", fed),
            _specs("onnx_if", attrs, "else_branch", fed))


def _if_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _check_scalar("onnx_if", inputs[0], "the condition")
    then, other = branch_specs(attrs, inputs[1:])
    if len(then) != len(other):
        raise op_error("onnx_if", f"the then branch gives {len(then)} outputs, the else branch "
                                  f"{len(other)}")
    for k, (a, b) in enumerate(zip(then, other)):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            raise op_error("onnx_if", f"output {k} is {tuple(a.shape)} {a.dtype} from the then "
                                      f"branch but {tuple(b.shape)} {b.dtype} from the else "
                                      "branch (the import specialises on the condition then)")
    return then


def _if_kernel(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
               outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    dev = device(backend.name, device_id)
    then = sub_module("onnx_if", attrs["then_branch"], inputs[1:], dev)
    other = sub_module("onnx_if", attrs["else_branch"], inputs[1:], dev)
    n_in = len(inputs)

    def run(*arrays: Any) -> None:
        taken = then if bool(backend.to_host(arrays[0]).reshape(-1)[0]) else other
        for k in range(1, n_in):
            taken.feed(k - 1, arrays[k])
        taken.module.run()
        for k, out in enumerate(arrays[n_in:]):
            taken.read(k, out)
    return _ControlFlow("onnx_if", run, [then, other])


# ---- Loop -----------------------------------------------------------------------------------

def loop_parts(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    _check_scalar("onnx_loop", inputs[0], "the trip count")
    _check_scalar("onnx_loop", inputs[1], "the condition")
    return [_SCALAR_I64, _SCALAR_BOOL, *inputs[2:]]


def loop_outputs(op: str, inputs: Sequence[TensorSpec], attrs: Mapping[str, Any],
                 count: int) -> list[TensorSpec]:
    """A Loop node's outputs: its carried values, then each scan output (count, *body's)."""
    carried = int(attrs["num_carried"])
    outs = _specs(op, attrs, "body", loop_parts(inputs, attrs))
    if len(outs) < 1 + carried:
        raise op_error(op, f"its body gives {len(outs)} outputs; expected at least "
                           f"{1 + carried} (the condition and {carried} carried)")
    _check_scalar(op, outs[0], "the body's condition output")
    for k in range(carried):
        _same(op, f"carried value {k}", inputs[2 + k], outs[1 + k])
    scans = outs[1 + carried:]
    if scans and count < 0:
        raise op_error(op, "scan outputs need the iteration count known at import")
    return list(inputs[2:2 + carried]) + [TensorSpec((count, *s.shape), s.dtype) for s in scans]


def _loop_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    return loop_outputs("onnx_loop", inputs, attrs, int(attrs.get("iterations", -1)))


def _loop_kernel(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    from ...settings import loop_max_iterations
    dev = device(backend.name, device_id)
    body = sub_module("onnx_loop", attrs["body"], loop_parts(inputs, attrs), dev)
    carried = int(attrs["num_carried"])
    n_in = len(inputs)
    count = int(attrs.get("iterations", -1))
    limit = loop_max_iterations()
    scanned = len(outputs) > carried

    def run(*arrays: Any) -> None:
        trips = int(backend.to_host(arrays[0]).reshape(-1)[0])
        going = bool(backend.to_host(arrays[1]).reshape(-1)[0])
        outs = arrays[n_in:]
        for k in range(2 + carried, n_in):
            body.feed(k, arrays[k])
        state = list(arrays[2:2 + carried])
        i = 0
        while i < trips and going:
            if i >= limit:
                raise _RunFailure(f"onnx_loop: ran {limit} iterations and its condition still "
                                  "holds (GRAPH_RUNTIME_LOOP_MAX_ITERATIONS bounds a Loop; "
                                  "raise it if the model needs more)")
            if scanned and i >= count:
                raise _RunFailure(f"onnx_loop: its scan outputs were planned for {count} "
                                  "iterations (the count the import derived); it runs more")
            body.feed_host(0, np.array(i, np.int64))
            body.feed_host(1, np.array(going))
            for k, value in enumerate(state):
                body.feed(2 + k, value)
            body.module.run()
            going = bool(body.read_host(0).reshape(-1)[0])
            what = "a carried value"
            try:
                for k in range(carried):
                    what = f"carried value {k}"
                    body.read(1 + k, outs[k])
                for j, out in enumerate(outs[carried:]):
                    what = f"scan output {j}"
                    body.read(1 + carried + j, row(out, (i,)))
            except GraphRuntimeError as e:
                raise _RunFailure(f"onnx_loop: {what} at iteration {i}: {e}") from e
            state = list(outs[:carried])
            i += 1
        if scanned and i != count:
            raise _RunFailure(f"onnx_loop: ran {i} iterations; its scan outputs were planned "
                              f"for {count} (the count the import derived)")
        if i == 0:
            for k in range(carried):
                backend.copy(arrays[2 + k], outs[k])
    return _ControlFlow("onnx_loop", run, [body])


# ---- Scan -----------------------------------------------------------------------------------

def _scan_layout(inputs: Sequence[TensorSpec],
                 attrs: Mapping[str, Any]) -> tuple[int, int, int, int, list[TensorSpec]]:
    """(states, scan inputs, batch (0: none), length, body input specs)."""
    states = int(attrs["num_states"])
    scans = int(attrs["num_scan_inputs"])
    batched = bool(attrs.get("batched", False))
    axis = 1 if batched else 0
    if scans < 1 or len(inputs) < states + scans:
        raise op_error("onnx_scan", f"expected {states} states and {scans} (>= 1) scan inputs; "
                                    f"got {len(inputs)} inputs")
    lengths = {s.shape[axis] if len(s.shape) > axis else None
               for s in inputs[states:states + scans]}
    if len(lengths) != 1 or None in lengths:
        raise op_error("onnx_scan", f"scan inputs must share their length on axis {axis}; got "
                                    f"shapes {[tuple(s.shape) for s in inputs[states:]]}")
    length = int(lengths.pop())  # type: ignore[arg-type]
    batch = 0
    if batched:
        batches = {s.shape[0] if s.shape else None for s in inputs[:states + scans]}
        if len(batches) != 1 or None in batches:
            raise op_error("onnx_scan", "every state and scan input must share the batch axis 0")
        batch = int(batches.pop())  # type: ignore[arg-type]
    drop = axis + 1
    specs = [TensorSpec(tuple(s.shape[1:]) if batched else tuple(s.shape), s.dtype)
             for s in inputs[:states]]
    specs += [TensorSpec(tuple(s.shape[drop:]), s.dtype) for s in inputs[states:states + scans]]
    specs += list(inputs[states + scans:])
    return states, scans, batch, length, specs


def _scan_infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    states, _, batch, length, specs = _scan_layout(inputs, attrs)
    outs = _specs("onnx_scan", attrs, "body", specs)
    if len(outs) < states:
        raise op_error("onnx_scan", f"its body gives {len(outs)} outputs; expected at least "
                                    f"{states} (the states)")
    for k in range(states):
        _same("onnx_scan", f"state {k}", specs[k], outs[k])
    lead = (batch, length) if batch else (length,)
    return list(inputs[:states]) + [TensorSpec((*lead, *s.shape), s.dtype)
                                    for s in outs[states:]]


def _scan_kernel(backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> Callable[..., None]:
    dev = device(backend.name, device_id)
    states, scans, batch, length, specs = _scan_layout(inputs, attrs)
    body = sub_module("onnx_scan", attrs["body"], specs, dev)
    in_reverse = list(attrs.get("input_reverse") or [0] * scans)
    out_reverse = list(attrs.get("output_reverse") or [0] * (len(outputs) - states))
    n_in = len(inputs)

    def run(*arrays: Any) -> None:
        outs = arrays[n_in:]
        for k in range(states + scans, n_in):
            body.feed(k, arrays[k])
        for b in range(max(batch, 1)):
            at: tuple[int, ...] = (b,) if batch else ()
            state = [row(arrays[k], at) if batch else arrays[k] for k in range(states)]
            finals = [row(outs[k], at) if batch else outs[k] for k in range(states)]
            for t in range(length):
                for k, value in enumerate(state):
                    body.feed(k, value)
                for j in range(scans):
                    step = length - 1 - t if in_reverse[j] else t
                    body.feed(states + j, row(arrays[states + j], at + (step,)))
                body.module.run()
                for k in range(states):
                    body.read(k, finals[k])
                state = finals
                for j, out in enumerate(outs[states:]):
                    step = length - 1 - t if out_reverse[j] else t
                    body.read(states + j, row(out, at + (step,)))
            if length == 0:
                for k in range(states):
                    backend.copy(state[k], finals[k])
    return _ControlFlow("onnx_scan", run, [body])


_BODY_ATTRS = ("body", "body_outputs")
define_op("onnx_if", _if_infer, None,
          ("then_branch", "else_branch", "then_branch_outputs", "else_branch_outputs"))
define_op("onnx_loop", _loop_infer, None, (*_BODY_ATTRS, "num_carried", "iterations"))
define_op("onnx_scan", _scan_infer, None,
          (*_BODY_ATTRS, "num_states", "num_scan_inputs", "batched", "input_reverse",
           "output_reverse"))
for _backend in ("cpu", "cuda", "opencl"):
    kernel("onnx_if", _backend)(_if_kernel)
    kernel("onnx_loop", _backend)(_loop_kernel)
    kernel("onnx_scan", _backend)(_scan_kernel)
