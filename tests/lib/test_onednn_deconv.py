"""conv2d_transpose on oneDNN (lib/kernels/onednn/deconv.py) against float64 NumPy, the
fused epilogues as post-ops, weight freshness, both thread modes, and the path without oneDNN.

Accuracy is judged as in test_onednn.py: |error| <= 2 * terms * u * sum|terms|.
"""
from __future__ import annotations


import numpy as np
import pytest
import test_conv_strategies as strategies
from support import make_graph, null, require_onednn, tvm_op
from test_conv import ref_conv2d_attrs, ref_conv2d_transpose
from test_onednn import U32, _check

import graph_runtime as gr
from graph_runtime.lib import Module
from graph_runtime.lib.chain import Chain, Step
from graph_runtime.lib.kernels.onednn import binding
from graph_runtime.lib.kernels.onednn import deconv as onednn_deconv
from graph_runtime.lib.kernels.onednn.deconv import OnednnDeconv
from graph_runtime.lib.library import TensorSpec
from graph_runtime.settings import NUM_THREADS, ONEDNN_THREADS

# (data shape, weight shape (C_in, C_out / groups, KH, KW), attrs): U-Net's 2x2 stride-2
# upsampling, odd sizes and channel counts that 8 and 16 do not divide, asymmetric pads,
# output padding, strides 1-3, dilation, groups, depthwise-like (one channel per group, with
# and without a multiplier), a batch of three.
CASES = [
    ((1, 32, 8, 8), (32, 16, 2, 2), {"strides": [2, 2]}),
    ((1, 17, 7, 6), (17, 13, 3, 3), {"strides": [2, 2], "padding": [1, 0, 2, 1]}),
    ((2, 9, 5, 5), (9, 11, 3, 3), {"strides": [2, 2], "padding": [1],
                                   "output_padding": [1, 1]}),
    ((1, 5, 6, 7), (5, 7, 3, 2), {"strides": [3, 2], "padding": [0, 1, 2, 0],
                                  "output_padding": [2, 1]}),
    ((1, 6, 5, 5), (6, 4, 3, 3), {"strides": [1, 2], "dilation": [2, 3],
                                  "padding": [1, 2, 0, 1], "output_padding": [0, 1]}),
    ((1, 7, 6, 6), (7, 5, 3, 3), {"padding": [1]}),
    ((1, 12, 5, 7), (12, 5, 3, 2), {"strides": [3, 2], "padding": [0, 1, 2, 0], "groups": 3,
                                    "output_padding": [2, 1]}),
    ((1, 19, 9, 9), (19, 1, 3, 3), {"strides": [2, 2], "padding": [1], "groups": 19}),
    ((1, 10, 6, 6), (10, 2, 4, 4), {"strides": [2, 2], "padding": [1], "groups": 10}),
    ((3, 24, 6, 5), (24, 10, 2, 2), {"strides": [2, 2]}),
    ((1, 6, 5, 5), (6, 4, 1, 1), {"strides": [3, 3], "output_padding": [2, 1]}),
]


def _ids(case) -> str:
    data, weight, attrs = case
    return f"{data}-{weight}-{'-'.join(f'{k}{v}' for k, v in attrs.items()) or 'plain'}"


def _ref(x, w, attrs) -> np.ndarray:
    return ref_conv2d_transpose(x, w, attrs.get("strides", (1, 1)), attrs.get("padding", 0),
                                attrs.get("dilation", (1, 1)), attrs.get("groups", 1),
                                attrs.get("output_padding", (0, 0)))


