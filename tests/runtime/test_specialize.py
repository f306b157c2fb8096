"""Symbolic graphs: create() specialises per input shape, caches, shares params, names conflicts."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import graph_runtime as gr
from graph_runtime import settings
from graph_runtime.errors import GraphError, LibraryError
from graph_runtime.graph.symbolic import check_dim, evaluate, names_in, shapes_evaluator
from graph_runtime.runtime.symbolic_module import SymbolicGraphModule
from graph_runtime.runtime.executor import Executor
from graph_runtime.lib.tuning import SMALL_DIM, class_shape

RNG = np.random.default_rng(0)


def _op(name: str, func: str, inputs: list[int]) -> dict:
    return {"op": "tvm_op", "name": name, "inputs": [[i, 0, 0] for i in inputs],
            "attrs": {"func_name": func, "num_inputs": str(len(inputs)), "num_outputs": "1",
                      "flatten_data": "0"}}


def dense_graph(out_dim: object = "batch") -> gr.Graph:
    """x (batch, 4) -> relu -> dense with w (3, 4) -> (batch, 3), plus y (batch, 3) added."""
    return gr.Graph.build(
        [{"op": "null", "name": "x"}, {"op": "null", "name": "w"}, {"op": "null", "name": "y"},
         _op("relu0", "relu", [0]), _op("dense0", "dense", [3, 1]), _op("add0", "add", [4, 2])],
        [5], shapes=[["batch", 4], [3, 4], ["batch", 3], ["batch", 4], [out_dim, 3],
                     ["batch", 3]], dtypes="float32")


def _run_dense(m: Any, w: np.ndarray, batch: int) -> None:
    """Run dense_graph's module on random inputs of this batch and check its output."""
    x = RNG.standard_normal((batch, 4)).astype(np.float32)
    y = RNG.standard_normal((batch, 3)).astype(np.float32)
    m.run(x=x, y=y)
    np.testing.assert_allclose(m.get_output(0).numpy(), np.maximum(x, 0) @ w.T + y,
                               rtol=1e-5, atol=1e-6)


def test_dims_parse_and_evaluate() -> None:
    assert evaluate("batch*seq+1", {"batch": 2, "seq": 5}) == 11
    assert names_in("16*seq") == ["seq"]
    assert check_dim("?") is None and check_dim(3) is None
    assert "expected a name" in (check_dim("__import__('os')") or "")
    assert "not allowed" in (check_dim("f(seq)") or "")
    assert check_dim(-1) == "-1 is negative"


def test_shapes_evaluate_at_once_or_not_at_all() -> None:
    """shapes_evaluator gives every shape's tuple in one call, or None where one dim is no int
    for the binding (a zero divisor, a name it lacks), as evaluate_shape would refuse."""
    run = shapes_evaluator([("batch", 2, "past+seq"), (), ("total//heads", 64), (7,)])
    assert run({"batch": 1, "past": 8, "seq": 1, "total": 512, "heads": 8}) == (
        (1, 2, 9), (), (64, 64), (7,))
    assert run({"batch": 1, "past": 8, "seq": 1, "total": 512, "heads": 0}) is None
    assert run({"batch": 1, "past": 8, "seq": 1}) is None


def test_specialises_per_shape_caches_and_shares_params() -> None:
    m = gr.create(dense_graph(), cache_size=2)
    assert isinstance(m, SymbolicGraphModule)
    assert m.signature == "x: (batch, 4) float32; w: (3, 4) float32; y: (batch, 3) float32"
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    for batch in (1, 5, 5, 2, 1):
        _run_dense(m, w, batch)
    # 1, 5, 2 built; 1 again was evicted (cache of 2) and built again
    assert m.specializations == 4
    arrays = {id(mod.executor.arrays[(1, gr.cpu(0))]) for mod in m._cache.values()}
    assert len(arrays) == 1  # one copy of the weight for every specialisation
    outs = m.run_with(x=np.ones((7, 4), np.float32), y=np.zeros((7, 3), np.float32))
    assert outs[0].shape == (7, 3)


def test_cached_shape_does_not_specialise_again() -> None:
    m = gr.create(dense_graph())
    m.load_params({"w": np.ones((3, 4), np.float32)})
    m.run(x=np.ones((2, 4), np.float32), y=np.ones((2, 3), np.float32))
    first = m.specialised()
    m.set_input("x", np.zeros((2, 4), np.float32))
    m.run()
    assert m.specialised() is first and m.specializations == 1
    np.testing.assert_allclose(m.get_output(0).numpy(), np.ones((2, 3)))


def test_run_reads_a_new_shapes_inputs_from_the_callers_arrays_and_keeps_none() -> None:
    """run(**inputs) at a new shape copies each input once, into the specialisation: writing
    the caller's arrays afterwards changes neither get_input nor the next run's answer; a run
    that fails to specialise holds copies, as set_input does, so nothing set is lost."""
    m = gr.create(dense_graph())
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    _run_dense(m, w, 2)
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    y = RNG.standard_normal((5, 3)).astype(np.float32)
    want = np.maximum(x, 0) @ w.T + y
    m.run(x=x, y=y)
    x_set, y_set = x.copy(), y.copy()
    x[...] = 7.0
    y[...] = -7.0
    np.testing.assert_array_equal(m.get_input("x").numpy(), x_set)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=1e-5, atol=1e-6)
    assert not m._lent and not m._held
    bad_x = np.ones((4, 4), np.float32)
    with pytest.raises(GraphError, match="inputs that share a dimension name must agree"):
        m.run(x=bad_x, y=np.ones((6, 3), np.float32))
    assert not m._lent and set(m._held) == {"x", "y"}
    bad_x[...] = 2.0  # the held copy does not see it
    np.testing.assert_array_equal(m._held["x"], np.ones((4, 4), np.float32))
    m.run(y=y_set[:4])  # x's held (4, 4) with a y that agrees
    np.testing.assert_allclose(m.get_output(0).numpy(), np.ones((4, 4)) @ w.T + y_set[:4],
                               rtol=1e-5, atol=1e-6)


def test_a_repeated_shapes_inputs_go_straight_into_the_module_in_use() -> None:
    """run(**inputs) at the last run's shapes copies each input into the specialisation in use
    (_express) and answers as the full way does: the caller's arrays are not kept, a wrong
    dtype or a missing input takes the full way (its error, its held inputs), new params are
    read, and an input left unset before (allow_uninitialized) counts as set."""
    m = gr.create(dense_graph())
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    _run_dense(m, w, 3)
    module = m._current
    for _ in range(3):
        x = RNG.standard_normal((3, 4)).astype(np.float32)
        y = RNG.standard_normal((3, 3)).astype(np.float32)
        assert m._express({"x": x, "y": y}) is module
        out = m.run_with(x=x, y=y)[0]
        np.testing.assert_allclose(out, np.maximum(x, 0) @ w.T + y, rtol=1e-5, atol=1e-6)
        x_set = x.copy()
        x[...] = 7.0
        np.testing.assert_array_equal(m.get_input("x").numpy(), x_set)
        assert m._current is module and m.specializations == 1 and not m._held
    assert m._express({"x": x}) is None  # y missing: the full way keeps y from before
    assert m._express({"x": x.astype(np.float64), "y": y}) is None
    with pytest.raises(GraphError, match="expected dtype float32, got float64"):
        m.run(x=x.astype(np.float64), y=y)
    w2 = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w2})
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(m.run_with(x=x, y=y)[0], np.maximum(x, 0) @ w2.T + y,
                               rtol=1e-5, atol=1e-6)
    loose = gr.create(dense_graph(), allow_uninitialized=True)
    loose.load_params({"w": w})
    loose.run(x=x, y=y)
    loose._current._unset.add(loose._sigs["y"].eid)  # as a module switched to unset would be
    np.testing.assert_allclose(loose.run_with(x=x, y=y)[0], np.maximum(x, 0) @ w.T + y,
                               rtol=1e-5, atol=1e-6)
    assert not loose._current._unset


def test_a_second_sweep_of_160_lengths_meets_every_one_kept() -> None:
    """A decoder's generation meets one new length per token, and the next generation the same
    lengths in the same order: an LRU bound below their count missed every one of them again
    (64 of bench/generate.py's 129), so the default keeps more than a generation holds."""
    m = gr.create(dense_graph())
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    for _ in range(2):
        for batch in range(1, 161):
            _run_dense(m, w, batch)
    assert m.specializations == 160 and len(m._cache) == 160


