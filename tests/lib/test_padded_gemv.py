"""Batch-1 dense layers with zero-padded weights: when they pad, where the weight lives, results."""
from __future__ import annotations

import numpy as np
import pytest
from support import dense_spec, make_graph, null, require_onednn, tvm_op

import graph_runtime as gr
from graph_runtime.errors import LibraryError
from graph_runtime.lib import tuning
from graph_runtime.lib.kernels.cpu.dense_choice import DENSE, choose, offered
from graph_runtime.lib.kernels.cpu.padded_gemv import PaddedGemv, padded_rows
from graph_runtime.settings import GEMV_PADDING, NUM_THREADS, ONEDNN_THREADS

PADDING_ENV = GEMV_PADDING.name

K, UNITS = 784, 512  # the mlp example's first layer: 401,408 weights, padded to 588 rows


@pytest.fixture(autouse=True)
def _todays_kernels(monkeypatch):
    """These test the OpenBLAS kernels; oneDNN's matmul (the choice may take it) has
    test_onednn.py."""
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "off")


@pytest.fixture
def padding_on(monkeypatch):
    monkeypatch.setenv(PADDING_ENV, "on")


def test_padded_rows_reach_the_openblas_threshold_within_twice_the_weights(monkeypatch):
    assert padded_rows(784, 512, "float32") == 588  # 588 x 784 = 460,992 >= 460,800
    assert padded_rows(512, 512, "float64") == 900
    assert padded_rows(512, 10, "float32") == 0  # would need 90x the weights
    assert padded_rows(1024, 512, "float32") == 0  # already threaded by OpenBLAS
    assert padded_rows(784, 512, "float16") == 0  # no BLAS for float16
    monkeypatch.setenv(PADDING_ENV, "on")
    assert offered(dense_spec(1, 512, 784)) == ["padded"]
    monkeypatch.setenv(PADDING_ENV, "off")
    assert offered(dense_spec(1, 512, 784)) == ["blas"]


@pytest.mark.parametrize("mode", ["openmp", "workers"])
def test_no_padding_raced_beside_onednn_on_openmp_threads(monkeypatch, mode):
    """OpenMP threads over every core and a threaded OpenBLAS call spin against each other: a
    race timing padding beside oneDNN on OpenMP measured oneDNN's 1x512x512 product at 1.3 ms
    (26 us alone) and kept OpenBLAS's call. Forced padding still stands."""
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "auto")
    require_onednn()
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    names = offered(dense_spec(1, 512, 784))
    assert "onednn" in names
    assert ("padded" in names) == (mode == "workers")
    monkeypatch.setenv(PADDING_ENV, "on")
    assert offered(dense_spec(1, 512, 784))[0] == "padded"


def test_auto_measures_once_per_shape(monkeypatch):
    monkeypatch.setenv(PADDING_ENV, "auto")
    tuning.forget()
    spec = dense_spec(1, 512, 784)
    first = choose(spec)
    assert first in ("blas", "padded")
    (entry,) = [e for e in tuning.remembered() if e.choice == DENSE.choice.name]
    assert entry.key == spec.key()
    assert entry.chosen == first and set(entry.seconds) == {"blas", "padded"}
    assert choose(spec) == first


def test_bad_mode_is_named(monkeypatch):
    monkeypatch.setenv(PADDING_ENV, "fast")
    with pytest.raises(LibraryError, match="GRAPH_RUNTIME_GEMV_PADDING must be auto, on or off, "
                                           "got 'fast'"):
        offered(dense_spec(1, 512, 784))


def _dense_graph(two_readers: bool = False):
    nodes = [null("data"), null("w"), tvm_op("fc", "dense", [0, 1])]
    heads = [2]
    shapes = [[1, K], [UNITS, K], [1, UNITS]]
    if two_readers:
        nodes.append(tvm_op("fc2", "dense", [0, 1]))
        heads.append(3)
        shapes.append([1, UNITS])
    return make_graph(nodes, heads, shapes=shapes)


def _data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, K), dtype=np.float32),
            rng.standard_normal((UNITS, K), dtype=np.float32))


def _weight_array(m) -> np.ndarray:
    eid = m.graph.input_entries["w"]
    return m.executor.arrays[(eid, m.executor.entry_device[eid])]


def _check(m, x: np.ndarray, w: np.ndarray, index: int = 0) -> None:
    m.run()
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(m.get_output(index).numpy(), want, rtol=1e-4, atol=1e-3)


def test_the_weight_lives_in_the_padded_buffer(padding_on):
    m = gr.create(_dense_graph())
    kernel = m.executor.steps[0].fn
    assert isinstance(kernel, PaddedGemv)
    weight = _weight_array(m)
    assert weight is kernel.weight and kernel.buffer.shape == (588, K)
    x, w = _data(1)
    m.set_input("data", x)
    m.load_params({"w": w})  # lands in the padded buffer; the pad rows stay zero
    assert not kernel.buffer[UNITS:].any()
    _check(m, x, w)
    x2, w2 = _data(2)
    m.set_input(data=x2, w=w2)
    _check(m, x2, w2)
    # the input a user reads back is the weight itself
    np.testing.assert_array_equal(m.get_input("w").numpy(), w2)


def test_a_zero_copy_weight_takes_the_plain_call(padding_on):
    m = gr.create(_dense_graph())
    x, w = _data(3)
    m.set_input("data", x)
    m.set_input_zero_copy("w", gr.nd.array(w))
    assert _weight_array(m) is not m.executor.steps[0].fn.weight
    _check(m, x, w)


def test_a_weight_two_layers_read_is_placed_once(padding_on):
    m = gr.create(_dense_graph(two_readers=True))
    first, second = (s.fn for s in m.executor.steps)
    assert _weight_array(m) is first.weight and _weight_array(m) is not second.weight
    x, w = _data(4)
    m.set_input(data=x, w=w)
    _check(m, x, w, 0)
    _check(m, x, w, 1)


def test_a_shared_storage_id_keeps_the_pool(padding_on):
    # w shares storage id 1 with a __nop's output aliasing it: moving w alone would split them,
    # so the planner's buffer stays and the kernel takes the plain call
    nodes = [null("data"), null("w"), tvm_op("r", "__nop", [1]), tvm_op("fc", "dense", [0, 1])]
    g = make_graph(nodes, [3], shapes=[[1, K], [UNITS, K], [UNITS, K], [1, UNITS]],
                   storage_ids=[0, 1, 1, 2])
    m = gr.create(g)
    assert _weight_array(m) is not m.executor.steps[0].fn.weight
    x, w = _data(5)
    m.set_input(data=x, w=w)
    _check(m, x, w)
