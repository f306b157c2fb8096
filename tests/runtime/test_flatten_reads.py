"""runtime/flatten_reads.py: run() skips a batch_flatten, its dense reading the source's storage.

Real kernels throughout (oneDNN's conv, pool and matmul where the library is here, NumPy's
else), on conv -> pool -> batch_flatten -> dense graphs with odd shapes, pads and strides,
judged against float64 NumPy; the flatten's own output is checked through debug_get_outputs,
which runs every node as written.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from support import make_graph, null, require_onednn, tvm_op

import graph_runtime as gr
from graph_runtime.errors import GraphError
from graph_runtime.lib.kernels.nhwc_features import SMALL_WEIGHT_BYTES, permuting_pays
from graph_runtime.lib.kernels.onednn.nhwc_dense import NhwcFeaturesMatmul
from graph_runtime.lib.loader import module_from_json
from graph_runtime.runtime.flatten_reads import StagedOutputs
from graph_runtime.settings import NUM_THREADS, ONEDNN, ONEDNN_THREADS

U32 = float(np.finfo(np.float32).eps) / 2


@pytest.fixture
def onednn(monkeypatch: Any) -> None:
    """oneDNN wherever it applies (no timing), in OpenMP mode (the mode auto picks on an idle
    machine); or skip with why."""
    require_onednn()
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    monkeypatch.setenv(ONEDNN.name, "on")


def _lib(conv: dict, pool: dict) -> Any:
    return module_from_json({"format": "graph_runtime.lib", "version": 1, "functions": {
        "conv": {"ops": [{"op": "conv2d", "strides": conv["strides"],
                          "padding": conv["padding"]}, {"op": "add"}, {"op": "relu"}]},
        "pool": {"op": "max_pool2d", **pool},
        "flatten": {"op": "batch_flatten"},
        "dense": {"ops": [{"op": "dense"}, {"op": "add"}]},
        "relu": {"op": "relu"},
    }})


def _conv_out(size: int, k: int, stride: int, pad: tuple[int, int]) -> int:
    return (size + pad[0] + pad[1] - k) // stride + 1


def _graph(n: int, c: int, hw: tuple[int, int], o: int, units: int, conv: dict, pool: dict,
           shared: bool, tail: bool = False) -> tuple[Any, tuple[int, ...]]:
    """x -> conv+bias+relu -> max pool -> flatten -> dense+bias [-> relu]; with shared, the
    dense writes the pool's storage id (the liveness plan allows it: the flatten was the
    pool's last reader). Returns the graph and the pool's output shape."""
    k, s, pads = conv["kernel"], conv["strides"][0], conv["padding"]
    oh = _conv_out(hw[0], k, s, (pads[0], pads[2]))
    ow = _conv_out(hw[1], k, s, (pads[1], pads[3]))
    pk, ps = pool["pool_size"][0], pool["strides"][0]
    ph, pw = (oh - pk) // ps + 1, (ow - pk) // ps + 1
    pooled = (n, o, ph, pw)
    nodes = [null("x"), null("w"), null("b"), tvm_op("conv", "conv", [0, 1, 2]),
             tvm_op("pool", "pool", [3]), tvm_op("flatten", "flatten", [4]),
             null("wd"), null("bd"), tvm_op("dense", "dense", [5, 6, 7])]
    shapes = [[n, c, *hw], [o, c, k, k], [o, 1, 1], [n, o, oh, ow], list(pooled),
              [n, o * ph * pw], [units, o * ph * pw], [units], [n, units]]
    # storage ids: inputs 0-2, 6, 7 own; conv 3, pool 4, flatten 5 (conv's dead by then: 3),
    # dense 4 when shared (the pool's), else 5
    sids = [0, 1, 2, 10, 11, 10, 6, 7, 11 if shared else 12]
    if tail:
        nodes.append(tvm_op("relu", "relu", [8]))
        shapes.append([n, units])
        sids.append(13)
    return make_graph(nodes, [len(nodes) - 1], shapes=shapes, storage_ids=sids), pooled


def _ref_conv(x: np.ndarray, w: np.ndarray, conv: dict) -> np.ndarray:
    """float64 conv2d: top, left, bottom, right pads, one stride for both axes."""
    top, left, bottom, right = conv["padding"]
    s, k = conv["strides"][0], conv["kernel"]
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    windows = sliding_window_view(padded, (k, k), axis=(2, 3))[:, :, ::s, ::s]
    return np.einsum("nchwij,ocij->nohw", windows, w)


def _pool(y: np.ndarray, pool: dict) -> np.ndarray:
    k, s = pool["pool_size"][0], pool["strides"][0]
    n, o, h, w = y.shape
    ph, pw = (h - k) // s + 1, (w - k) // s + 1
    pooled = np.full((n, o, ph, pw), -np.inf)
    for i in range(k):
        for j in range(k):
            pooled = np.maximum(pooled, y[:, :, i:i + s * ph:s, j:j + s * pw:s])
    return pooled


def _reference(x: np.ndarray, p: dict, conv: dict, pool: dict) -> tuple[np.ndarray, ...]:
    """float64 conv+bias+relu, max pool, flatten, dense+bias; and the float32 error bounds of
    the flattened features and of the dense: recursive summation's terms * u * sum|terms|,
    carried through relu and max (which move no value further than their inputs moved)."""
    w = p["w"].astype(np.float64)
    y = np.maximum(_ref_conv(x, w, conv) + p["b"], 0)
    terms = w.shape[1] * w.shape[2] * w.shape[3] + 1
    conv_bound = 2 * terms * U32 * (_ref_conv(np.abs(x), np.abs(w), conv) + np.abs(p["b"]))
    n = x.shape[0]
    flat = _pool(y, pool).reshape(n, -1)
    flat_bound = _pool(conv_bound, pool).reshape(n, -1) + 1e-30
    wd = p["wd"].T.astype(np.float64)
    dense = flat @ wd + p["bd"]
    features = wd.shape[0] + 1
    dense_bound = (2 * features * U32 * (np.abs(flat) @ np.abs(wd) + np.abs(p["bd"]))
                   + (flat_bound @ np.abs(wd)) * (1 + 2 * features * U32) + 1e-30)
    return flat, flat_bound, dense, dense_bound


def _params(c: int, o: int, k: int, features: int, units: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((o, c, k, k)).astype(np.float32),
            "b": rng.standard_normal((o, 1, 1)).astype(np.float32),
            "wd": rng.standard_normal((units, features)).astype(np.float32),
            "bd": rng.standard_normal(units).astype(np.float32)}


CASES = [  # (n, c, (h, w), o, units, conv attrs, pool attrs)
    (32, 3, (64, 64), 16, 10, {"kernel": 3, "strides": [1, 1], "padding": [1, 1, 1, 1]},
     {"pool_size": [2, 2], "strides": [2, 2]}),
    (5, 3, (13, 11), 17, 5, {"kernel": 3, "strides": [2, 2], "padding": [1, 0, 2, 1]},
     {"pool_size": [3, 3], "strides": [2, 2]}),
    (6, 4, (6, 6), 40, 3, {"kernel": 3, "strides": [1, 1], "padding": [1, 1, 1, 1]},
     {"pool_size": [2, 2], "strides": [2, 2]}),
    # more units than rows, a small weight (1368 x 33): permuted all the same
    (3, 7, (9, 10), 19, 33, {"kernel": 1, "strides": [1, 1], "padding": [0, 0, 0, 0]},
     {"pool_size": [2, 2], "strides": [1, 1]}),
    # more units than rows and a weight over SMALL_WEIGHT_BYTES (18496 x 33): the flatten runs
    (2, 3, (34, 34), 64, 33, {"kernel": 3, "strides": [1, 1], "padding": [1, 1, 1, 1]},
     {"pool_size": [2, 2], "strides": [2, 2]}),
    (1, 4, (6, 6), 40, 3, {"kernel": 3, "strides": [1, 1], "padding": [1, 1, 1, 1]},
     {"pool_size": [2, 2], "strides": [2, 2]}),
]


def _check(got: np.ndarray, want: np.ndarray, bound: np.ndarray) -> None:
    err = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"error {err[worst]:.3g} > bound {bound[worst]:.3g} at {worst}"


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-o{c[3]}")
def test_run_skips_the_flatten_and_matches_float64(onednn: None, case: tuple,
                                                   shared: bool) -> None:
    n, c, hw, o, units, conv, pool = case
    graph, pooled = _graph(n, c, hw, o, units, conv, pool, shared)
    features = pooled[1] * pooled[2] * pooled[3]
    p = _params(c, o, conv["kernel"], features, units, seed=n + o)
    x = np.random.default_rng(1).standard_normal((n, c, *hw)).astype(np.float32)
    m = gr.create(graph, _lib(conv, pool), gr.cpu())
    m.set_input(x=x, **p)
    m.run()
    flat, flat_bound, want, bound = _reference(x.astype(np.float64), p, conv, pool)
    _check(m.get_output(0).numpy(), want, bound)
    ex = m.executor
    assert graph.entry_id(4, 0) in ex.channels_last  # the pool writes NHWC for the flatten
    if permuting_pays(n, units, features, 4):
        assert ex.skipped == {2}  # the flatten's step
        shortcut = ex.shortcuts[3].kernel
        assert isinstance(shortcut, StagedOutputs) == shared
        inner = shortcut.kernel if shared else shortcut
        assert isinstance(inner._steps[0][0], NhwcFeaturesMatmul)  # weight rows permuted
    else:
        assert ex.skipped == set() and not ex.shortcuts  # the flatten reorders to NCHW
    # debug outputs run every node as written: the flatten's output is the NCHW flatten
    outs = m.debug_get_outputs(["flatten", "dense"])
    _check(outs["flatten"][0], flat, flat_bound)
    _check(outs["dense"][0], want, bound)


def test_a_weight_written_later_is_permuted_again(onednn: None) -> None:
    n, c, hw, o, units, conv, pool = CASES[0]
    graph, pooled = _graph(n, c, hw, o, units, conv, pool, shared=True)
    features = pooled[1] * pooled[2] * pooled[3]
    p = _params(c, o, 3, features, units, seed=3)
    x = np.random.default_rng(2).standard_normal((n, c, *hw)).astype(np.float32)
    m = gr.create(graph, _lib(conv, pool), gr.cpu())
    m.set_input(x=x, **p)
    m.run()
    for round_ in range(2):
        p["wd"] = np.random.default_rng(10 + round_).standard_normal(
            p["wd"].shape).astype(np.float32)
        if round_ == 0:
            m.set_input("wd", p["wd"])
        else:  # written through the view get_input hands out
            m.get_input("wd").native[...] = p["wd"]
        m.run()
        _, _, want, bound = _reference(x.astype(np.float64), p, conv, pool)
        _check(m.get_output(0).numpy(), want, bound)


def test_a_tail_after_the_dense_and_the_profile_list_every_node(onednn: None) -> None:
    n, c, hw, o, units, conv, pool = CASES[1]
    graph, pooled = _graph(n, c, hw, o, units, conv, pool, shared=True, tail=True)
    features = pooled[1] * pooled[2] * pooled[3]
    p = _params(c, o, 3, features, units, seed=5)
    x = np.random.default_rng(4).standard_normal((n, c, *hw)).astype(np.float32)
    m = gr.create(graph, _lib(conv, pool), gr.cpu())
    m.set_input(x=x, **p)
    m.run()
    _, _, want, bound = _reference(x.astype(np.float64), p, conv, pool)
    _check(m.get_output(0).numpy(), np.maximum(want, 0), bound)
    names = [t.label for t in m.profile(repeat=1)]
    assert any("flatten" in name for name in names)  # profiled as written, flatten included


def _flatten_graph(shape: list[int], units: int, extra_reader: bool, output: bool) -> Any:
    """x -> relu -> flatten -> dense (+ a relu of the flatten / the flatten as an output)."""
    n, features = shape[0], int(np.prod(shape[1:]))
    nodes = [null("x"), tvm_op("relu", "relu", [0]), tvm_op("flatten", "flatten", [1]),
             null("wd"), null("bd"), tvm_op("dense", "dense", [2, 3, 4])]
    shapes = [shape, shape, [n, features], [units, features], [units], [n, units]]
    heads: list[int] = [5]
    if extra_reader:
        nodes.append(tvm_op("relu2", "relu", [2]))
        shapes.append([n, features])
        heads.append(6)
    if output:
        heads.append(2)
    return make_graph(nodes, heads, shapes=shapes)


@pytest.mark.parametrize("extra_reader,output", [(False, False), (True, False), (False, True)])
def test_nchw_source_read_in_place_only_when_the_flatten_has_one_reader(
        extra_reader: bool, output: bool) -> None:
    """Without NHWC (a NumPy relu writes the source) the reader reads the source's own bytes;
    a flatten read twice or a graph output is run as written."""
    shape, units = [3, 5, 4, 2], 6
    graph = _flatten_graph(shape, units, extra_reader, output)
    m = gr.create(graph, _lib({"kernel": 1, "strides": [1, 1], "padding": [0] * 4},
                              {"pool_size": [1, 1], "strides": [1, 1]}), gr.cpu())
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    wd = rng.standard_normal((units, 40)).astype(np.float32)
    bd = rng.standard_normal(units).astype(np.float32)
    m.set_input(x=x, wd=wd, bd=bd)
    m.run()
    flat = np.maximum(x.astype(np.float64), 0).reshape(3, -1)
    want = flat @ wd.T.astype(np.float64) + bd
    scale = np.abs(flat) @ np.abs(wd.T.astype(np.float64)) + np.abs(bd)
    _check(m.get_output(0).numpy(), want, 2 * 41 * U32 * scale + 1e-30)
    assert m.executor.skipped == (set() if extra_reader or output else {1})
    if output:
        np.testing.assert_array_equal(m.get_output(1).numpy(), flat.astype(np.float32))


def test_a_reshape_after_a_global_pool_is_skipped_with_the_dense_as_it_is(onednn: None) -> None:
    """PyTorch's flatten(1) imports as reshape; after a global pool (one pixel) NHWC and NCHW
    order agree, so the dense reads the pooled bytes with its own weight (no permuted copy)."""
    n, c, o, units = 3, 5, 24, 7
    lib = module_from_json({"format": "graph_runtime.lib", "version": 1, "functions": {
        "conv": {"ops": [{"op": "conv2d", "padding": [1, 1]}, {"op": "add"}, {"op": "relu"}]},
        "gap": {"op": "global_avg_pool2d"},
        "reshape": {"op": "reshape", "newshape": [0, -1]},
        "dense": {"ops": [{"op": "dense"}, {"op": "add"}]},
    }})
    nodes = [null("x"), null("w"), null("b"), tvm_op("conv", "conv", [0, 1, 2]),
             tvm_op("gap", "gap", [3]), tvm_op("reshape", "reshape", [4]),
             null("wd"), null("bd"), tvm_op("dense", "dense", [5, 6, 7])]
    shapes = [[n, c, 9, 8], [o, c, 3, 3], [o, 1, 1], [n, o, 9, 8], [n, o, 1, 1], [n, o],
              [units, o], [units], [n, units]]
    graph = make_graph(nodes, [8], shapes=shapes, storage_ids=[0, 1, 2, 10, 11, 10, 6, 7, 11])
    p = _params(c, o, 3, o, units, seed=9)
    x = np.random.default_rng(8).standard_normal((n, c, 9, 8)).astype(np.float32)
    m = gr.create(graph, lib, gr.cpu())
    m.set_input(x=x, **p)
    m.run()
    conv = {"kernel": 3, "strides": [1, 1], "padding": [1, 1, 1, 1]}
    w = p["w"].astype(np.float64)
    y = np.maximum(_ref_conv(x.astype(np.float64), w, conv) + p["b"], 0)
    y_bound = 2 * (c * 9 + 1) * U32 * (_ref_conv(np.abs(x).astype(np.float64), np.abs(w), conv)
                                      + np.abs(p["b"]))
    pooled = y.mean(axis=(2, 3))
    pooled_bound = y_bound.mean(axis=(2, 3)) + 2 * 72 * U32 * np.abs(y).mean(axis=(2, 3))
    wd = p["wd"].T.astype(np.float64)
    want = pooled @ wd + p["bd"]
    bound = (2 * (o + 1) * U32 * (np.abs(pooled) @ np.abs(wd) + np.abs(p["bd"]))
             + 2 * pooled_bound @ np.abs(wd) + 1e-30)
    _check(m.get_output(0).numpy(), want, bound)
    ex = m.executor
    assert ex.skipped == {2}
    assert graph.entry_id(4, 0) in ex.channels_last
    staged = ex.shortcuts[3].kernel
    assert isinstance(staged, StagedOutputs) and staged.kernel is ex.steps[3].fn


def _run_and_check(m: Any, n: int, c: int, hw: tuple[int, int], o: int, units: int,
                   conv: dict, pool: dict, pooled: tuple[int, ...], seed: int) -> None:
    """Run module m of _graph's net on seeded params and data; its output against float64."""
    features = pooled[1] * pooled[2] * pooled[3]
    p = _params(c, o, 3, features, units, seed=seed)
    x = np.random.default_rng(seed + 1).standard_normal((n, c, *hw)).astype(np.float32)
    m.set_input(x=x, **p)
    m.run()
    _, _, want, bound = _reference(x.astype(np.float64), p, conv, pool)
    _check(m.get_output(0).numpy(), want, bound)