def test_an_input_of_another_dtype_is_refused_naming_it_and_both_dtypes() -> None:
    """A NumPy array (the per-step case, checked without strings) and a list are refused
    alike, and nothing is set."""
    m = gr.create(dense_graph())
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    for bad in (np.zeros((2, 4), np.float64), [[1, 2, 3, 4]]):
        with pytest.raises(GraphError, match=r"input 'x' \(eid 0\): expected dtype float32, "
                           r"got (float64|int64) \(shape \((2|1), 4\)\)"):
            m.set_input("x", bad)
    with pytest.raises(GraphError, match="never set: x, y"):
        m.run()
    _run_dense(m, w, 2)


def test_unsatisfiable_shapes_name_input_dim_and_node() -> None:
    m = gr.create(dense_graph())
    m.load_params({"w": np.ones((3, 4), np.float32)})
    with pytest.raises(GraphError, match=r"input 'x' \(eid 0\) dim 1: expected 4, got 5"):
        m.run(x=np.ones((2, 5), np.float32), y=np.ones((2, 3), np.float32))
    with pytest.raises(GraphError, match=r"input 'y' dim 0 \('batch'\) is 3 but input 'x' dim 0 "
                                         r"set batch = 2"):
        m.run(x=np.ones((2, 4), np.float32), y=np.ones((3, 3), np.float32))
    bad = gr.create(dense_graph(out_dim="batch+1"))
    bad.load_params({"w": np.ones((3, 4), np.float32)})
    with pytest.raises(GraphError, match=r"node 4 'dense0' \(dense\) cannot take these input "
                                         r"shapes \(batch=2\): output eid 4 dim 0 is 2 but the "
                                         r"graph declares batch\+1 = 3"):
        bad.run(x=np.ones((2, 4), np.float32), y=np.ones((2, 3), np.float32))
    # run() takes the declared shapes without asking the rules (each chain's prepare checks
    # them): dense0's conflict surfaced there and the rules were then asked to name it
    shapes = {"x": (2, 4), "y": (2, 3)}
    assert isinstance(bad, SymbolicGraphModule)
    assert bad.specializer.infer_shapes(shapes, fast=True)[4] == (3, 3)
    good = gr.create(dense_graph())
    assert isinstance(good, SymbolicGraphModule)
    assert good.specializer.infer_shapes(shapes, fast=True) == \
        good.specializer.infer_shapes(shapes)


def test_static_graph_stays_a_graph_module() -> None:
    g = gr.Graph.build([{"op": "null", "name": "x"}, _op("relu0", "relu", [0])], [1],
                       shapes=[[2, 3], [2, 3]], dtypes="float32")
    assert not g.is_symbolic
    assert type(gr.create(g)) is gr.GraphModule


def test_specialisations_share_one_scratch_for_their_intermediates() -> None:
    """A new shape allocates no intermediate storage (storage.Scratch): relu's output lives in
    the same bytes at every batch; outputs and inputs stay each module's own, and a shape come
    back after another overwrote the scratch still runs right."""
    m = gr.create(dense_graph())
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    got = {}
    for batch in (4, 2, 4, 2):
        _run_dense(m, w, batch)
        got[batch] = m.specialised().executor.pool
    assert m.specializations == 2
    relu = [pool.views[3] for pool in got.values()]  # entry 3: relu0's output
    assert np.shares_memory(relu[0], relu[1])
    outs = [pool.views[5] for pool in got.values()]
    assert not np.shares_memory(outs[0], outs[1])


def test_a_new_shape_is_derived_from_the_one_before_where_only_sizes_move() -> None:
    """Executor.derive: batch 4 then 3 (relu's 48 bytes fit the 64 its storage id holds) makes
    the second executor from the first: the intermediate's bytes and the params are the
    first's, inputs and outputs get buffers of their own, the steps write the new views;
    batch 16 outgrows relu's id and is built in full. Every answer is right, also for shapes
    come back."""
    m = gr.create(dense_graph())
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    modules = {}
    for batch in (4, 3, 16, 3, 4):
        _run_dense(m, w, batch)
        modules.setdefault(batch, m.specialised())
        if batch == 3:
            assert "derived from the shape before" in str(m.memory_report().shape)
    assert (m.specializations, m.derivations) == (3, 1)
    first, second = modules[4].executor, modules[3].executor
    assert np.shares_memory(first.pool.views[3], second.pool.views[3])  # relu0's output
    for eid in (0, 2, 5):  # x, y and the output: each module's own
        assert not np.shares_memory(first.pool.views[eid], second.pool.views[eid])
    assert first.arrays[(1, gr.cpu())] is second.arrays[(1, gr.cpu())]  # w: one array
    add = [s for s in second.steps if s.func_name == "add"][0]
    assert add.args[-1] is second.pool.views[5] and add.args[-1].shape == (3, 3)


def test_a_derived_decode_step_keeps_the_last_steps_outputs() -> None:
    """A step made from the one before writes its outputs into buffers of its own: an output
    read zero copy from the module used last (a view, as a KV cache fed back would be) keeps
    its values when the next shape runs."""
    m = gr.create(dense_graph())
    m.load_params({"w": np.ones((3, 4), np.float32)})
    m.run(x=np.ones((4, 4), np.float32), y=np.zeros((4, 3), np.float32))
    kept = m.specialised().executor.arrays[(5, gr.cpu())]
    m.run(x=np.ones((3, 4), np.float32), y=np.full((3, 3), 7, np.float32))
    assert m.derivations == 1
    np.testing.assert_array_equal(kept, np.full((4, 3), 4.0))
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.full((3, 3), 11.0))


FREEZE_SCRIPT = """
import gc, sys
sys.path.insert(0, sys.argv[1])
import graph_runtime as gr
from tests.runtime.test_specialize import dense_graph
before = gc.get_freeze_count()
gr.create(dense_graph())
first = gc.get_freeze_count()
gr.create(dense_graph())
print(before, first > 1000, gc.get_freeze_count() == first)
"""