def _bound(x, w, attrs, extra_terms: int = 0, extra_abs=0.0) -> np.ndarray:
    """Worst-case float32 error of the transposed conv (and added terms) at each output."""
    terms = (x.shape[1] // attrs.get("groups", 1)) * w.shape[2] * w.shape[3] + extra_terms + 1
    return 2 * terms * U32 * (_ref(np.abs(x), np.abs(w), attrs) + extra_abs) + 1e-30


def _prepared(func, inputs, attrs=None):
    """(the kernel func prepares to on the CPU, its output for inputs)."""
    chain = Chain("f", [Step(e.pop("op"), e) for e in (dict(s) for s in func)])
    specs = [TensorSpec(a.shape, "float32") for a in inputs]
    outs = chain.infer(specs, attrs or {})
    kernel = chain.prepare(gr.cpu(), specs, outs, dict(attrs or {}))
    out = np.empty(outs[0].shape, np.float32)
    kernel(*inputs, out)
    return kernel, out


@pytest.fixture
def on(monkeypatch):
    """oneDNN forced on (GRAPH_RUNTIME_ONEDNN=on); skipped with the reason where it cannot run,
    failed instead where CI requires it (as test_onednn's fixture)."""
    require_onednn()
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    return binding.library()


@pytest.mark.parametrize("mode", ["openmp", "workers"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_deconv_matches_float64(on, monkeypatch, mode, case, random_array) -> None:
    """Forced onto oneDNN in both thread modes (workers: whole images split, even small)."""
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setattr(onednn_deconv, "MIN_SPLIT_FLOPS", 0)
    data_shape, weight_shape, attrs = case
    x = random_array(data_shape, "float32", seed=1)
    w = random_array(weight_shape, "float32", seed=2)
    kernel, got = _prepared([{"op": "conv2d_transpose", **attrs}], [x, w])
    assert isinstance(kernel, OnednnDeconv), kernel
    assert "ref" not in kernel.impl, kernel.impl  # oneDNN's slow reference code
    if mode == "openmp":
        assert (kernel.openmp, len(kernel.pieces)) == (2, 1)
    else:
        assert (kernel.openmp, len(kernel.pieces)) == (1, 1 if x.shape[0] == 1 else x.shape[0])
    _check(got, _ref(x, w, attrs), _bound(x, w, attrs))


@pytest.mark.parametrize("mode", ["openmp", "workers"])
@pytest.mark.parametrize("epilogue", sorted(strategies.EPILOGUES))
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[7]], ids=_ids)
def test_deconv_fused_epilogues(on, monkeypatch, mode, epilogue, case, random_array) -> None:
    """A chain's trailing bias / residual / activations are the primitive's bias and
    post-ops: the chain prepares to the one oneDNN kernel (in workers mode a batch of two is
    split into images, each with its residual rows)."""
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setattr(onednn_deconv, "MIN_SPLIT_FLOPS", 0)
    ops, reference, operands = strategies.EPILOGUES[epilogue]
    data_shape, weight_shape, attrs = case
    x = random_array(data_shape, "float32", seed=7)
    w = random_array(weight_shape, "float32", seed=8)
    y = _ref(x, w, attrs)
    bias = random_array((y.shape[1], 1, 1), "float32", seed=9)
    residual = random_array(y.shape, "float32", seed=10)
    inputs = [x, w] + {"bias": [bias], "residual": [residual], "both": [bias, residual]}[operands]
    kernel, got = _prepared([{"op": "conv2d_transpose", **attrs}] + ops, inputs)
    assert isinstance(kernel, OnednnDeconv), kernel
    assert len(kernel.epilogue.ops) == len(ops)
    want = reference(y, bias.astype(np.float64), residual.astype(np.float64))
    _check(got, want, _bound(x, w, attrs, 2, 2.0 + np.abs(y)))


def test_deconv_scalar_add_and_clip_as_post_ops(on, random_array) -> None:
    """relu -> add(scalar) -> clip: an eltwise, a per-tensor binary and a clip post-op."""
    x = random_array((1, 5, 6, 7), "float32", seed=3)
    w = random_array((5, 9, 3, 3), "float32", seed=4)
    s = np.array([0.75], "float32")
    attrs = {"strides": [2, 2], "padding": [1]}
    kernel, got = _prepared([{"op": "conv2d_transpose", **attrs}, {"op": "relu"}, {"op": "add"},
                             {"op": "clip", "a_min": -1.0, "a_max": 1.5}], [x, w, s])
    assert isinstance(kernel, OnednnDeconv), kernel
    want = np.clip(np.maximum(_ref(x, w, attrs), 0) + 0.75, -1.0, 1.5)
    _check(got, want, _bound(x, w, attrs, 1, 1.0))


def test_output_padding_past_the_stride_stays_numpy(on, random_array) -> None:
    """ONNX allows output padding below the dilation; oneDNN only below the stride."""
    x = random_array((1, 4, 5, 5), "float32", seed=5)
    w = random_array((4, 3, 3, 3), "float32", seed=6)
    attrs = {"dilation": [3, 3], "output_padding": [2, 0]}
    kernel, got = _prepared([{"op": "conv2d_transpose", **attrs}], [x, w])
    assert not isinstance(kernel, OnednnDeconv)
    _check(got, _ref(x, w, attrs), _bound(x, w, attrs))


# -- weights changed between runs --------------------------------------------------------------

def test_deconv_weight_changes_between_runs(on, random_array) -> None:
    """set_input, load_params (dict and bytes), writes through get_input's view, zero copy:
    the weight packed into oneDNN's layout follows every one of them, and the bias too."""
    attrs = {"strides": [2, 2], "padding": [1], "groups": 2}
    lib = Module("deconvlib")
    lib.register("up", Chain("up", [Step("conv2d_transpose", attrs), Step("add"), Step("relu")]))
    nodes = [null("data"), null("weight"), null("bias"), tvm_op("up", "up", [0, 1, 2])]
    graph = make_graph(nodes, [3], shapes=[[2, 6, 5, 5], [6, 3, 3, 3], [6, 1, 1],
                                           [2, 6, 9, 9]])
    m = gr.create(graph, lib, gr.cpu())
    assert isinstance(m.executor.steps[0].kernel, OnednnDeconv)
    x = random_array((2, 6, 5, 5), "float32", seed=14)
    weights = [random_array((6, 3, 3, 3), "float32", seed=s) for s in (15, 16, 17, 18, 19)]
    biases = [random_array((6, 1, 1), "float32", seed=s) for s in (20, 21)]

    def check(w, b) -> None:
        m.run(data=x)
        want = np.maximum(_ref(x, w, attrs) + b, 0)
        _check(m.get_output(0).numpy(), want, _bound(x, w, attrs, 1, 1.0))

    m.load_params({"weight": weights[0], "bias": biases[0]})
    check(weights[0], biases[0])
    check(weights[0], biases[0])  # the packed weight is reused
    m.set_input("weight", weights[1])
    check(weights[1], biases[0])
    m.load_params({"bias": biases[1]})
    check(weights[1], biases[1])
    m.load_params(gr.save_param_dict({"weight": weights[2]}))
    check(weights[2], biases[1])
    m.get_input("weight").native[...] = weights[3]  # writes through the returned view
    check(weights[3], biases[1])
    own = weights[4].copy()
    m.set_input_zero_copy("weight", own)
    check(weights[4], biases[1])
    own[...] = weights[0]  # changed in place, no setter: the zero-copy weight is repacked
    check(weights[0], biases[1])


def test_deconv_weight_computed_by_a_node(on, random_array) -> None:
    """A weight another node writes changes every run: it is repacked every run."""
    lib = Module("deconvlib")
    lib.register("scale", Chain("scale", [Step("multiply")]))
    lib.register("up", Chain("up", [Step("conv2d_transpose", {"strides": [2, 2]})]))
    nodes = [null("data"), null("w0"), null("k"), tvm_op("w", "scale", [1, 2]),
             tvm_op("up", "up", [0, 3])]
    graph = make_graph(nodes, [4], shapes=[[1, 3, 4, 4], [3, 5, 2, 2], [1], [3, 5, 2, 2],
                                           [1, 5, 8, 8]])
    m = gr.create(graph, lib, gr.cpu())
    x = random_array((1, 3, 4, 4), "float32", seed=25)
    w0 = random_array((3, 5, 2, 2), "float32", seed=26)
    m.load_params({"w0": w0})
    for k in (1.0, 2.0, -3.0):
        m.run(data=x, k=np.array([k], "float32"))
        want = _ref(x, w0 * k, {"strides": [2, 2]})
        _check(m.get_output(0).numpy(), want, _bound(x, w0 * k, {"strides": [2, 2]}))


# -- oneDNN's layout between oneDNN nodes -------------------------------------------------------

@pytest.mark.parametrize("mode", ["workers", "openmp"])
def test_conv_deconv_conv_keep_nhwc_between_them(on, monkeypatch, mode, random_array) -> None:
    """conv+bias+relu -> deconv+bias+relu -> conv: the two entries between them stay NHWC (no
    reorders left inside), and the result and the debug outputs are the float64 ones."""
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    lib = Module("unetlike")
    lib.register("down", Chain("down", [Step("conv2d", {"padding": [1], "strides": [2, 2]}),
                                        Step("add"), Step("relu")]))
    lib.register("up", Chain("up", [Step("conv2d_transpose", {"strides": [2, 2]}), Step("add"),
                                    Step("relu")]))
    lib.register("head", Chain("head", [Step("conv2d", {"padding": [1]})]))
    nodes = [null("x"), null("w1"), null("b1"), tvm_op("down", "down", [0, 1, 2]),
             null("w2"), null("b2"), tvm_op("up", "up", [3, 4, 5]),
             null("w3"), tvm_op("head", "head", [6, 7])]
    shapes = [[2, 5, 10, 8], [12, 5, 3, 3], [12, 1, 1], [2, 12, 5, 4], [12, 7, 2, 2],
              [7, 1, 1], [2, 7, 10, 8], [3, 7, 3, 3], [2, 3, 10, 8]]
    graph = make_graph(nodes, [8], shapes=shapes)
    m = gr.create(graph, lib, gr.cpu())
    arrays = {name: random_array(tuple(shapes[i]), "float32", seed=i)
              for i, name in [(0, "x"), (1, "w1"), (2, "b1"), (4, "w2"), (5, "b2"), (7, "w3")]}
    m.set_input(**arrays)
    m.run()
    a = {k: v.astype(np.float64) for k, v in arrays.items()}
    y1 = np.maximum(ref_conv2d_attrs(a["x"], a["w1"], {"padding": [1], "strides": [2, 2]})
                    + a["b1"], 0)
    y2 = np.maximum(_ref(y1, a["w2"], {"strides": [2, 2]}) + a["b2"], 0)
    want = ref_conv2d_attrs(y2, a["w3"], {"padding": [1]})
    np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=2e-5,
                               atol=2e-5 * float(np.abs(want).max()))
    g = m.executor.graph
    kept = {g.nodes[nid].name for nid in range(len(g.nodes))
            if g.entry_id(nid, 0) in m.executor.channels_last}
    assert kept == {"down", "up"}
    deconv = m.executor.steps[1].kernel
    assert isinstance(deconv, OnednnDeconv)
    assert deconv.data_in is None and deconv.out is None
    debug = m.debug_get_outputs()
    for name, value in (("down", y1), ("up", y2)):
        np.testing.assert_allclose(debug[name][0], value, rtol=2e-5,
                                   atol=2e-5 * float(np.abs(value).max()))


