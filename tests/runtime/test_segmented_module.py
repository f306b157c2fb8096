"""SegmentedGraphModule has the specialising module's API: debug outputs, memory, placement,
copies, clone; each checked against NumPy and ONNX Runtime on the nodes' values."""
from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from test_segments import _create, _nonzero_sum, _ort, _two_cuts

import graph_runtime as gr
from graph_runtime.errors import GraphError
from graph_runtime.frontend import from_onnx
from graph_runtime.runtime.measure import MemoryReport
from graph_runtime.runtime.segmented_module import SegmentedGraphModule
from graph_runtime.runtime.symbolic_module import SymbolicGraphModule


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_it_has_every_method_the_specialising_module_has() -> None:
    missing = _public(SymbolicGraphModule) - _public(SegmentedGraphModule)
    assert not missing, missing
    # Of GraphModule's, both lack only zero-copy bindings: an array bound as an input or output
    # is one specialisation's storage, and the next shape needs other storage.
    from graph_runtime.runtime.graph_module import GraphModule
    for cls in (SymbolicGraphModule, SegmentedGraphModule):
        assert _public(GraphModule) - _public(cls) == {"set_input_zero_copy",
                                                       "set_output_zero_copy"}, cls


def test_debug_get_outputs_gives_every_node_and_the_cut() -> None:
    module, graph, _ = _create(_nonzero_sum())
    x = np.linspace(-2, 2, 8).astype(np.float32)
    module.set_input("x", x)
    got = module.debug_get_outputs()
    mask = 1 / (1 + np.exp(-x.astype(np.float64))) > 0.5
    np.testing.assert_array_equal(got["tvmgen_default_fused_sigmoid_greater"][0], mask)
    np.testing.assert_array_equal(got["tvmgen_default_fused_nonzero"][0],
                                  np.array(np.nonzero(mask)))
    np.testing.assert_array_equal(got["tvmgen_default_fused_sum"][0],
                                  _ort(_nonzero_sum(), {"x": x})[0])
    by_id = module.debug_get_outputs([3, "tvmgen_default_fused_sum"])
    assert sorted(by_id) == ["tvmgen_default_fused_nonzero", "tvmgen_default_fused_sum"]
    with pytest.raises(GraphError, match="graph has no node named 'nope'"):
        module.debug_get_outputs(["nope"])
    with pytest.raises(GraphError, match="node id 99 is out of range: the graph has 5 nodes"):
        module.debug_get_outputs([99])


def test_memory_report_sums_the_segments_and_needs_a_run() -> None:
    module, _, _ = _create(_two_cuts())
    with pytest.raises(GraphError, match="memory_report: nothing has run yet"):
        module.memory_report()
    module.run(x=np.array([1, 0, 1, 1, 0, 0, 1, 0, 1], np.float32))
    report = module.memory_report()
    assert isinstance(report, MemoryReport)
    want = MemoryReport({}, {}, {})
    for m in module.modules:
        if m is not None:
            want = want + m.memory_report()
    assert report == want and report.pool[gr.cpu()] > 0
    # held: every specialisation the segments keep (here one per segment)
    assert module.held_bytes()[gr.cpu()] >= report.pool[gr.cpu()]
    assert module.get_output_info() == ([("2*NonZero_nz",)], ["float32"])


def test_clone_shares_params_and_runs_in_parallel() -> None:
    m = _nonzero_sum()
    module, _, _ = _create(m)
    clones = [module.clone() for _ in range(3)]
    half = [c.modules[0].get_input("half").numpy() for c in clones]
    assert all(h == 0.5 for h in half)
    rng = np.random.default_rng(2)
    feeds = [rng.standard_normal(8).astype(np.float32) for _ in range(len(clones))]
    results: dict[int, np.ndarray] = {}

    def work(k: int) -> None:
        for _ in range(5):
            results[k] = clones[k].run_with(x=feeds[k])[0]
    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(clones))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, x in enumerate(feeds):
        np.testing.assert_array_equal(results[k], _ort(m, {"x": x})[0])
    seg0 = module.modules[0].executor.arrays
    assert any(a is b for a in clones[0].modules[0].executor.arrays.values()
               for b in seg0.values())  # the param array itself, not a copy


@pytest.mark.opencl
def test_placement_and_copies_across_cpu_and_opencl(opencl_available: None) -> None:
    from graph_runtime.planner.plan import plan_graph
    m = _nonzero_sum()
    graph_json, lib, params = from_onnx(m)
    planned = plan_graph(graph_json, {"default_device": "cpu", "node_devices": {
        "*sigmoid*": "opencl", "*sum": "opencl"}}, lib).graph
    module = gr.create(planned, lib, [gr.opencl(), gr.cpu()])
    module.load_params(gr.save_param_dict(params))
    x = np.linspace(-3, 1, 8).astype(np.float32)
    module.run(x=x)
    np.testing.assert_array_equal(module.get_output(0).numpy(), _ort(m, {"x": x})[0])
    where = {name: dev.kind for _, name, _, dev in module.placement()}
    assert where["tvmgen_default_fused_nonzero"] == "cpu"  # a cut runs on the host
    assert where["tvmgen_default_fused_sum"] == "opencl"
    assert where["tvmgen_default_fused_sigmoid_greater"] == "opencl"
    assert module.copies() == []  # plan_graph inserted them as __copy nodes
    report = module.memory_report()
    assert report.pool[gr.opencl()] > 0
    clone = module.clone()
    clone.run(x=-x)
    np.testing.assert_array_equal(clone.get_output(0).numpy(), _ort(m, {"x": -x})[0])


def test_share_params_shares_each_segments_params() -> None:
    m = _nonzero_sum()
    first, _, _ = _create(m)
    graph_json, lib, params = from_onnx(m)
    second = gr.create(graph_json, lib)
    second.share_params(first, gr.save_param_dict(params))
    x = np.linspace(-1, 3, 8).astype(np.float32)
    np.testing.assert_array_equal(second.run_with(x=x)[0], _ort(m, {"x": x})[0])
    mine = second.modules[0].executor.arrays.values()
    assert any(a is b for a in mine for b in first.modules[0].executor.arrays.values())
    with pytest.raises(GraphError, match="needs a SegmentedGraphModule of the same graph"):
        second.share_params(first.modules[0], gr.save_param_dict(params))