@pytest.mark.parametrize("word, frozen", [("once", "True"), ("off", "False")])
def test_the_first_symbolic_module_freezes_what_is_alive_once(word: str, frozen: str) -> None:
    """GRAPH_RUNTIME_GC_FREEZE: the libraries' objects leave the collector's full scans (each
    new shape's leftovers bring one on); a second module freezes nothing more."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, settings.GC_FREEZE.name: word}
    out = subprocess.run([sys.executable, "-c", FREEZE_SCRIPT, root], env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout.split()
    assert out == ["0", frozen, "True"]


def test_a_new_onednn_thread_mode_specialises_every_shape_again(monkeypatch) -> None:
    """When oneDNN's thread mode changes (policy.recheck: a neighbour came or went), a shape
    run before is made again, kernels included, and still gives the right answer."""
    from graph_runtime.runtime import module_base
    m = gr.create(dense_graph())
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    y = RNG.standard_normal((2, 3)).astype(np.float32)
    m.run(x=x, y=y)
    prepared = m.kernels.prepared
    monkeypatch.setattr(module_base, "threads_generation", lambda: 1)
    m.run(x=x, y=y)
    assert m.specializations == 2 and m.kernels.prepared > prepared and len(m._cache) == 1
    np.testing.assert_allclose(m.get_output(0).numpy(), np.maximum(x, 0) @ w.T + y, rtol=1e-5,
                               atol=1e-6)
    m.run(x=x, y=y)  # no change since: the cached shape
    assert m.specializations == 2


def test_kept_bytes_count_a_kernel_the_shapes_share_once() -> None:
    # relu over x (batch, 4) beside add-then-sum over fixed (300, 1) + (1, 300) arrays, whose
    # kernel holds a 300 x 300 temp: every batch's specialisation runs the same kernel
    from graph_runtime.lib.loader import module_from_json
    lib = module_from_json({"format": "graph_runtime.lib", "version": 1, "functions": {
        "relu": {"ops": [{"op": "relu"}]}, "addsum": {"ops": [{"op": "add"}, {"op": "sum"}]}}})
    g = gr.Graph.build(
        [{"op": "null", "name": "x"}, {"op": "null", "name": "a"}, {"op": "null", "name": "b"},
         _op("relu0", "relu", [0]), _op("s", "addsum", [1, 2])],
        [3, 4], shapes=[["batch", 4], [300, 1], [1, 300], ["batch", 4], []], dtypes="float32")
    m = gr.create(g, lib)
    a, b = np.ones((300, 1), np.float32), np.ones((1, 300), np.float32)
    for batch in (2, 3, 4):
        m.run(x=np.full((batch, 4), -1.0, np.float32), a=a, b=b)
        assert m.get_output(1).numpy() == 180000.0
    temp = 300 * 300 * 4
    kernels = {id(step.kernel) for mod in m._cache.values() for step in mod.executor.steps
               if step.kernel.workspace_bytes() == temp}
    assert len(m._cache) == 3 and len(kernels) == 1
    assert temp <= m._shape_cost().kept_bytes < 2 * temp
    assert temp <= m.held_bytes()[gr.cpu()] < 2 * temp


def test_a_full_build_stores_each_param_in_the_params_own_array(monkeypatch) -> None:
    # every specialisation built in full (not derived: the first, and each whose storage
    # outgrew the one before) takes the loaded param as its storage id's bytes: no buffer of
    # the param's size is allocated to be dropped, and the answers stay right
    from graph_runtime.runtime import storage
    allocated: list[int] = []
    alloc = storage._alloc
    monkeypatch.setattr(storage, "_alloc", lambda sid, *rest: allocated.append(sid) or
                        alloc(sid, *rest))
    m = gr.create(dense_graph())
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    held = m._params["w"][1]
    for batch in (1, 40, 2):
        _run_dense(m, w, batch)
    for module in m._cache.values():
        sid = module.executor.plan.entry_sid[1]
        assert module.executor.pool.buffers[sid] is held and sid not in allocated
    assert allocated  # the other inputs' and outputs' ids were
    assert m.specializations - m.derivations >= 2  # 40 outgrew 1's storage: built in full
    w2 = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w2})  # a new load is a new array, bound into every kept shape
    for batch in (1, 40, 7):
        _run_dense(m, w2, batch)


def test_kept_bytes_follow_a_shared_kernel_whose_workspace_grows() -> None:
    # one attention kernel serves every length (any shape, one size band), and makes the
    # scores of each length it meets in its runs: a shape made after counts them all
    from graph_runtime.lib.loader import module_from_json
    lib = module_from_json({"format": "graph_runtime.lib", "version": 1, "functions": {
        "att": {"ops": [{"op": "attention", "num_heads": 2, "head_dim": 4}]}}})
    g = gr.Graph.build(
        [{"op": "null", "name": "q"}, {"op": "null", "name": "k"}, {"op": "null", "name": "v"},
         _op("a", "att", [0, 1, 2])],
        [3], shapes=[[1, "seq", 8], [1, "seq", 8], [1, "seq", 8], [1, "seq", 8]],
        dtypes="float32")
    m = gr.create(g, lib)
    kept = []
    for seq in (20, 30, 25):
        q = RNG.standard_normal((1, seq, 8)).astype(np.float32)
        m.run(q=q, k=q, v=q)
        kept.append(m._shape_cost().kept_bytes)
    kernels = {id(mod.executor.steps[0].kernel) for mod in m._cache.values()}
    assert len(kernels) == 1  # the one kernel, in every shape
    scores = 2 * 30 * 30 * 4  # the second length's scores, (1, 2, 30, 30) float32
    assert kept[2] - kept[0] >= scores


def test_clone_shares_params_and_held_bytes_counts_them_once() -> None:
    m = gr.create(dense_graph())
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    other = m.clone()
    assert isinstance(other, SymbolicGraphModule) and other._params["w"][1] is m._params["w"][1]
    for module, batch in ((m, 2), (other, 5), (m, 3)):
        x = RNG.standard_normal((batch, 4)).astype(np.float32)
        y = RNG.standard_normal((batch, 3)).astype(np.float32)
        module.run(x=x, y=y)
        np.testing.assert_allclose(module.get_output(0).numpy(), np.maximum(x, 0) @ w.T + y,
                                   rtol=1e-5, atol=1e-6)
    assert m.specializations == 2 and other.specializations == 1
    # two specialisations (batch 2 and 3), each its pool (w bound zero copy: not its own) and
    # workspace, their intermediates in one shared scratch (counted once: the larger need), the
    # second's inputs and outputs (derived from the first) in the scratch's io bytes;
    # w (3 x 4 float32, 48 B) once
    modules = list(m._cache.values())
    scratch = [mod.executor.pool.scratch_bytes[gr.cpu()] for mod in modules]
    assert len(modules) == 2 and all(mod.memory_report().pool[gr.cpu()] >= 48 for mod in modules)
    first, derived = (mod.executor.pool for mod in modules)
    io = sum(derived.buffers[sid].nbytes for sid in derived.io_ids)
    assert not first.io_ids and io == (3 * 4 + 3 * 3 + 3 * 3) * 4  # x, y and the output
    assert m.scratch.held_bytes() == {gr.cpu(): max(scratch) + io} and min(scratch) > 0
    pools = sum(buffer.nbytes for mod in modules for sid, buffer in
                mod.executor.pool.buffers.items()
                if sid not in mod.executor.pool.scratch_ids | mod.executor.pool.io_ids
                and buffer is not m._params["w"][1])
    # each kernel's workspace once by what counts it: both batches' oneDNN products read one
    # copy of the frozen w (PackedWeight.owner), counted once
    kernels = {id(step.kernel.workspace_owner()): step.kernel.workspace_bytes()
               for mod in modules for step in mod.executor.steps}
    from graph_runtime.lib.kernels.onednn.matmul import OnednnMatmul
    products = [step.kernel for mod in modules for step in mod.executor.steps
                if isinstance(step.kernel, OnednnMatmul) and step.kernel.workspace_bytes()]
    # oneDNN's products (which the choice may give either batch, or neither)
    assert len({id(kernel.workspace_owner()) for kernel in products}) <= 1
    assert m.held_bytes() == {gr.cpu(): pools + sum(kernels.values()) + 48 + max(scratch) + io}
    assert m.get_output_info() == ([("batch", 3)], ["float32"])


def test_share_params_binds_the_other_modules_arrays() -> None:
    from graph_runtime.errors import ParamsError
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    blob = gr.save_param_dict({"w": w})
    first, second = gr.create(dense_graph()), gr.create(dense_graph())
    with pytest.raises(ParamsError, match="'w' is not a param loaded in the other module"):
        second.share_params(first, blob)
    first.load_params(blob)
    second.share_params(first, blob)
    assert second._params["w"][1] is first._params["w"][1]
    x = RNG.standard_normal((4, 4)).astype(np.float32)
    y = np.zeros((4, 3), np.float32)
    np.testing.assert_allclose(second.run_with(x=x, y=y)[0], np.maximum(x, 0) @ w.T,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(GraphError, match="needs a SymbolicGraphModule to share with, got "
                                         "GraphModule"):
        second.share_params(second.specialised(), blob)


def test_a_zero_divisor_in_a_dim_names_the_entry_or_the_dims_that_make_it() -> None:
    with pytest.raises(GraphError, match=r"at \$\.attrs\.shape\[1\]\[4\]: node 4 'dense0' entry "
                                         r"4:0 \(eid 4\): dim 'batch // \(3 - 3\)' divides by "
                                         r"'3 - 3', which is always 0"):
        gr.create(dense_graph(out_dim="batch // (3 - 3)"))
    m = gr.create(dense_graph(out_dim="batch % (batch - 2)"))
    m.load_params({"w": np.ones((3, 4), np.float32)})
    with pytest.raises(GraphError, match=r"node 4 'dense0' \(dense\) cannot take these input "
                                         r"shapes \(batch=2\): output eid 4 dim 0: dim 'batch % "
                                         r"\(batch - 2\)' divides by 'batch - 2', which is 0 for "
                                         r"batch = 2"):
        m.run(x=np.ones((2, 4), np.float32), y=np.ones((2, 3), np.float32))


def _wide_dense() -> gr.Graph:
    """x (batch, 64) -> dense with w (32, 64), and relu of z (3, 4), which no dim changes."""
    return gr.Graph.build(
        [{"op": "null", "name": "x"}, {"op": "null", "name": "w"}, {"op": "null", "name": "z"},
         _op("dense0", "dense", [0, 1]), _op("relu0", "relu", [2])],
        [3, 4], shapes=[["batch", 64], [32, 64], [3, 4], ["batch", 32], [3, 4]],
        dtypes="float32")


@pytest.fixture
def own_tuning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    """A tuning cache of this test's own, a process that remembers nothing, and the keys
    measured meanwhile (the team products' layout, raced once per machine at create, pinned)."""
    from graph_runtime.lib import tuning
    monkeypatch.setenv(settings.TUNING_CACHE.name, str(tmp_path / "tuning"))
    monkeypatch.setenv(settings.TEAM_GEMV_LAYOUT.name, "packed")
    tuning.forget()
    measured: list[str] = []
    real = tuning._measure

    def counted(wanted: tuning.Entry, *args: Any) -> tuning.Entry:
        measured.append(wanted.key)
        return real(wanted, *args)
    monkeypatch.setattr(tuning, "_measure", counted)
    yield measured
    tuning.forget()


def _feed(m: Any, batch: int) -> None:
    m.run(x=np.ones((batch, 64), np.float32), z=-np.ones((3, 4), np.float32))


def test_a_new_shape_measures_nothing_in_run_and_takes_its_size_classes_choice(
        own_tuning: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from graph_runtime.runtime.symbolic_module import tune
    monkeypatch.setenv(settings.SHAPE_TUNING.name, "measure")  # the old way: measured in run()
    m = gr.create(_wide_dense())
    m.load_params({"w": np.ones((32, 64), np.float32)})
    _feed(m, 20)
    assert len(own_tuning) == 1 and "m 20 " in own_tuning[0]
    monkeypatch.delenv(settings.SHAPE_TUNING.name)  # the default: class
    m = gr.create(_wide_dense())
    m.load_params({"w": np.ones((32, 64), np.float32)})
    _feed(m, 40)  # class 64: nothing known, the default kernel
    cost = m.memory_report().shape
    assert cost is not None and cost.new and cost.defaults == 1 and len(own_tuning) == 1
    assert tune(m, [{"x": (60, 64), "z": (3, 4)}]) == 1  # ahead of time, for class 64
    assert len(own_tuning) == 2 and "m 60 " in own_tuning[1]
    _feed(m, 50)
    cost = m.memory_report().shape
    assert cost is not None and cost.new and cost.defaults == 0 and len(own_tuning) == 2
    np.testing.assert_allclose(m.get_output(0).numpy(), np.full((50, 32), 64.0))
    with pytest.raises(GraphError, match="tune: no shape for input 'z'"):
        tune(m, [{"x": (60, 64)}])


def test_a_bare_ufunc_kernel_serves_every_shape_of_its_ranks() -> None:
    """The CPU's binary ops are NumPy's ufuncs themselves (no wrapper a call): they take any
    shape, so a new size class prepares nothing (prepared.capabilities answers for them as for
    AnyShape)."""
    from graph_runtime.lib.prepared import capabilities
    assert capabilities(np.add).any_shape() and capabilities(np.add).shape_free()
    assert not capabilities(lambda a, out: None).any_shape()
    graph = gr.Graph.build(
        [{"op": "null", "name": "x"}, {"op": "null", "name": "y"},
         _op("mul0", "multiply", [0, 1])],
        [2], shapes=[["batch", "seq"], ["batch", "seq"], ["batch", "seq"]], dtypes="float32")
    m = gr.create(graph)
    for shape in ((2, 3), (4, 70), (3, 300), (1, 5)):
        x, y = RNG.standard_normal(shape).astype(np.float32), RNG.standard_normal(shape)
        m.run(x=x, y=y.astype(np.float32))
        np.testing.assert_array_equal(m.get_output(0).numpy(), x * y.astype(np.float32))
    assert m.kernels.prepared == 1


def test_kernels_are_prepared_once_across_shapes_and_dropped_with_them() -> None:
    m = gr.create(_wide_dense(), cache_size=2)
    m.load_params({"w": np.ones((32, 64), np.float32)})
    assert isinstance(m, SymbolicGraphModule)
    _feed(m, 2)
    assert (m.kernels.prepared, m.kernels.reused) == (2, 0)
    _feed(m, 3)  # relu0's shapes are the same: its kernel is taken, dense0's made
    assert (m.kernels.prepared, m.kernels.reused) == (3, 1)
    relu = [s.fn for s in m.specialised().executor.steps if s.label.endswith("'relu0'")]
    _feed(m, 2)  # cached: nothing prepared or taken
    assert (m.kernels.prepared, m.kernels.reused) == (3, 1)
    assert [s.fn for s in m.specialised().executor.steps if s.label.endswith("'relu0'")] == relu
    np.testing.assert_allclose(m.get_output(1).numpy(), np.zeros((3, 4)))
    for batch in (4, 5, 6):  # every older shape evicted: their kernels go with them
        _feed(m, batch)
    assert len(m.kernels.kernels) == 3  # relu0's, and dense0's of batch 5 and 6
    m.load_params({"w": np.full((32, 64), 2, np.float32)})
    assert m.kernels.kernels == {}  # a new weight: kernels deriving from it prepared anew
    _feed(m, 7)
    np.testing.assert_allclose(m.get_output(0).numpy(), np.full((7, 32), 128.0))


def test_derived_shapes_share_their_inputs_and_outputs_bytes_and_lose_no_value() -> None:
    """Shapes derived from another keep their inputs and outputs in the scratch's bytes (no
    new page for a decode step's new length); a shape made current again is given every input
    (z, set once, comes from the shape run before), and specialised() hands out a module with
    bytes of its own, right when run or read after other shapes ran."""
    m = gr.create(_wide_dense())
    m.load_params({"w": np.ones((32, 64), np.float32)})
    z = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    for batch in (3, 2, 1):
        m.run(x=np.full((batch, 64), batch, np.float32), z=z)
    derived = [m._cache[((batch, 64), (32, 64), (3, 4))].executor for batch in (2, 1)]
    assert all(ex.pool.io_ids for ex in derived) and m.derivations == 2
    assert np.shares_memory(derived[0].pool.views[0], derived[1].pool.views[0])  # x
    for batch in (2, 3, 1, 2):
        m.run(x=np.full((batch, 64), 10 * batch, np.float32))
        np.testing.assert_array_equal(m.get_output(0).numpy(), np.full((batch, 32), 640 * batch))
        np.testing.assert_array_equal(m.get_output(1).numpy(), np.maximum(z, 0))
    handed = m.specialised()  # batch 2
    assert not handed.executor.pool.io_ids
    m.run(x=np.full((1, 64), 5, np.float32), z=-z)
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.full((1, 32), 320))
    np.testing.assert_array_equal(handed.get_output(0).numpy(), np.full((2, 32), 1280))
    handed.run()
    np.testing.assert_array_equal(handed.get_output(1).numpy(), np.maximum(z, 0))
    m.run(x=np.full((2, 64), 1, np.float32))  # z: -z, from the shape run last
    np.testing.assert_array_equal(m.get_output(0).numpy(), np.full((2, 32), 64))
    np.testing.assert_array_equal(m.get_output(1).numpy(), np.maximum(-z, 0))


def test_the_bytes_kept_across_shapes_are_bounded_by_the_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # oneDNN's threads in one mode whatever the machine's load: the workers' mode (a busy
    # neighbour) makes the products oneDNN's, whose packed weight each kernel counts its own
    monkeypatch.setenv(settings.ONEDNN_THREADS.name, "openmp")
    m = gr.create(_wide_dense())
    m.load_params({"w": np.ones((32, 64), np.float32)})
    for batch in (3, 2, 1):  # the oldest the largest: dropping it leaves room for two
        _feed(m, batch)
    cost = m.memory_report().shape
    assert cost is not None and cost.kept_shapes == 3 and cost.kept_bytes > 0
    # a bound a byte below: the oldest shape goes, the one built in full, whose inputs and
    # outputs were its own; those derived from it keep theirs in the shared scratch, and their
    # intermediates: no byte each
    monkeypatch.setenv(settings.SHAPE_CACHE_BYTES.name, str(cost.kept_bytes - 1))
    _feed(m, 4)
    cost = m.memory_report().shape
    assert cost is not None and cost.kept_shapes == 3 and cost.kept_bytes == 0
    assert ((3, 64), (32, 64), (3, 4)) not in m._cache
    monkeypatch.setenv(settings.SHAPE_CACHE_BYTES.name, "0")
    _feed(m, 5)  # derived too: no byte of its own, nothing to drop
    assert len(m._cache) == 4 and m.memory_report().shape.kept_bytes == 0
    _feed(m, 40)  # built in full (it outgrows the bytes the others share): it stays alone
    assert len(m._cache) == 1 and m.memory_report().shape.kept_bytes > 0
    np.testing.assert_allclose(m.get_output(0).numpy(), np.full((40, 32), 64.0))
    _feed(m, 5)
    np.testing.assert_allclose(m.get_output(0).numpy(), np.full((5, 32), 64.0))
    monkeypatch.setenv(settings.SHAPE_CACHE_BYTES.name, "lots")
    with pytest.raises(LibraryError, match="GRAPH_RUNTIME_SHAPE_CACHE_BYTES must be a "
                                           "non-negative integer, got 'lots'"):
        _feed(m, 6)


def test_profile_and_memory_report_say_when_a_shape_was_new_and_its_cost() -> None:
    m = gr.create(_wide_dense())
    m.load_params({"w": np.ones((32, 64), np.float32)})
    m.set_input(x=np.ones((8, 64), np.float32), z=np.ones((3, 4), np.float32))
    rows = m.profile()
    assert [r.label for r in rows[:3]] == [f"specialise (batch=8): {what}" for what in
                                           ("infer shapes", "plan storage", "prepare kernels")]
    assert all(r.func_name == "__specialise" and r.nid == -1 for r in rows[:3])
    assert rows[3].func_name != "__specialise"
    cost = m.memory_report().shape
    assert cost is not None and cost.new and cost.shape == "batch=8"
    assert cost.seconds == cost.infer_s + cost.plan_s + cost.prepare_s > 0
    assert "shape batch=8: new, specialised in" in str(m.memory_report())
    m.run()
    again = m.memory_report().shape
    assert again is not None and not again.new and again.seconds == cost.seconds
    assert "shape batch=8: kept from an earlier run (specialised in" in str(m.memory_report())
    assert "; 1 shape kept in" in str(m.memory_report())
    static = gr.create(gr.Graph.build([{"op": "null", "name": "x"}, _op("relu0", "relu", [0])],
                                      [1], shapes=[[2], [2]], dtypes="float32"))
    static.run(x=np.ones(2, np.float32))
    assert static.memory_report().shape is None


def test_a_param_written_through_its_view_reaches_every_shape() -> None:
    # params are counted as written once (their packed forms shared across shapes) until a
    # view of one is handed out: then every specialisation derives from it again each run
    m = gr.create(_wide_dense())
    m.load_params({"w": np.ones((32, 64), np.float32)})
    for batch in (2, 3):
        _feed(m, batch)
        np.testing.assert_allclose(m.get_output(0).numpy(), np.full((batch, 32), 64.0))
    m.get_input("w").copyfrom(np.full((32, 64), 2, np.float32))
    for batch in (3, 2, 4):
        _feed(m, batch)
        np.testing.assert_allclose(m.get_output(0).numpy(), np.full((batch, 32), 128.0))
    m.load_params({"w": np.full((32, 64), 3, np.float32)})  # a new array, counted again
    for batch in (4, 2):
        _feed(m, batch)
        np.testing.assert_allclose(m.get_output(0).numpy(), np.full((batch, 32), 192.0))


def _changed_nodes(before: gr.Graph, after: gr.Graph, lib: Any) -> int:
    """Kernel nodes whose input or output shapes differ between two specialisations, or whose
    attrs read symbolic dims that differ."""
    from graph_runtime.lib.symbolic_chain import DIMS_KEY
    count = 0
    for node in before.nodes:
        if node.is_arg:
            continue
        eids = [before.entry_id(r[0], r[1]) for r in node.inputs]
        eids += list(before.node_entries(node.nid))
        read = lib.get_function(node.func_name, gr.cpu()).names if DIMS_KEY in node.attrs else []
        dims = any(node.attrs[DIMS_KEY][n] != after.nodes[node.nid].attrs[DIMS_KEY][n]
                   for n in read)
        count += dims or any(before.shape(e) != after.shape(e) for e in eids)
    return count


def test_greedy_decoding_with_a_kv_cache_matches_onnxruntime_and_prepares_only_what_changes(
        monkeypatch) -> None:
    """Issue 32's text generation on the tiny KV-cache LLaMA: every step is a new past length;
    each step's logits and cache match ONNX Runtime's (and again, every length kept), and a new
    step prepares no more kernels than it has nodes whose shapes changed (the rest are the
    kernels of the step before).
    Within a size class of lengths a step prepares no kernel and asks the cache for none: its
    concatenations, attention and mask chains keep the step before's."""
    from graph_runtime.runtime.executor import Executor
    asked: list[int] = []
    node_kernel = Executor._node_kernel

    def counted(self, lib, node, *args):  # type: ignore[no-untyped-def]
        asked.append(node.nid)
        return node_kernel(self, lib, node, *args)
    monkeypatch.setattr(Executor, "_node_kernel", counted)
    m, session, names = _tiny_kv()
    assert isinstance(m, SymbolicGraphModule)
    pasts = [n for n in names if n.startswith("past_key_values.")]
    kv = next(i for i in session.get_inputs() if i.name in pasts)
    prompt = RNG.integers(0, 100, (1, 6)).astype(np.int64)
    feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt),
             "position_ids": np.arange(6, dtype=np.int64)[None]}
    feeds.update({n: np.zeros((1, kv.shape[1], 0, kv.shape[3]), np.float32) for n in pasts})
    before: gr.Graph | None = None
    derived: list[int] = []
    steps: list[tuple[dict, list]] = []
    for k in range(20):
        want = session.run(None, feeds)
        steps.append((feeds, want))
        prepared = m.kernels.prepared
        asked.clear()
        m.run(**feeds)
        got = [m.get_output(i).numpy() for i in range(len(want))]
        for i, expected in enumerate(want):
            np.testing.assert_allclose(got[i], expected, rtol=1e-4, atol=1e-5,
                                       err_msg=f"step {k} output {i}")
        graph = m.specialised().graph
        if k == 0:  # the layers' nodes calling one function at the same shapes share a kernel
            assert m.kernels.prepared < sum(1 for n in graph.nodes if not n.is_arg)
        if k >= 2:  # decode steps after the first (prefill and the first step share no shapes)
            assert before is not None
            assert m.kernels.prepared - prepared <= _changed_nodes(before, graph, m.lib), k
        length = feeds["attention_mask"].shape[1]
        if k >= 2 and SMALL_DIM < length - 1 and class_shape((length,)) == class_shape((length - 1,)):
            # within a size class of lengths nothing is prepared again: reshapes, broadcasts,
            # compiled chains, the mask's gather (a function of its own, reading its extent per
            # call) and the past and total lengths as data (dim_values reading the inputs'
            # shapes) read their arrays' shapes; nothing asks the cache either
            assert m.kernels.prepared == prepared, k
            assert not asked, k
        derived.append(m.derivations)
        before = graph
        token = int(np.argmax(got[0][0, -1]))
        assert token == int(np.argmax(want[0][0, -1]))
        total = feeds["attention_mask"].shape[1] + 1
        feeds = {"input_ids": np.array([[token]], np.int64),
                 "attention_mask": np.ones((1, total), np.int64),
                 "position_ids": np.array([[total - 1]], np.int64), **dict(zip(pasts, got[1:]))}
    assert m.specializations == 20
    assert derived == list(range(20))  # each step made from the one before (Executor.derive)
    # the same generation again, every length kept: shapes derived earlier, their inputs and
    # outputs in bytes the shapes share (some in a scratch buffer grown since), run again
    for k, (feeds, want) in enumerate(steps):
        for i, got_i in enumerate(m.run_with(**feeds)):
            np.testing.assert_allclose(got_i, want[i], rtol=1e-4, atol=1e-5,
                                       err_msg=f"again: step {k} output {i}")
    assert m.specializations == 20


