"""onnx_loop_dynamic: an ONNX Loop with scan outputs whose body computes its own condition.

How many iterations such a Loop runs (so its scan outputs' length) only the data decides, as
NonZero's count: attr `count` is that size, a symbolic dim (`Loop_<first scan output>`) that a
segmented run binds (runtime/segments.py, lib/ops/data_dependent.py). The graph is cut at the
node: its host function runs the loop on the host, its body a CPU module (lib/subgraph_module.py)
kept per (body, input specs), each iteration's scan values stacked at the end. The
destination-passing CPU kernel serves a graph that states the count (and refuses another).
"""
from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

import numpy as np

from ..._lru import LruCache
from ...device import cpu
from ..attrs import op_error
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..subgraph_module import SubModule, sub_module
from .control_flow import loop_outputs, loop_parts
from .data_dependent import destination_kernel

OP = "onnx_loop_dynamic"
CACHE_SIZE = 16
# (body, input specs) -> the body on the CPU and the lock that keeps one run in it at a time.
_bodies: LruCache[tuple[SubModule, threading.Lock]] = LruCache(CACHE_SIZE)


def _count(attrs: Mapping[str, Any]) -> int:
    count = int(attrs["count"])
    if count < 0:
        raise op_error(OP, f"count {count}; expected >= 0")
    return count


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    outs = loop_outputs(OP, inputs, attrs, _count(attrs))
    if len(outs) == int(attrs["num_carried"]):
        raise op_error(OP, "has no scan outputs (a Loop without them is onnx_loop)")
    return outs


def _host(arrays: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    from ...settings import loop_max_iterations
    host = [np.asarray(a) for a in arrays]
    specs = [TensorSpec(tuple(a.shape), str(a.dtype)) for a in host]
    parts = loop_parts(specs, attrs)
    key = (attrs["body"], tuple((tuple(s.shape), s.dtype) for s in parts))
    body, lock = _bodies.get_or_build(key, lambda: (
        sub_module(OP, attrs["body"], parts, cpu(0)), threading.Lock()))
    carried = int(attrs["num_carried"])
    scan_specs = loop_outputs(OP, specs, attrs, 0)[carried:]
    limit = loop_max_iterations()
    trips = int(host[0].reshape(-1)[0])
    going = bool(host[1].reshape(-1)[0])
    state = host[2:2 + carried]
    rows: list[list[np.ndarray]] = [[] for _ in scan_specs]
    with lock:
        for k in range(2 + carried, len(host)):
            body.feed_host(k, host[k])
        i = 0
        while i < trips and going:
            if i >= limit:
                raise op_error(OP, f"ran {limit} iterations and its condition still holds "
                                   "(GRAPH_RUNTIME_LOOP_MAX_ITERATIONS bounds a Loop; raise it "
                                   "if the model needs more)")
            body.feed_host(0, np.array(i, np.int64))
            body.feed_host(1, np.array(going))
            for k, value in enumerate(state):
                body.feed_host(2 + k, value)
            body.module.run()
            going = bool(body.read_host(0).reshape(-1)[0])
            state = [body.read_host(1 + k) for k in range(carried)]
            for j, row in enumerate(rows):
                row.append(body.read_host(1 + carried + j))
            i += 1
    scans = [np.stack(row) if row else np.empty(tuple(spec.shape), spec.dtype)
             for row, spec in zip(rows, scan_specs)]
    return [np.array(v, copy=True) for v in state] + scans


define_op(OP, _infer, None, ("body", "body_outputs", "num_carried", "count"), host=_host)
kernel(OP, "cpu")(destination_kernel(OP, _host))