# -- the choice, and without oneDNN -------------------------------------------------------------

def test_auto_times_onednn_against_numpy(on, monkeypatch, random_array) -> None:
    """In auto mode the tuning service picks oneDNN's or the NumPy kernel per shape; either
    computes the op."""
    from graph_runtime.lib import tuning
    monkeypatch.setenv(binding.ONEDNN_ENV, "auto")
    tuning.clear()
    x = random_array((1, 16, 8, 8), "float32", seed=1)
    w = random_array((16, 8, 2, 2), "float32", seed=2)
    b = random_array((8, 1, 1), "float32", seed=3)
    attrs = {"strides": [2, 2]}
    _, got = _prepared([{"op": "conv2d_transpose", **attrs}, {"op": "add"}], [x, w, b])
    _check(got, _ref(x, w, attrs) + b, _bound(x, w, attrs, 1, 1.0))
    chosen = [e for e in tuning.remembered() if e.choice == "cpu.onednn_conv2d_transpose"]
    assert len(chosen) == 1 and "epilogue add" in chosen[0].key, chosen
    assert set(chosen[0].seconds) == {"on", "off"}


def test_setting_off_keeps_the_numpy_kernel(monkeypatch, random_array) -> None:
    """GRAPH_RUNTIME_ONEDNN=off: today's NumPy kernel, the fused tail applied after it."""
    monkeypatch.setenv(binding.ONEDNN_ENV, "off")
    x = random_array((2, 6, 5, 4), "float32", seed=1)
    w = random_array((6, 4, 3, 3), "float32", seed=2)
    b = random_array((8, 1, 1), "float32", seed=3)
    attrs = {"strides": [2, 2], "padding": [1], "groups": 2, "output_padding": [1, 0]}
    kernel, got = _prepared([{"op": "conv2d_transpose", **attrs}], [x, w])
    assert not isinstance(kernel, OnednnDeconv)
    _check(got, _ref(x, w, attrs), _bound(x, w, attrs))
    kernel, got = _prepared([{"op": "conv2d_transpose", **attrs}, {"op": "add"},
                             {"op": "relu"}], [x, w, b])
    assert not isinstance(kernel, OnednnDeconv)
    _check(got, np.maximum(_ref(x, w, attrs) + b, 0), _bound(x, w, attrs, 1, 1.0))


def test_float64_with_a_fused_tail_stays_numpy(run_op, random_array) -> None:
    """float64 never goes to oneDNN: the NumPy kernel, then the chain's tail on its output."""
    x = random_array((1, 4, 5, 6), "float64", seed=1)
    w = random_array((4, 3, 3, 3), "float64", seed=2)
    b = random_array((3, 1, 1), "float64", seed=3)
    r = random_array((1, 3, 10, 13), "float64", seed=4)
    attrs = {"strides": [2, 2], "output_padding": [0, 1], "padding": [1, 1, 0, 0]}
    (got,) = run_op("cpu", {"ops": [{"op": "conv2d_transpose", **attrs}, {"op": "add"},
                                    {"op": "add"}, {"op": "relu"}]}, [x, w, b, r])
    np.testing.assert_allclose(got, np.maximum(_ref(x, w, attrs) + b + r, 0), rtol=1e-12,
                               atol=1e-12)