def _tiny_kv() -> tuple[Any, Any, list[str]]:
    """The tiny KV-cache LLaMA's module (imported once) and ONNX Runtime's session on it."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from graph_runtime.frontend.importer import import_onnx
    path = Path(__file__).resolve().parents[1] / "data" / "onnx" / "llama_tiny_kv_ts.onnx"
    result = import_onnx(path)
    m = gr.create(result.graph_json, result.module())
    m.load_params(result.params)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return m, session, [i.name for i in session.get_inputs()]


def _generate(step: Any, session: Any, names: list[str], tokens: int,
              prompt: np.ndarray) -> list[tuple[dict, list]]:
    """Greedy generation through step (run_with's way), each step's outputs checked against
    ONNX Runtime's; the (feeds, outputs) of every step."""
    pasts = [n for n in names if n.startswith("past_key_values.")]
    kv = next(i for i in session.get_inputs() if i.name in pasts)
    feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt),
             "position_ids": np.arange(prompt.shape[1], dtype=np.int64)[None]}
    feeds.update({n: np.zeros((1, kv.shape[1], 0, kv.shape[3]), np.float32) for n in pasts})
    steps = []
    for k in range(tokens):
        want = session.run(None, feeds)
        got = step(feeds)
        for i, expected in enumerate(want):
            np.testing.assert_allclose(got[i], expected, rtol=1e-4, atol=1e-5,
                                       err_msg=f"step {k} output {i}")
        steps.append((feeds, want))
        token = int(np.argmax(want[0][0, -1]))
        total = feeds["attention_mask"].shape[1] + 1
        feeds = {"input_ids": np.array([[token]], np.int64),
                 "attention_mask": np.ones((1, total), np.int64),
                 "position_ids": np.array([[total - 1]], np.int64), **dict(zip(pasts, got[1:]))}
    return steps