def test_a_shortcut_past_the_memory_cap_is_left_out_not_refused(onednn: None) -> None:
    """The dense's permuted weight is workspace: past the cap the flatten simply runs. A cap
    just under the roomy total admits every kernel: the conv's reorder buffers, kept while it
    was prepared and dropped once channels-last told it of NHWC neighbours, are not held
    against the cap (with AVX2's blocks they outweigh the dense's weight)."""
    n, c, hw, o, units = 8, 3, (8, 8), 16, 8
    conv = {"kernel": 3, "strides": [1, 1], "padding": [1, 1, 1, 1]}
    pool = {"pool_size": [2, 2], "strides": [1, 1]}
    graph, pooled = _graph(n, c, hw, o, units, conv, pool, shared=True)
    lib = _lib(conv, pool)
    roomy = gr.create(graph, lib, gr.cpu())
    assert roomy.executor.skipped == {2}
    total = roomy.executor._bytes_in_use()[gr.cpu()]
    m = gr.create(graph, lib, gr.cpu(), memory_cap=total - 1)
    assert m.executor.skipped == set()
    _run_and_check(m, n, c, hw, o, units, conv, pool, pooled, seed=11)


def test_the_cap_holds_the_finished_module_not_the_buffers_channels_last_drops(
        onednn: None) -> None:
    """The total a module keeps is a cap it meets: the conv's reorder buffers, made while it
    was prepared for NCHW neighbours, are dropped once it is told of NHWC ones and are not
    held against the cap; a byte less is refused, naming a kernel."""
    # more units than rows and a weight over SMALL_WEIGHT_BYTES (1024 x 300): no shortcut
    n, c, hw, o, units = 4, 3, (16, 16), 16, 300
    conv = {"kernel": 3, "strides": [1, 1], "padding": [1, 1, 1, 1]}
    pool = {"pool_size": [2, 2], "strides": [2, 2]}
    graph, pooled = _graph(n, c, hw, o, units, conv, pool, shared=False)
    lib = _lib(conv, pool)
    roomy = gr.create(graph, lib, gr.cpu())
    assert graph.entry_id(3, 0) in roomy.executor.channels_last
    assert not roomy.executor.skipped
    total = roomy.executor._bytes_in_use()[gr.cpu()]
    m = gr.create(graph, lib, gr.cpu(), memory_cap=total)
    assert m.executor._bytes_in_use()[gr.cpu()] == total
    _run_and_check(m, n, c, hw, o, units, conv, pool, pooled, seed=21)
    with pytest.raises(GraphError, match=r"node \d+ '\w+' \(\w+\) keeps .* of workspace on "
                                         r"cpu:0, which brings the total there to .* but the "
                                         r"cap is"):
        gr.create(graph, lib, gr.cpu(), memory_cap=total - 1)


