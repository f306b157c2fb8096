"""Symbolic graphs: create() specialises per input shape, caches, shares params, names conflicts."""
from __future__ import annotations

import numpy as np
import pytest

import graph_runtime as gr
from graph_runtime.errors import GraphError
from graph_runtime.graph.symbolic import check_dim, evaluate, names_in
from graph_runtime.runtime.symbolic_module import SymbolicGraphModule

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


def test_dims_parse_and_evaluate() -> None:
    assert evaluate("batch*seq+1", {"batch": 2, "seq": 5}) == 11
    assert names_in("16*seq") == ["seq"]
    assert check_dim("?") is None and check_dim(3) is None
    assert "expected a name" in (check_dim("__import__('os')") or "")
    assert "not allowed" in (check_dim("f(seq)") or "")
    assert check_dim(-1) == "-1 is negative"


def test_specialises_per_shape_caches_and_shares_params() -> None:
    m = gr.create(dense_graph(), cache_size=2)
    assert isinstance(m, SymbolicGraphModule)
    assert m.signature == "x: (batch, 4) float32; w: (3, 4) float32; y: (batch, 3) float32"
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    m.load_params({"w": w})
    for batch in (1, 5, 5, 2, 1):
        x = RNG.standard_normal((batch, 4)).astype(np.float32)
        y = RNG.standard_normal((batch, 3)).astype(np.float32)
        m.run(x=x, y=y)
        np.testing.assert_allclose(m.get_output(0).numpy(), np.maximum(x, 0) @ w.T + y,
                                   rtol=1e-5, atol=1e-6)
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


def test_static_graph_stays_a_graph_module() -> None:
    g = gr.Graph.build([{"op": "null", "name": "x"}, _op("relu0", "relu", [0])], [1],
                       shapes=[[2, 3], [2, 3]], dtypes="float32")
    assert not g.is_symbolic
    assert type(gr.create(g)) is gr.GraphModule


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
    # workspace; w (3 x 4 float32, 48 B) once
    held = [mod.memory_report() for mod in m._cache.values()]
    assert len(held) == 2 and all(r.pool[gr.cpu()] >= 48 for r in held)
    assert m.held_bytes() == {gr.cpu(): sum(r.pool[gr.cpu()] + r.workspace.get(gr.cpu(), 0)
                                            for r in held) - 48 * len(held) + 48}
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