def test_a_derived_decode_step_replays_the_steps_it_keeps_at_its_first_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Executor.derive at a past length where one kernel no longer serves (the attention's,
    here refusing length 33 as a kernel whose tuning picks another there would: made again):
    the steps it keeps (the products, the norms) keep their recordings, so its first run
    replays them (NativeRuns.adopt) instead of calling every step plainly and recording all
    of them at the next; each step matches ONNX Runtime."""
    from graph_runtime.lib.ops.attention import AttentionByShape
    serves = AttentionByShape.serves

    def refusing_33(self: AttentionByShape, shapes: Any) -> bool:
        return shapes[1][-2] != 33 and serves(self, shapes)
    monkeypatch.setattr(AttentionByShape, "serves", refusing_33)
    m, session, names = _tiny_kv()
    first_runs: list[int] = []  # per derived step: the steps its first run replayed
    steady: list[int] = []  # per re-pointed step: the steps replayed
    made_anew: list[int] = []  # per derived step: its steps not shared with the one before

    def step(feeds: dict) -> list:
        before, base = m.derivations, m._current
        out = m.run_with(**feeds)
        native = m._current.executor.native
        assert native is not None, m._current.executor.native_reason
        if m.derivations > before:
            first_runs.append(native.replayed)
            kept = {id(s) for s in base.executor.steps}
            made_anew.append(sum(id(s) not in kept for s in native.steps))
        else:
            steady.append(native.replayed)
        return out
    # past lengths 12-41: the first decode step derived from the prompt's, re-pointed after,
    # derived again at 33 (the attention refusing it), re-pointed after
    prompt = RNG.integers(0, 100, (1, 12)).astype(np.int64)
    _generate(step, session, names, 30, prompt)
    assert len(first_runs) == 2, first_runs
    # every step kept is replayed at once; those made anew (the attention's) are recorded at
    # the next run
    assert steady[-1] > 0 and made_anew[-1] < steady[-1], (first_runs, steady, made_anew)
    assert first_runs[-1] >= steady[-1] - made_anew[-1], (first_runs, steady, made_anew)


def test_a_decode_step_past_a_size_class_is_re_pointed_its_kernels_kept_there_too() -> None:
    """Past lengths crossing size classes (16 -> 17, 32 -> 33): the mask chains' kernels,
    kept by their arrays' band, serve the next class as well, so each new length is re-pointed
    (Executor.retarget), never derived, and they are kept under that class's key too, counted
    as the module's (released with it): a generation meeting those lengths again derives
    nothing either. Each step matches ONNX Runtime."""
    m, session, names = _tiny_kv()
    kinds: list[str] = []

    def step(feeds: dict) -> list:
        derived, retargets = m.derivations, m.retargets
        out = m.run_with(**feeds)
        kinds.append("derived" if m.derivations > derived else
                     "re-pointed" if m.retargets > retargets else "met")
        return out
    prompt = RNG.integers(0, 100, (1, 12)).astype(np.int64)
    _generate(step, session, names, 30, prompt)  # past lengths 12-41
    # the prompt, then its first decode step derived from it, then every length re-pointed
    assert kinds[1] == "derived" and set(kinds[2:]) == {"re-pointed"}, kinds
    banded = [key for key in m.kernels.kernels if key[0] == "band"]
    assert len({id(m.kernels.kernels[k]) for k in banded}) < len(banded)  # kept twice
    # each key counted as the module's that uses it: released with it
    held = {key for keys in m._kernel_keys.values() for key in keys}
    assert set(banded) <= held and all(m.kernels.users[key] > 0 for key in banded)
    kinds.clear()
    _generate(step, session, names, 30, prompt)
    assert "derived" not in kinds[1:], kinds


def test_a_decode_steps_attention_and_kv_steps_stay_in_its_replay_at_new_lengths() -> None:
    """At each new past length (the module re-pointed in place), the attention and KV append
    steps, whose arrays are new views, follow them (their sites' blocks rewritten:
    cpu/block_site.py): the replays recorded at the length before run on, none recorded
    again, those steps inside them; each step matches ONNX Runtime."""
    m, session, names = _tiny_kv()
    seen: list[tuple[int, tuple]] = []  # per re-pointed step: steps replayed, its replays

    def step(feeds: dict) -> list:
        before = m.retargets
        out = m.run_with(**feeds)
        native = m._current.executor.native
        if m.retargets > before and native is not None:
            seen.append((native.replayed, tuple(native.replays)))
            labels = [s.label for r in native.replays for s in r.steps]
            for kind in ("fused_kv_append", "fused_attention"):
                assert any(kind in label for label in labels), (kind, labels)
        return out
    prompt = RNG.integers(0, 100, (1, 18)).astype(np.int64)  # lengths 19-30: one size class
    _generate(step, session, names, 12, prompt)
    assert len(seen) >= 6, seen
    # after the first re-pointed length (recorded), the same replays at every new length
    steady = seen[2:]
    assert all(r == steady[0][1] and n == steady[0][0] for n, r in steady), seen


def test_a_decode_step_re_points_the_module_used_last_in_place() -> None:
    """Executor.retarget: after the prompt (built) and the first decode step (derived), every
    new length makes the module used last over its sizes in place, kept under the new key,
    and no module is made; each step matches ONNX Runtime. The next generation meets those
    lengths again: the module is put back at each (Executor.restore), nothing inferred or
    re-pointed anew, and the prompt's module, which shares steps with the first derived one,
    still answers right. memory_report says which shape was re-pointed and what it cost."""
    m, session, names = _tiny_kv()
    prompt = RNG.integers(0, 100, (1, 18)).astype(np.int64)  # lengths 19-30: one size class
    steps = _generate(lambda feeds: m.run_with(**feeds), session, names, 12, prompt)
    # the prompt built, one or two steps derived (a kernel made for the prompt's length), then
    # every length re-pointed: one module per shape made, none per re-pointed length
    assert m.specializations + m.retargets == 12 and m.retargets >= 9
    assert len(m._cache) == m.specializations
    made = (m.specializations, m.derivations, m.retargets)
    report = str(m.memory_report())
    assert "new, the shape before's module re-pointed in place, specialised in" in report
    family = m.specialised.__self__._current
    for k, (feeds, want) in enumerate(steps):  # every length again, from the same module
        for i, got in enumerate(m.run_with(**feeds)):
            np.testing.assert_allclose(got, want[i], rtol=1e-4, atol=1e-5,
                                       err_msg=f"again: step {k} output {i}")
        if k >= 2:
            assert m._current is family and not m.memory_report().shape.new
    assert (m.specializations, m.derivations, m.retargets) == made
    feeds, want = steps[-1]  # one length further: profile says what re-pointing it cost
    total = feeds["attention_mask"].shape[1] + 1
    pasts = [n for n in names if n.startswith("past_key_values.")]
    m.set_input(input_ids=np.array([[int(np.argmax(want[0][0, -1]))]], np.int64),
                attention_mask=np.ones((1, total), np.int64),
                position_ids=np.array([[total - 1]], np.int64), **dict(zip(pasts, want[1:])))
    rows = m.profile(repeat=1)
    assert [r.label.split(": ")[1] for r in rows[:3]] == ["infer shapes", "plan storage",
                                                         "re-point kernels"]
    assert m.retargets == made[2] + 1 and rows[3].nid >= 0


def test_a_decode_steps_checks_settled_by_rank_are_asked_once(monkeypatch) -> None:
    """Executor.retarget asks a kept kernel whether it serves a new length once per step
    where the answer holds at every length (kept by ranks, any shape, the base class's serves,
    no values and no dims read but those deciding its shapes: _settles_by_rank); the others
    (chains, attention) are asked at each length, so a length crossing a size class (64 to
    65) is asked of the mask's chains too, which serve it (re-pointed, not derived), and
    every step matches ONNX Runtime."""
    from graph_runtime.runtime import executor as executor_module
    m, session, names = _tiny_kv()
    asked: list[list[int]] = []
    serves = executor_module.Executor._kernel_serves

    def counted(self: Any, lib: Any, key: tuple, kept: Any, *rest: Any) -> bool:
        asked[-1].append(kept.nid)
        return serves(self, lib, key, kept, *rest)

    def step(feeds: dict) -> list:
        asked.append([])
        return m.run_with(**feeds)

    monkeypatch.setattr(executor_module.Executor, "_kernel_serves", counted)
    prompt = RNG.integers(0, 100, (1, 58)).astype(np.int64)  # lengths 59-70: past 64 to 65
    _generate(step, session, names, 12, prompt)
    assert m.retargets >= 10 and m.derivations == 1  # (the first decode step's alone)
    family = m._current.executor
    settled = {family.steps[index].nid for index, _ in family._settled}
    assert settled and all(
        family._settles_by_rank(m.lib, key, family.steps[index],
                                family.graph.nodes[family.steps[index].nid])
        for index, key in family._settled)
    # the dims a settled node reads decide its shapes alone: its binding is worked out anew
    # when asked, never kept from a length before
    assert all(family.steps[index].nid not in family._bindings for index, _ in family._settled)
    # the last lengths re-pointed in place ask the others alone, each once
    last = asked[-1]
    assert last and settled.isdisjoint(last) and len(last) == len(set(last))
    # and re-pointing takes nothing from the shared cache: its list of the keys a module being
    # made uses does not grow with every length (the same generation again, two tokens
    # further: lengths met put back, then two new ones re-pointed, no module made)
    taken, made, retargets = list(m.kernels.taken), m.specializations, m.retargets
    _generate(step, session, names, 14, prompt)
    assert m.specializations == made and m.retargets == retargets + 2
    assert m.kernels.taken == taken


def test_later_generations_over_grown_bytes_bind_only_what_moved(monkeypatch) -> None:
    """A generation from a short prompt grows the shared input and output bytes several
    times (and derives a module or two), so the shapes met early keep views of bytes since
    replaced. The next generation puts each back (Executor.restore): those views are made
    again and only their arguments bound again; the one after binds nothing. Every answer
    matches the first generation's (which matched ONNX Runtime's)."""
    m, session, names = _tiny_kv()
    prompt = RNG.integers(0, 100, (1, 3)).astype(np.int64)
    steps = _generate(lambda feeds: m.run_with(**feeds), session, names, 30, prompt)
    assert m.retargets > 0
    binds: list[int] = []
    bind = Executor._bind

    def counted(self: Executor, key: Any) -> Any:
        binds.append(key.eid)
        return bind(self, key)
    monkeypatch.setattr(Executor, "_bind", counted)
    counts = []
    for generation in ("second", "third"):
        binds.clear()
        for k, (feeds, want) in enumerate(steps[1:], 1):  # the prompt's module is derived
            for i, got in enumerate(m.run_with(**feeds)):
                np.testing.assert_allclose(got, want[i], rtol=1e-4, atol=1e-5,
                                           err_msg=f"{generation}: step {k} output {i}")
        counts.append(len(binds))
    moving = len(m._current.executor._moving_keys)
    assert counts[1] == 0
    # 335 of 17 x 29: every length is on one module (its size classes' crossings re-pointed),
    # a length met before its bytes grew binding its moving keys again, most of them the KV
    # cache's (35 moving keys before the mask's prims were one index_expr); 395 of 35 x 29
    # then, 180 when lengths 4-16 each derived a module (put back as made), 525 of 35 x 15
    # before restore bound only what moved
    assert 0 < counts[0] < moving * (len(steps) - 1) * 3 // 4


def test_later_generations_take_their_blocks_back_and_look_at_the_moving_steps_alone(
        monkeypatch) -> None:
    """A server's next generations: each length put back (Executor.restore) hands the
    attention and KV append steps the views they ran with there, and their sites take back
    the blocks written for them (BlockSite.follow) instead of reading each array again: by
    the third generation no site reads an array. restore tells the replay that only the
    steps holding moving entries moved (not every step: each would be compared). Every
    answer matches the first generation's (which matched ONNX Runtime's)."""
    from graph_runtime.lib.kernels.cpu.block_site import BlockSite
    from graph_runtime.runtime.native_runs import NativeRuns
    m, session, names = _tiny_kv()
    prompt = RNG.integers(0, 100, (1, 3)).astype(np.int64)
    steps = _generate(lambda feeds: m.run_with(**feeds), session, names, 30, prompt)
    fills: list[int] = []  # per array read: the step of the generation
    told: list[Any] = []
    at = [0]
    fill, invalidate = BlockSite._fill, NativeRuns.invalidate

    def counted_fill(self: BlockSite, args: Any) -> bool:
        fills.append(at[0])
        return fill(self, args)

    def noted(self: NativeRuns, which: Any = None) -> None:
        told.append(None if which is None else sorted(which))
        invalidate(self, which)
    monkeypatch.setattr(BlockSite, "_fill", counted_fill)
    monkeypatch.setattr(NativeRuns, "invalidate", noted)
    counts = []
    for generation in ("second", "third"):
        fills.clear()
        for k, (feeds, want) in enumerate(steps[1:], 1):  # the prompt's module is derived
            at[0] = k
            for i, got in enumerate(m.run_with(**feeds)):
                np.testing.assert_allclose(got, want[i], rtol=1e-4, atol=1e-5,
                                           err_msg=f"{generation}: step {k} output {i}")
        counts.append(sorted(set(fills)))
    # the second meets bytes grown since (those lengths' views made again); the third none
    assert len(counts[0]) > 5 and counts[1] == [], counts
    family = m._current.executor
    native = family.native
    assert native is not None and native.replayed > 0
    moving = [family._call_index[i] for i in family._moving_steps if i in family._call_index]
    assert told and None not in told[-5:] and told[-1] == sorted(moving)
    labels = {family.steps[i].label for i in family._moving_steps}
    assert any("kv_append" in label for label in labels)
    assert any("attention" in label for label in labels)


def test_a_module_handed_out_keeps_its_shape_while_others_are_re_pointed() -> None:
    """specialised() hands out the module of the shape set now, its inputs and outputs its
    own: later lengths are never made over it in place (a new module is derived from it, and
    that one is re-pointed), and it still runs its own shape right."""
    m, session, names = _tiny_kv()
    prompt = RNG.integers(0, 100, (1, 18)).astype(np.int64)
    handed: list[Any] = []

    def step(feeds: dict) -> list[np.ndarray]:
        outputs = m.run_with(**feeds)
        if feeds["attention_mask"].shape[1] == 24:
            assert m.retargets > 0  # the module used last was re-pointed to this length
            handed.append((m.specialised(), feeds, outputs, m.derivations))
        return outputs
    _generate(step, session, names, 12, prompt)
    module, feeds, outputs, derived = handed[0]
    assert not module.executor.pool.io_ids and m._current is not module
    assert module.executor.graph.shape(module._output_eids[1])[2] == 24
    assert m.derivations == derived + 1  # the next length: derived from the handed-out module
    module.run_with(**feeds)
    for i, want in enumerate(outputs):
        np.testing.assert_allclose(module.get_output(i).numpy(), want, rtol=1e-5, atol=1e-6)


def test_fast_inference_infers_again_only_what_moved_dims_reach() -> None:
    """Specializer.infer_shapes(fast=True) after another fast call keeps the shapes of nodes
    whose inputs and dims did not move (the same tuples) and gives what a full inference gives
    for every entry, through decode steps, a new batch and a new prompt length."""
    pytest.importorskip("onnx")
    from graph_runtime.frontend.importer import import_onnx
    path = Path(__file__).resolve().parents[1] / "data" / "onnx" / "llama_tiny_kv_ts.onnx"
    result = import_onnx(path)
    m = gr.create(result.graph_json, result.module())
    assert isinstance(m, SymbolicGraphModule)
    spec = m.specializer
    kv = next(s.shape for s in spec.inputs if s.name.startswith("past_key_values."))

    def shapes(batch: int, seq: int, past: int) -> dict[str, tuple[int, ...]]:
        out = {"input_ids": (batch, seq), "attention_mask": (batch, past + seq),
               "position_ids": (batch, seq)}
        out.update({s.name: (batch, kv[1], past, kv[3]) for s in spec.inputs
                    if s.name.startswith("past_key_values.")})
        return out
    before = None
    at_once = spec._at_once
    batched: list[bool | None] = []
    spec._at_once = lambda *args: batched.append(at_once(*args)) or batched[-1]  # type: ignore
    for batch, seq, past in [(1, 6, 0), (1, 1, 6), (1, 1, 7), (1, 1, 8), (2, 1, 8), (2, 5, 0),
                             (2, 5, 0), (1, 1, 9)]:
        fast = spec.infer_shapes(shapes(batch, seq, past), fast=True)
        assert fast == spec.infer_shapes(shapes(batch, seq, past)), (batch, seq, past)
        if before is not None and (batch, seq) == (1, 1) and past in (7, 8):
            kept = [e for e, shape in enumerate(fast) if shape is before[e]]
            moved = [e for e, shape in enumerate(fast) if shape != before[e]]
            assert kept and moved and len(kept) + len(moved) == len(fast)
        before = fast
    # the decode steps' same move again took every moved shape in one evaluation (_batch:
    # each node asked is a chain taking its declared shapes)
    assert batched and batched[0] is True and spec._replay[3] is not None


def test_fast_inference_asks_again_a_node_only_a_changed_output_reaches() -> None:
    """The same move again (batch 3 -> 4 after 2 -> 3) asks the nodes the last one asked, in
    turn; where an output changes whose readers are not among them (kept here: only those the
    moved dim and inputs reach directly), the worklist asks again, and the shapes are right."""
    g = gr.Graph.build(
        [{"op": "null", "name": "x"}, {"op": "null", "name": "y"}, _op("relu0", "relu", [0]),
         _op("relu1", "relu", [2]), _op("add0", "add", [3, 1])],
        [4], shapes=[["batch", 4], ["batch", 4], ["?", 4], ["?", 4], ["batch", 4]],
        dtypes="float32")
    spec = gr.create(g).specializer

    def shapes(batch: int) -> dict[str, tuple[int, ...]]:
        return {"x": (batch, 4), "y": (batch, 4)}
    for batch in (2, 3, 4):
        assert spec.infer_shapes(shapes(batch), fast=True) == spec.infer_shapes(shapes(batch))
    pattern, asked, _, batch = spec._replay
    assert batch is None  # shapes "?": each node asks its rule
    readers, by_name, always = spec._worklist_index()
    first = set(always).union(*(by_name.get(n, ()) for n in pattern[0]),
                              *(readers.get(e, ()) for e in pattern[1]))
    assert first < set(asked)  # relu1: only relu0's changed output reaches it
    spec._replay = (pattern, sorted(first), frozenset(first), None)
    assert spec.infer_shapes(shapes(5), fast=True) == spec.infer_shapes(shapes(5))
    assert spec._replay[1] == asked
    assert spec.infer_shapes(shapes(6), fast=True)[3] == (6, 4)


def test_a_symbolic_chain_keeps_the_chains_of_the_bindings_met_last() -> None:
    # one chain per binding of the dims its attrs read, a bounded number kept: a decoder's
    # reshape by past+seq meets a new binding every step of a long generation
    from graph_runtime.lib.loader import function_from_json
    from graph_runtime.lib.symbolic_chain import CHAINS_KEPT, DIMS_KEY, SymbolicChain
    entries = [{"op": "reshape", "newshape": [{"dim": "batch"}, {"dim": "seq*4"}]}]
    fn = SymbolicChain("r", entries, lambda name, doc: function_from_json(name, doc, "r"))
    first = fn.concrete({DIMS_KEY: {"batch": 1, "seq": 1, "past": 0}})
    assert fn.concrete({DIMS_KEY: {"batch": 1, "seq": 1, "past": 9}}) is first  # past unread
    for seq in range(2, CHAINS_KEPT + 10):
        fn.concrete({DIMS_KEY: {"batch": 1, "seq": seq}})
    assert len(fn._chains._entries) == CHAINS_KEPT
    assert fn.concrete({DIMS_KEY: {"batch": 1, "seq": 1}}) is not first  # dropped, made again


def test_a_dense_in_pieces_serves_every_row_band_where_its_choice_holds(
        own_tuning: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A symbolic module's dense on oneDNN takes any rows over SMALL_DIM (in pieces): a shape of
    another size class takes the kernel prepared before, unprepared; a class whose tuning
    choice picks another kernel gets that one, kept apart."""
    from graph_runtime.lib import tuning
    from graph_runtime.lib.kernels.cpu import dense_choice
    from graph_runtime.lib.kernels.onednn.matmul import OnednnMatmul
    from tests.support import require_onednn
    require_onednn()
    monkeypatch.setenv(settings.ONEDNN_THREADS.name, "openmp")  # pieces on OpenMP threads
    m = gr.create(_wide_dense())
    m.load_params({"w": np.ones((32, 64), np.float32)})

    def dense_kernel() -> Any:
        return next(s.fn for s in m.specialised().executor.steps
                    if s.label.endswith("'dense0'"))
    _feed(m, 40)
    first = dense_kernel()
    assert isinstance(first, OnednnMatmul) and first.in_pieces
    prepared = m.kernels.prepared
    for batch in (300, 17, 40):  # classes 512 and 17, then the first again (cached)
        _feed(m, batch)
        assert dense_kernel() is first and m.kernels.prepared == prepared
        np.testing.assert_allclose(m.get_output(0).numpy(), np.full((batch, 32), 64.0))
    # class 2048's choice, as tune() would have measured it: another candidate
    spec = dense_choice.DenseSpec(1, 1500, 32, 64, False, True, 1, 1, "float32",
                                  ((1500, 64), (32, 64), (1500, 32)), lambda: None)
    offered = dense_choice.offered(spec)
    other = next(n for n in offered if not n.startswith("onednn"))
    entry = tuning.Entry("cpu.gemm", "cpu", spec.key(), tuning.cpu_model(),
                         tuning.num_threads(), other, {n: 1e-3 for n in offered}, "",
                         base=other)
    monkeypatch.setitem(tuning._memo, entry.ident, entry)
    _feed(m, 1500)
    assert not isinstance(dense_kernel(), OnednnMatmul) and m.kernels.prepared == prepared + 1
    np.testing.assert_allclose(m.get_output(0).numpy(), np.full((1500, 32), 64.0))
    _feed(m, 300)  # the band's kernel still serves its own
    assert dense_kernel() is first