# CASES[3] larger: a flatten that runs with more elements than NumPy's copy takes
# (flatten.NUMPY_REORDER_ELEMENTS), so oneDNN reorders them
RUN_LARGE = (3, 7, (40, 40), 19, 33, CASES[3][5], CASES[3][6])


@pytest.mark.parametrize("case", [CASES[0], RUN_LARGE], ids=["skipped", "run"])
def test_workers_mode_bands_the_flattens_reorder(onednn: None, monkeypatch: Any,
                                                 case: tuple) -> None:
    """With the runtime's workers (three) the flatten's NHWC -> NCHW reorder runs in bands."""
    monkeypatch.setenv(ONEDNN_THREADS.name, "workers")
    monkeypatch.setenv(NUM_THREADS.name, "3")
    n, c, hw, o, units, conv, pool = case
    graph, pooled = _graph(n, c, hw, o, units, conv, pool, shared=True)
    features = pooled[1] * pooled[2] * pooled[3]
    p = _params(c, o, conv["kernel"], features, units, seed=13)
    x = np.random.default_rng(14).standard_normal((n, c, *hw)).astype(np.float32)
    m = gr.create(graph, _lib(conv, pool), gr.cpu())
    m.set_input(x=x, **p)
    m.run()
    flat, flat_bound, want, bound = _reference(x.astype(np.float64), p, conv, pool)
    _check(m.get_output(0).numpy(), want, bound)
    flatten = m.executor.steps[2].kernel
    assert len(flatten._reorder.items) > 1
    outs = m.debug_get_outputs(["flatten"])
    _check(outs["flatten"][0], flat, flat_bound)


