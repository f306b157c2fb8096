"""onednn/nchw_data_conv.py: a first conv reading NCHW data itself, writing NHWC bytes.

Graphs x -> conv+bias+relu -> max pool (the pool keeps the conv's output NHWC), judged against
float64 NumPy in both thread modes, over input channel counts, pads, strides and batches; the
variant must be taken exactly where its output bytes are NHWC's (one channel block of outputs:
16 with AVX-512, 8 with AVX2 alone), and a conv weight written later must be packed again.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from support import make_graph, null, require_onednn, tvm_op

import graph_runtime as gr
from graph_runtime.lib.kernels.onednn import binding as dn
from graph_runtime.lib.loader import module_from_json
from graph_runtime.settings import NUM_THREADS, ONEDNN, ONEDNN_THREADS

U32 = float(np.finfo(np.float32).eps) / 2


@pytest.fixture
def onednn(monkeypatch: Any) -> None:
    """oneDNN wherever it applies, or skip (fail under GRAPH_RUNTIME_REQUIRE_ONEDNN=1)."""
    require_onednn()
    monkeypatch.setenv(ONEDNN.name, "on")


def _module(n: int, c: int, hw: tuple[int, int], o: int, k: int, stride: int,
            pads: list[int]) -> tuple[Any, tuple[int, ...]]:
    top, left, bottom, right = pads
    oh = (hw[0] + top + bottom - k) // stride + 1
    ow = (hw[1] + left + right - k) // stride + 1
    lib = module_from_json({"format": "graph_runtime.lib", "version": 1, "functions": {
        "conv": {"ops": [{"op": "conv2d", "strides": [stride, stride], "padding": pads},
                         {"op": "add"}, {"op": "relu"}]},
        "pool": {"op": "max_pool2d", "pool_size": [2, 2], "strides": [1, 1]},
    }})
    nodes = [null("x"), null("w"), null("b"), tvm_op("conv", "conv", [0, 1, 2]),
             tvm_op("pool", "pool", [3])]
    shapes = [[n, c, *hw], [o, c, k, k], [o, 1, 1], [n, o, oh, ow], [n, o, oh - 1, ow - 1]]
    return gr.create(make_graph(nodes, [4], shapes=shapes), lib, gr.cpu()), (n, o, oh, ow)


def _conv(x: np.ndarray, w: np.ndarray, stride: int, pads: list[int]) -> np.ndarray:
    top, left, bottom, right = pads
    k = w.shape[2]
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    windows = sliding_window_view(padded, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("nchwij,ocij->nohw", windows, w)


def _pool(y: np.ndarray) -> np.ndarray:
    return np.maximum(np.maximum(y[:, :, :-1, :-1], y[:, :, 1:, :-1]),
                      np.maximum(y[:, :, :-1, 1:], y[:, :, 1:, 1:]))


def _check(m: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int,
           pads: list[int]) -> None:
    """The pooled output and the conv's own (debug) output within float32's summation bound."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y = np.maximum(_conv(x64, w64, stride, pads) + b, 0)
    terms = w.shape[1] * w.shape[2] * w.shape[3] + 1
    bound = 2 * terms * U32 * (_conv(np.abs(x64), np.abs(w64), stride, pads) + np.abs(b))
    m.run()
    got = m.get_output(0).numpy().astype(np.float64)
    assert (np.abs(got - _pool(y)) <= _pool(bound) + 1e-30).all()
    conv_out = m.debug_get_outputs(["conv"])["conv"][0].astype(np.float64)
    assert (np.abs(conv_out - y) <= bound + 1e-30).all()


BLOCK = "block"  # as many output channels as oneDNN's channel block here (binding.channel_block)
CASES = [  # (n, c, (h, w), o, kernel, stride, pads)
    (32, 3, (64, 64), BLOCK, 3, 1, [1, 1, 1, 1]),
    (5, 1, (13, 11), BLOCK, 3, 2, [1, 0, 2, 1]),
    (3, 4, (9, 10), BLOCK, 5, 1, [2, 2, 2, 2]),
    (2, 3, (12, 12), BLOCK, 7, 2, [3, 3, 3, 3]),
    (3, 3, (10, 9), 32, 3, 1, [1, 1, 1, 1]),  # two or four channel blocks: not NHWC's bytes
    (2, 5, (8, 8), 7, 3, 1, [1, 1, 1, 1]),    # a padded block: not NHWC's bytes either
    (2, 3, (8, 8), 8, 3, 1, [1, 1, 1, 1]),    # AVX2's block, a padded one with AVX-512
    (2, 17, (8, 8), 16, 3, 1, [1, 1, 1, 1]),  # a full block of inputs: the NHWC kernel
]


def _outputs(o: int | str) -> int:
    return dn.channel_block() if o == BLOCK else int(o)


@pytest.mark.parametrize("mode", ["openmp", "workers"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-o{c[3]}k{c[4]}")
def test_first_conv_reads_nchw_where_its_output_is_nhwc(onednn: None, monkeypatch: Any,
                                                        case: tuple, mode: str) -> None:
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    monkeypatch.setenv(NUM_THREADS.name, "2")
    n, c, hw, o, k, stride, pads = case
    o = _outputs(o)
    m, out_shape = _module(n, c, hw, o, k, stride, pads)
    rng = np.random.default_rng(n * 100 + c)
    x = rng.standard_normal((n, c, *hw)).astype(np.float32)
    w = rng.standard_normal((o, c, k, k)).astype(np.float32)
    b = rng.standard_normal((o, 1, 1)).astype(np.float32)
    m.set_input(x=x, w=w, b=b)
    _check(m, x, w, b, stride, pads)
    conv = m.executor.steps[0].kernel
    assert m.executor.graph.entry_id(3, 0) in m.executor.channels_last
    taken = conv.nchw_data is not None
    block = dn.channel_block()
    assert taken == (o == block and c < block), (conv.nchw_data, block)
    if taken:
        assert conv.src_buf is None  # no buffer for a data reorder it no longer makes


def test_a_conv_weight_written_later_is_packed_again(onednn: None, monkeypatch: Any) -> None:
    monkeypatch.setenv(ONEDNN_THREADS.name, "openmp")
    n, c, hw, o, k, stride, pads = CASES[1]
    o = _outputs(o)
    m, _ = _module(n, c, hw, o, k, stride, pads)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, c, *hw)).astype(np.float32)
    w = rng.standard_normal((o, c, k, k)).astype(np.float32)
    b = rng.standard_normal((o, 1, 1)).astype(np.float32)
    m.set_input(x=x, w=w, b=b)
    _check(m, x, w, b, stride, pads)
    assert m.executor.steps[0].kernel.nchw_data is not None
    w2 = rng.standard_normal(w.shape).astype(np.float32)
    m.set_input("w", w2)
    _check(m, x, w2, b, stride, pads)
    w3 = rng.standard_normal(w.shape).astype(np.float32)
    m.get_input("w").native[...] = w3  # through the view: derived every run from now on
    _check(m, x, w3, b, stride, pads)