def test_a_module_with_symbolic_dims_decides_the_team_layout_at_create(monkeypatch,
                                                                     tmp_path) -> None:
    """The team products' weight layout (team_gemv.LAYOUT, raced once per machine) is decided
    when a module meeting new shapes is created, never inside its runs: the decoder's
    generation races nothing, and its products read weights as the race said."""
    from support import layout_races  # (not at the top: subprocesses here import this file)

    from graph_runtime.lib import tuning
    from graph_runtime.lib.kernels.cpu import omp_team, team_gemv
    monkeypatch.setenv(settings.TUNING_CACHE.name, str(tmp_path))
    monkeypatch.setenv(settings.TEAM_GEMV_LAYOUT.name, "auto")
    tuning.forget()
    if not omp_team.available():
        pytest.skip("the team runs only while oneDNN's products run on OpenMP threads")
    raced = layout_races(monkeypatch)
    # the race's answer is what a module streaming its weights takes: this tiny decoder's storage
    # would otherwise fit in the cache and read them as given (test_team_gemv.py)
    monkeypatch.setattr(team_gemv, "last_level_cache_bytes", lambda: 0)
    try:
        m, session, names = _tiny_kv()
        assert len(raced) == 1
        prompt = RNG.integers(0, 100, (1, 18)).astype(np.int64)
        _generate(lambda feeds: m.run_with(**feeds), session, names, 4, prompt)
        assert len(raced) == 1
        teams = [step.kernel for step in m._current.executor.steps
                 if isinstance(step.kernel, team_gemv.TeamGemv)]
        assert teams and all(k.packs == (raced[0] == "packed") and not k.cached
                             for k in teams)
    finally:
        tuning.forget()