def test_a_small_flatten_reorders_by_numpy(onednn: None) -> None:
    """Up to NUMPY_REORDER_ELEMENTS the NHWC -> NCHW copy is NumPy's strided copy (no oneDNN
    reorder made), the values as the reference's."""
    from graph_runtime.lib.kernels.cpu.flatten import NUMPY_REORDER_ELEMENTS
    n, c, hw, o, units, conv, pool = CASES[3]
    graph, pooled = _graph(n, c, hw, o, units, conv, pool, shared=True)
    assert pooled[0] * pooled[1] * pooled[2] * pooled[3] <= NUMPY_REORDER_ELEMENTS
    features = pooled[1] * pooled[2] * pooled[3]
    p = _params(c, o, conv["kernel"], features, units, seed=15)
    x = np.random.default_rng(16).standard_normal((n, c, *hw)).astype(np.float32)
    m = gr.create(graph, _lib(conv, pool), gr.cpu())
    assert graph.entry_id(4, 0) in m.executor.channels_last  # the pool writes NHWC
    m.set_input(x=x, **p)
    m.run()
    flat, flat_bound, want, bound = _reference(x.astype(np.float64), p, conv, pool)
    _check(m.get_output(0).numpy(), want, bound)
    flatten = m.executor.steps[2].kernel
    assert flatten._reorder is None
    _check(m.debug_get_outputs(["flatten"])["flatten"][0], flat, flat_bound)


