"""One module base: the three module kinds share ModuleBase's methods and one diagnostics mixin,
and answer the shared argument forms with the same messages; create() is typed honestly."""
from __future__ import annotations

import inspect
from abc import ABC
from typing import Any

import numpy as np
import pytest
from support import make_graph, null, tvm_op
from test_specialize import dense_graph

import graph_runtime as gr
from graph_runtime.errors import GraphError, GraphRuntimeError, ParamsError
from graph_runtime.runtime import graph_module
from graph_runtime.runtime.diagnostics import Diagnostics
from graph_runtime.runtime.graph_module import GraphModule, create
from graph_runtime.runtime.module_base import ModuleBase
from graph_runtime.runtime.segmented_module import SegmentedGraphModule
from graph_runtime.runtime.symbolic_module import SymbolicGraphModule

KINDS = (GraphModule, SymbolicGraphModule, SegmentedGraphModule)


def _shared() -> set[str]:
    """The public methods written once in the base or the mixin (abstract ones excluded)."""
    names = set()
    for cls in (ModuleBase, Diagnostics):
        for name, value in vars(cls).items():
            if not name.startswith("_") and callable(value) \
                    and not getattr(value, "__isabstractmethod__", False):
                names.add(name)
    return names


def test_the_three_kinds_share_the_base_and_redefine_none_of_its_methods() -> None:
    shared = _shared()
    assert {"set_input", "get_input", "get_output", "get_output_index", "get_input_index",
            "get_num_inputs", "get_num_outputs", "get_input_info", "get_output_info",
            "load_params", "share_params", "run", "run_with", "clone", "benchmark", "profile",
            "placement", "copies", "memory_report", "debug_get_outputs"} <= shared
    for cls in KINDS:
        assert cls.__mro__ == (cls, ModuleBase, Diagnostics, ABC, object), cls.__mro__
        assert not shared & set(vars(cls)), (cls, shared & set(vars(cls)))
        assert not inspect.isabstract(cls), cls


def test_create_is_typed_as_the_base_without_an_ignore() -> None:
    assert inspect.signature(create).return_annotation == "ModuleBase"
    assert "type: ignore" not in inspect.getsource(create)
    assert gr.create is graph_module.create


def _modules() -> list[ModuleBase]:
    pytest.importorskip("onnx")
    from test_segments import _create, _nonzero_sum
    static = gr.create(make_graph([null("x"), null("a"), tvm_op("ax", "multiply", [1, 0])], [2],
                                  shapes=(2, 3)))
    symbolic = gr.create(dense_graph())
    segmented = _create(_nonzero_sum())[0]
    assert [type(m) for m in (static, symbolic, segmented)] == list(KINDS)
    return [static, symbolic, segmented]


def test_every_kind_answers_the_shared_forms_with_the_same_messages() -> None:
    for m in _modules():
        first = next(iter(m.get_input_info()[0]))
        assert m.get_input_index(first) == 0 and m.get_num_outputs() == 1
        with pytest.raises(GraphError, match=r"graph has no input 'nope'; inputs are: "):
            m.set_input("nope", np.zeros(1, np.float32))
        with pytest.raises(GraphError, match=r"input index 7 is out of range: the graph has "):
            m.set_input(7, np.zeros(1, np.float32))
        with pytest.raises(GraphError, match=r"set_input\(0\) needs a value; got None"):
            m.set_input(0)
        with pytest.raises(GraphError, match="input key must be a name or an index, got float"):
            m.get_input(1.5)  # type: ignore[arg-type]
        with pytest.raises(GraphError, match="get_output_index needs an output name"):
            m.get_output_index(0)  # type: ignore[arg-type]
        with pytest.raises(GraphError, match="graph has no output 'nope'; outputs are: "):
            m.get_output_index("nope")
        m.strict = True
        with pytest.raises(ParamsError, match=r"params: 1 param is not an input of the graph: "
                                              r"'zz'; inputs are: "):
            m.load_params({"zz": np.zeros(1, np.float32)})
        with pytest.raises(ParamsError, match="share_params needs the params as bytes"):
            m.share_params(m, "w")  # type: ignore[arg-type]
        with pytest.raises(GraphRuntimeError, match=rf"^{type(m).__name__}\.run\(\) called "
                                                    r"from thread 'MainThread' while another"):
            m._lock.acquire()
            try:
                m.run()
            finally:
                m._lock.release()


def _random_inputs(m: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random values for every input of m, its symbolic dims at 2."""
    info = m.get_input_info()
    return {n: rng.standard_normal([d if isinstance(d, int) else 2 for d in shape]).astype(dtype)
            for (n, shape), dtype in zip(info[0].items(), info[1].values())}


def test_run_with_returns_arrays_of_the_callers_own() -> None:
    # one copy of each output (GraphModule._host_outputs), still the caller's alone: the next
    # run does not overwrite it, and writing it changes nothing the module holds
    rng = np.random.default_rng(1)
    for m in _modules():
        inputs = _random_inputs(m, rng)
        first = m.run_with(**inputs)
        kept = [a.copy() for a in first]
        assert all(isinstance(a, np.ndarray) and a.flags.owndata for a in first)
        first[0][...] = 0
        np.testing.assert_array_equal(m.get_output(0).numpy(), kept[0])
        again = m.run_with(**{n: v + 1 for n, v in inputs.items()})
        assert not np.array_equal(again[0], kept[0]) and not np.any(first[0])


def test_every_kind_runs_benchmarks_and_reports_through_the_same_methods() -> None:
    rng = np.random.default_rng(0)
    for m in _modules():
        inputs = _random_inputs(m, rng)
        outputs = m.run_with(**inputs)
        m.run(**inputs)
        np.testing.assert_array_equal(m.get_output(0).numpy(), outputs[0])
        np.testing.assert_array_equal(m.clone().run_with(**inputs)[0], outputs[0])
        assert m.benchmark(repeat=1, number=1, end_to_end=True, **inputs).mean >= 0
        assert m.profile() and m.copies() == [] and m.held_bytes()
        assert sum(m.memory_report().pool.values()) > 0
        names = [n for _, n, func, _ in m.placement() if func not in ("input", "")]
        assert set(m.debug_get_outputs([names[-1]])) == {names[-1]}
