"""Helpers tests import by name (conftest modules cannot be imported reliably: there are several)."""
from __future__ import annotations

import os
from typing import Any, Sequence

import pytest

from graph_runtime.backends import get_backend
from graph_runtime.errors import DeviceError

REQUIRE_OPENCL = os.environ.get("GRAPH_RUNTIME_REQUIRE_OPENCL") == "1"


def backend_missing(name: str) -> str | None:
    """Why a backend cannot run here, or None when it can."""
    try:
        backend = get_backend(name)
        if backend.device_count() == 0:
            return f"{name}: no device visible"
    except DeviceError as e:
        return str(e)
    return None


def require_backend(name: str) -> None:
    """Skip with the reason when the backend is missing; OpenCL fails instead in CI."""
    reason = backend_missing(name)
    if reason is None:
        return
    if name == "opencl" and REQUIRE_OPENCL:
        pytest.fail(f"OpenCL is required here (GRAPH_RUNTIME_REQUIRE_OPENCL=1) but missing: {reason}")
    pytest.skip(reason)


def require_onednn() -> None:
    """Skip with the reason when oneDNN cannot load; fail instead where CI requires it
    (GRAPH_RUNTIME_REQUIRE_ONEDNN=1), except in its run with oneDNN turned off."""
    from graph_runtime.lib.kernels.onednn import binding
    if binding.available():
        return
    reason = f"oneDNN not available: {binding.unavailable_reason()}"
    if os.environ.get("GRAPH_RUNTIME_REQUIRE_ONEDNN") == "1" and binding.onednn_mode() != "off":
        pytest.fail(reason)
    pytest.skip(reason)


# ---- small graph builders (tests build graphs with these, not inline JSON) ----------------------

def null(name: str) -> dict:
    """A graph input (an arg node)."""
    return {"op": "null", "name": name, "inputs": []}


def tvm_op(name: str, func_name: str, inputs: list, num_outputs: int = 1,
           flatten_data: int = 0, **attrs: object) -> dict:
    """A kernel node; inputs are node ids or (node id, output index) pairs."""
    refs = [[i, 0, 0] if isinstance(i, int) else [i[0], i[1], 0] for i in inputs]
    node_attrs = {"func_name": func_name, "num_inputs": str(len(refs)),
                  "num_outputs": str(num_outputs), "flatten_data": str(flatten_data)}
    node_attrs.update({k: v for k, v in attrs.items()})
    return {"op": "tvm_op", "name": name, "inputs": refs, "attrs": node_attrs}


def copy_op(name: str, src: int) -> dict:
    """A __copy node moving node src's output 0 to this node's device."""
    return tvm_op(name, "__copy", [src])


def make_graph(nodes: list, heads: list, shapes: object = (4,), dtypes: object = "float32",
               **columns: object):
    """A validated Graph; shapes/dtypes may be one value for every entry or a list per entry."""
    from graph_runtime.graph.model import Graph
    num_entries = sum(int(n.get("attrs", {}).get("num_outputs", 1)) for n in nodes)
    if isinstance(shapes, tuple):
        shapes = [list(shapes)] * num_entries
    if isinstance(dtypes, str):
        dtypes = [dtypes] * num_entries
    head_refs = [[h, 0, 0] if isinstance(h, int) else [h[0], h[1], 0] for h in heads]
    return Graph.build(nodes, head_refs, shapes=shapes, dtypes=dtypes, **columns)


def concrete_shape(shape: Sequence[Any], value: int = 2, most: int = 1 << 20) -> tuple[int, ...]:
    """A shape to feed an input whose declared shape may hold symbolic dims (a name, an
    expression, '?'): every name bound to value; a dim that cannot be evaluated, or a shape past
    `most` elements, gets 1s (a test harness picks some valid-looking size, the module judges)."""
    from graph_runtime.graph.symbolic import DimError, evaluate, names_in
    env = {name: value for d in shape for name in names_in(d)}
    dims = []
    for d in shape:
        try:
            dims.append(max(evaluate(d, env), 0))
        except (DimError, TypeError, ValueError):
            dims.append(1)
    total = 1
    for d in dims:
        total *= d
    return tuple(dims) if total <= most else tuple(1 for _ in dims)


def dense_spec(m: int, n: int, k: int, dtype: str = "float32") -> Any:
    """x[m, k] @ w[n, k].T as dense's one candidate set sees it (kernels/cpu/dense_choice.py)."""
    from graph_runtime.lib.ops.linalg import Gemm, dense_spec as spec
    return spec(get_backend("cpu"), 0, Gemm(1, m, n, k, False, True, 1, 1, dtype),
                [(m, k), (n, k), (m, n)])


def layout_races(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The winner of each race of team_gemv's weight layout run from now on (each race runs
    for real; the list only counts them)."""
    from graph_runtime.lib.kernels.cpu import team_gemv
    raced: list[str] = []
    race_layouts = team_gemv._race_layouts

    def counted(race: Any) -> Any:
        verdict = race_layouts(race)
        raced.append(verdict.chosen)
        return verdict
    monkeypatch.setattr(team_gemv, "_race_layouts", counted)
    return raced