@pytest.mark.parametrize("trans_b", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_openblas_dense_reads_nhwc_features_through_a_permuted_weight(trans_b: bool,
                                                                      dtype: str) -> None:
    """OpenBLAS's call (the dense a race picks at batch 1) reads NHWC features with its
    weight's rows permuted, equal to the plain call on the NCHW flatten, and permutes again
    when the weight is written; a weight over SMALL_WEIGHT_BYTES with more units than rows
    is not copied."""
    from graph_runtime.lib.library import InputVersion
    from graph_runtime.lib.ops.linalg import BlasDot, Gemm, cpu_gemm
    m, (c, h, w), n = 2, (5, 3, 4), 7
    k = c * h * w
    plain = cpu_gemm(None, 0, Gemm(1, m, n, k, False, trans_b, 1, 1, dtype))
    assert isinstance(plain, BlasDot)
    variant = plain.reading_nhwc(0, (m, c, h, w))
    assert variant is not None and plain.reading_nhwc(1, (m, c, h, w)) is None
    assert plain.reading_nhwc(0, (m, c, h, w + 1)) is None  # not this product's features
    rng = np.random.default_rng(7)
    x = rng.standard_normal((m, c, h, w)).astype(dtype)
    version = InputVersion()
    variant.bind_versions({1: version})
    for _ in range(2):
        weight = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
        version.value += 1
        want, got = np.empty((m, n), dtype), np.empty((m, n), dtype)
        plain(x.reshape(m, k), weight, want)
        variant(x.transpose(0, 2, 3, 1).reshape(m, k), weight, got)
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12,
                                   atol=1e-5 if dtype == "float32" else 1e-12)
    big_k = SMALL_WEIGHT_BYTES // (4 * n) + 1  # one row more than the small weights' bound
    big = cpu_gemm(None, 0, Gemm(1, 1, n, big_k, False, True, 1, 1, "float32"))
    assert not permuting_pays(1, n, big_k, 4) and big.reading_nhwc(0, (1, big_k, 1, 1)) is None