def test_a_kernel_nothing_in_which_depends_on_sizes_serves_every_size_class() -> None:
    """A shape-free kernel (PreparedKernel.shape_free: a NumPy scan reading its arrays' shapes at
    each call) is kept by its arrays' ranks: batch 2, 300 and 40 (three size classes) run the
    kernel prepared at batch 2, each answer right."""
    from graph_runtime.lib.prepared import capabilities
    g = gr.Graph.build(
        [{"op": "null", "name": "x"},
         {**_op("scan0", "cumsum", [0]), "attrs": {**_op("scan0", "cumsum", [0])["attrs"],
                                                   "axis": "1"}}],
        [1], shapes=[["batch", 4], ["batch", 4]], dtypes="float32")
    m = gr.create(g)
    kernels = []
    for batch in (2, 300, 40):
        x = RNG.standard_normal((batch, 4)).astype(np.float32)
        m.run(x=x)
        np.testing.assert_allclose(m.get_output(0).numpy(), np.cumsum(x, axis=1), rtol=1e-5)
        step = m._current.executor.steps[0]
        assert capabilities(step.kernel).shape_free()
        kernels.append(step.kernel)
    assert kernels[0] is kernels[1] is kernels[2]
    assert m.kernels.prepared == 1


def test_params_are_held_in_one_arena_and_checked_before_any_is_held() -> None:
    """A symbolic module's host params are views of one allocation (backends/cpu.host_arena:
    read on huge pages), each frozen; a load with one param of the wrong shape holds none of
    it: the params loaded before stay, and the module still answers as ONNX Runtime does."""
    from graph_runtime.errors import ParamsError
    from graph_runtime.lib.kernels.derived import derived_of
    m, session, names = _tiny_kv()
    held = {name: array for name, (_, array) in m._params.items()}
    bases = {id(a.base) for a in held.values() if a.base is not None}
    assert len(held) > 10 and len(bases) == 1 and all(a.base is not None for a in held.values())
    assert all(derived_of(a) is not None for a in held.values())  # frozen
    first, second = list(held)[:2]
    bad = {first: held[first] * 2, second: np.zeros((1,) + held[second].shape, np.float32)}
    with pytest.raises(ParamsError, match=second):
        m.load_params(bad)
    assert all(m._params[name][1] is array for name, array in held.items())
    _generate(lambda feeds: m.run_with(**feeds), session, names, 3,
              RNG.integers(0, 100, (1, 5)).astype(np.int64))