@pytest.mark.parametrize("trans_b", [True, False])
def test_onednns_product_reading_nhwc_features_is_replayed_as_called(onednn: None,
                                                                     trans_b: bool) -> None:
    """oneDNN's product on the permuted weight vouches for its call (the permutation made
    before, at a call of its own): its one-call replay writes what the plain product on the
    NCHW flatten writes."""
    from graph_runtime.lib.kernels import replay
    from graph_runtime.lib.kernels.onednn.matmul import OnednnMatmul
    from graph_runtime.lib.library import InputVersion
    m, (c, h, w), n = 2, (5, 3, 4), 7
    k = c * h * w
    plain = OnednnMatmul(1, m, n, k, False, trans_b, 1, 1, split=False)
    variant = plain.reading_nhwc(0, (m, c, h, w))
    assert isinstance(variant, NhwcFeaturesMatmul)
    variant.bind_versions({1: InputVersion()})
    rng = np.random.default_rng(8)
    x = rng.standard_normal((m, c, h, w)).astype(np.float32)
    weight = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    got = np.zeros((m, n), np.float32)
    timed = replay.replayed_call(variant, [np.ascontiguousarray(x.transpose(0, 2, 3, 1))
                                           .reshape(m, k), weight, got])
    assert timed is not None
    got[...] = 0
    timed()
    want = x.reshape(m, k) @ (weight.T if trans_b else weight)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
