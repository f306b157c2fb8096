"""Each CPU conv2d strategy (lib/kernels/conv_choice.py) forced, against float64 references.

Also the fused epilogues a chain hands conv2d, the choice itself, and that weights derived
once (Winograd's transformed filters, im2col's bias-augmented matrix) follow every way a weight
can change between runs.
"""
from __future__ import annotations

import numpy as np
import pytest
from support import make_graph, null, tvm_op
from test_conv import SUM_TOLERANCES, ref_conv2d_attrs

import graph_runtime as gr
from graph_runtime.errors import LibraryError
from graph_runtime.lib import Module
from graph_runtime.lib.chain import Chain, Step
from graph_runtime.lib.conv_params import conv2d_params
from graph_runtime.lib.kernels.cpu import depthwise_jit, winograd
from graph_runtime.lib.kernels.conv_kernel import ConvKernel
from graph_runtime.lib.kernels.cpu.conv_choice import (STRATEGIES, applicable, candidates,
                                                      conv2d_cpu)
from graph_runtime.lib.kernels.conv_epilogue import Epilogue
from graph_runtime.lib.kernels.cpu.depthwise_jit import DepthwiseJitConv, fold_epilogue
from graph_runtime.lib.kernels.threads import num_threads
from graph_runtime.lib.kernels.winograd_math import MATRICES
from graph_runtime.lib.library import TensorSpec
from graph_runtime.settings import CONV, NUM_THREADS

# (data shape, weight shape, attrs): odd sizes, asymmetric padding, strides, dilation, groups,
# depthwise with and without a channel multiplier, 1x1, batches > 1, a tile-overhanging size.
CASES = [
    ((2, 3, 7, 9), (5, 3, 3, 3), {"padding": [1, 1]}),
    ((1, 4, 8, 8), (6, 4, 3, 3), {"padding": [0, 1, 2, 0]}),
    ((3, 5, 5, 6), (4, 5, 3, 3), {}),
    ((1, 6, 11, 10), (7, 6, 3, 3), {"padding": [1]}),
    ((2, 4, 5, 5), (8, 4, 1, 1), {}),
    ((2, 6, 5, 7), (6, 2, 1, 1), {"groups": 3}),
    ((2, 4, 7, 6), (8, 1, 3, 3), {"groups": 4, "padding": [1], "strides": [2, 1]}),
    ((1, 3, 9, 9), (3, 1, 3, 3), {"groups": 3, "padding": [1], "dilation": [2, 2]}),
    ((2, 4, 7, 6), (6, 2, 3, 2), {"strides": [2, 1], "padding": [1, 0, 2, 1],
                                  "dilation": [1, 2], "groups": 2}),
    ((1, 2, 5, 4), (3, 2, 2, 3), {"padding": [2, 1], "strides": [3, 2]}),
    ((1, 6, 5, 7), (9, 6, 1, 1), {}),  # batch-1 1x1 split over output rows
    ((1, 4, 2, 3), (16, 4, 1, 1), {}),  # ... and over output channels (more than pixels)
    ((1, 5, 3, 3), (11, 5, 3, 3), {"padding": [1]}),  # a deep layer: few pixels, channels split
]


def _params(x: np.ndarray, w: np.ndarray, attrs: dict):
    return conv2d_params([TensorSpec(x.shape, str(x.dtype)), TensorSpec(w.shape, str(w.dtype))],
                         attrs)


def _run(kernel: ConvKernel, x: np.ndarray, w: np.ndarray, *extras: np.ndarray) -> np.ndarray:
    p = kernel.p
    out = np.full((p.n, p.o, p.oh, p.ow), np.nan, x.dtype)
    kernel(x, w, *extras, out)
    return out


def _every_strategy_case():
    for data_shape, weight_shape, attrs in CASES:
        x = np.zeros(data_shape, "float32")
        w = np.zeros(weight_shape, "float32")
        for name in applicable(_params(x, w, attrs)):
            yield pytest.param(name, data_shape, weight_shape, attrs,
                               id=f"{name}-{data_shape}-{weight_shape}")


@pytest.mark.parametrize("strategy,data_shape,weight_shape,attrs", list(_every_strategy_case()))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_each_strategy_matches_the_reference(strategy, data_shape, weight_shape, attrs, dtype,
                                             random_array) -> None:
    x = random_array(data_shape, dtype, seed=1)
    w = random_array(weight_shape, dtype, seed=2)
    p = _params(x, w, attrs)
    kernel = conv2d_cpu(p, Epilogue((), (p.n, p.o, p.oh, p.ow)), strategy)
    assert kernel.strategy == strategy
    got = _run(kernel, x, w)
    np.testing.assert_allclose(got, ref_conv2d_attrs(x, w, attrs), **SUM_TOLERANCES[dtype])


def test_every_strategy_is_exercised() -> None:
    """The case table reaches every strategy the choice knows."""
    reached = set()
    for data_shape, weight_shape, attrs in CASES:
        x = np.zeros(data_shape, "float32")
        w = np.zeros(weight_shape, "float32")
        reached.update(applicable(_params(x, w, attrs)))
    # offered by conv2d_cpu: test_onednn.py, test_silu_pass.py
    missing = set(STRATEGIES) - reached - {"onednn", "onednn_swish"}
    if num_threads() == 1:
        # only offered where workers run
        missing -= {"im2col_rows", "im2col_serial", "im2col_channels", "gemm1x1_split"}
    assert not missing


def winograd_rms_bound(m: int, x: np.ndarray, w: np.ndarray) -> float:
    """Twice the RMS error float32 F(m x m, 3 x 3) is expected to make on data like x and w.

    The model: the transformed-domain sums M[xi] = sum_c U[xi, c] V[xi, c] run over C terms in
    float32, and a sequential sum of C random terms of RMS s errs by about u * s * C / sqrt(6)
    (u = 2^-24; each partial sum's rounding, partial sums growing like sqrt(j)). Blocked or
    pairwise sums do better. U[xi] = (G g G^T)[xi] has RMS |row xi of G (x) G| * rms(w), V[xi]
    likewise with B, and each output is a row of A^T (x) A^T over the a*a sums. The transforms'
    own rounding is smaller; the factor 2 leaves it room. Measured here (AMD EPYC: PoCL and the
    CPU's OpenBLAS) both backends stayed within 0.6-0.9 of the estimate itself.
    """
    bt, g, at = MATRICES[m]
    out_rows, g_rows, b_rows = np.kron(at, at), np.kron(g, g), np.kron(bt, bt)
    per_sum = (np.linalg.norm(g_rows, axis=1) * np.linalg.norm(b_rows, axis=1)) ** 2
    amplification = np.sqrt(np.mean(out_rows ** 2 @ per_sum))
    rms_x = np.sqrt(np.mean(np.square(x, dtype=np.float64)))
    rms_w = np.sqrt(np.mean(np.square(w, dtype=np.float64)))
    channels = x.shape[1]
    return float(2 * 2.0 ** -24 * channels / np.sqrt(6) * amplification * rms_x * rms_w)


@pytest.mark.parametrize("m", ["winograd", "winograd4"])
def test_winograd_holds_many_channels(m, random_array) -> None:
    """F(4x4,3x3)'s larger constants lose bits as C grows: still within conv's float32 tolerance,
    and within the RMS error float32 Winograd of this size is expected to make."""
    x = random_array((1, 128, 12, 12), "float32", seed=3)
    w = random_array((8, 128, 3, 3), "float32", seed=4)
    p = _params(x, w, {"padding": [1]})
    got = _run(conv2d_cpu(p, Epilogue((), (1, 8, 12, 12)), m), x, w)
    want = ref_conv2d_attrs(x, w, {"padding": [1]})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.sqrt(128 * 9 / 27))
    bound = winograd_rms_bound(4 if m == "winograd4" else 2, x, w)
    assert np.sqrt(np.mean((got - want) ** 2)) <= bound


def test_forced_strategy_that_does_not_apply_falls_back_to_im2col() -> None:
    x = np.zeros((1, 2, 5, 5), "float32")
    w = np.zeros((3, 2, 2, 2), "float32")
    p = _params(x, w, {})
    assert conv2d_cpu(p, Epilogue((), (1, 3, 4, 4)), "winograd").strategy == "im2col"


def test_env_var_forces_and_rejects(monkeypatch, run_op, random_array) -> None:
    x = random_array((2, 4, 6, 6), "float32", seed=5)
    w = random_array((4, 4, 3, 3), "float32", seed=6)
    attrs = {"padding": [1]}
    for name in ("im2col", "winograd", "winograd4"):
        monkeypatch.setenv(CONV.name, name)
        (got,) = run_op("cpu", "conv2d", [x, w], attrs)
        np.testing.assert_allclose(got, ref_conv2d_attrs(x, w, attrs), **SUM_TOLERANCES["float32"])
    monkeypatch.setenv(CONV.name, "fastest")
    with pytest.raises(LibraryError, match="GRAPH_RUNTIME_CONV must be auto or one of"):
        run_op("cpu", "conv2d", [x, w], attrs)


def test_auto_picks_an_applicable_strategy(monkeypatch) -> None:
    monkeypatch.setenv(CONV.name, "auto")
    x = np.zeros((2, 8, 10, 10), "float32")
    w = np.zeros((8, 8, 3, 3), "float32")
    p = _params(x, w, {"padding": [1]})
    kernel = conv2d_cpu(p, Epilogue((), (2, 8, 10, 10)))
    assert kernel.strategy in candidates(p, Epilogue((), (2, 8, 10, 10)))
    assert kernel.workspace_bytes() > 0


# -- fused epilogues ---------------------------------------------------------------------------

EPILOGUES = {
    "bias_relu": ([{"op": "add"}, {"op": "relu"}], lambda y, b, r: np.maximum(y + b, 0), "bias"),
    "bias_relu6": ([{"op": "add"}, {"op": "clip", "a_min": 0.0, "a_max": 6.0}],
                   lambda y, b, r: np.clip(y + b, 0, 6), "bias"),
    "bias_residual_relu": ([{"op": "add"}, {"op": "add"}, {"op": "relu"}],
                           lambda y, b, r: np.maximum(y + b + r, 0), "both"),
    "relu_then_bias": ([{"op": "relu"}, {"op": "add"}], lambda y, b, r: np.maximum(y, 0) + b,
                       "bias"),
    "residual": ([{"op": "add"}], lambda y, b, r: y + r, "residual"),
    "bias_leaky_relu": ([{"op": "add"}, {"op": "leaky_relu", "alpha": 0.2}],
                        lambda y, b, r: np.where(y + b < 0, 0.2 * (y + b), y + b), "bias"),
    "bias_sigmoid": ([{"op": "add"}, {"op": "sigmoid"}], lambda y, b, r: 1 / (1 + np.exp(-y - b)),
                     "bias"),
    "bias_silu": ([{"op": "add"}, {"op": "silu"}], lambda y, b, r: (y + b) / (1 + np.exp(-y - b)),
                  "bias"),
    "bias_hard_swish": ([{"op": "add"}, {"op": "hard_swish"}],
                        lambda y, b, r: (y + b) * np.clip((y + b) / 6 + 0.5, 0, 1), "bias"),
    "residual_gelu": ([{"op": "add"}, {"op": "gelu"}], lambda y, b, r: _gelu(y + r), "residual"),
    "bias_gelu_tanh": ([{"op": "add"}, {"op": "gelu", "approximate": "tanh"}],
                       lambda y, b, r: _gelu_tanh(y + b), "bias"),
}


def _gelu(x):
    from scipy.special import erf
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("strategy", ["im2col", "im2col_rows", "im2col_channels",
                                      "im2col_serial", "winograd", "winograd4", "gemm1x1",
                                      "gemm1x1_split", "depthwise", "depthwise_jit"])
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
@pytest.mark.parametrize("batch", [1, 2])
def test_fused_epilogue(monkeypatch, strategy, epilogue, batch, run_op, random_array) -> None:
    ops, reference, operands = EPILOGUES[epilogue]
    if strategy.startswith("gemm1x1"):
        data_shape, weight_shape, attrs = (batch, 4, 5, 6), (6, 4, 1, 1), {}
    elif strategy in ("depthwise", "depthwise_jit"):
        data_shape, weight_shape, attrs = (batch, 3, 7, 6), (6, 1, 3, 3), {"groups": 3,
                                                                           "padding": [1]}
    else:
        data_shape, weight_shape, attrs = (batch, 4, 7, 6), (6, 4, 3, 3), {"padding": [1]}
    monkeypatch.setenv(CONV.name, strategy)
    x = random_array(data_shape, "float32", seed=7)
    w = random_array(weight_shape, "float32", seed=8)
    y = ref_conv2d_attrs(x, w, attrs)
    bias = random_array((y.shape[1], 1, 1), "float32", seed=9)
    residual = random_array(y.shape, "float32", seed=10)
    inputs = [x, w] + {"bias": [bias], "residual": [residual], "both": [bias, residual]}[operands]
    func = {"ops": [{"op": "conv2d", **attrs}] + ops}
    (got,) = run_op("cpu", func, inputs)
    want = reference(y, bias.astype(np.float64), residual.astype(np.float64))
    np.testing.assert_allclose(got, want, **SUM_TOLERANCES["float32"])


def test_chain_hands_its_tail_to_the_conv() -> None:
    """conv2d -> add -> relu prepares as one conv kernel writing the node's output."""
    chain = Chain("f", [Step("conv2d", {"padding": [1, 1]}), Step("add"), Step("relu")])
    specs = [TensorSpec((1, 3, 8, 8), "float32"), TensorSpec((4, 3, 3, 3), "float32"),
             TensorSpec((4, 1, 1), "float32")]
    fn = chain.prepare(gr.cpu(), specs, chain.infer(specs), {})
    assert isinstance(fn, ConvKernel)
    assert [op.kind for op in fn.epilogue.ops] == ([] if fn.strategy.startswith("im2col")
                                                   else ["add"]) + ["relu"]


def test_chain_after_the_tail_keeps_running(run_op, random_array) -> None:
    """Ops after the fused tail (a pool) still get the conv's result."""
    x = random_array((2, 3, 6, 6), "float32", seed=11)
    w = random_array((4, 3, 3, 3), "float32", seed=12)
    b = random_array((4, 1, 1), "float32", seed=13)
    func = {"ops": [{"op": "conv2d", "padding": [1]}, {"op": "add"}, {"op": "relu"},
                    {"op": "max_pool2d", "pool_size": [2, 2], "strides": [2, 2]}]}
    (got,) = run_op("cpu", func, [x, w, b])
    y = np.maximum(ref_conv2d_attrs(x, w, {"padding": [1]}) + b, 0)
    want = y.reshape(2, 4, 3, 2, 3, 2).max(axis=(3, 5))
    np.testing.assert_allclose(got, want, **SUM_TOLERANCES["float32"])


# -- the compiled depthwise loop (lib/kernels/cpu/depthwise_jit.py, loops_jit.py) -----------

# (data shape, channel multiplier, kernel, attrs): odd sizes, asymmetric padding, strides 1, 2
# and 3, dilation, kernels 1 to 5 (3x3 has its own fused path), images smaller than the window's
# reach, batches > 1, enough channels to be split over workers.
DEPTHWISE_CASES = [
    ((1, 5, 9, 11), 1, (3, 3), {"padding": [1]}),
    ((2, 3, 8, 7), 2, (3, 3), {"padding": [0, 1, 2, 0]}),
    ((3, 4, 13, 10), 1, (3, 3), {"padding": [1], "strides": [2, 2]}),
    ((1, 6, 12, 12), 1, (3, 3), {"padding": [2, 1, 0, 3], "strides": [2, 1], "dilation": [2, 2]}),
    ((1, 3, 11, 14), 3, (3, 3), {"padding": [1, 2], "strides": [3, 3], "dilation": [1, 2]}),
    ((2, 2, 2, 3), 1, (3, 3), {"padding": [1]}),
    ((1, 4, 9, 9), 1, (5, 5), {"padding": [2]}),
    ((2, 3, 10, 7), 2, (5, 3), {"padding": [1, 0, 3, 2], "strides": [2, 2]}),
    ((1, 2, 6, 8), 1, (1, 1), {"strides": [2, 2]}),
    ((1, 4, 7, 7), 1, (2, 4), {"padding": [1, 2, 0, 1], "dilation": [2, 1], "strides": [1, 2]}),
    ((1, 40, 6, 5), 1, (3, 3), {"padding": [1]}),
]

# name -> (chain ops after the conv, operand shapes (K: channels, Y: the output), reference)
DEPTHWISE_EPILOGUES = {
    "none": ([], [], lambda y, ops: y),
    "bias_relu": ([("add", 0), ("relu", None)], ["K11"], lambda y, ops: np.maximum(y + ops[0], 0)),
    "bias_clip": ([("add", 0), ("clip", (-0.5, 0.75))], ["K11"],
                  lambda y, ops: np.clip(y + ops[0], -0.5, 0.75)),
    "bias_residual_relu": ([("add", 0), ("add", 1), ("relu", None)], ["K11", "Y"],
                           lambda y, ops: np.maximum(y + ops[0] + ops[1], 0)),
    "residual_row_clip": ([("add", 0), ("clip", (-1.0, 1.0))], ["1W"],
                          lambda y, ops: np.clip(y + ops[0], -1, 1)),
    "relu_clip": ([("add", 0), ("relu", None), ("clip", (-1.0, 0.5))], ["K11"],
                  lambda y, ops: np.clip(np.maximum(y + ops[0], 0), -1, 0.5)),
    "clip_then_residual": ([("add", 0), ("clip", (-1.0, 1.0)), ("add", 1), ("relu", None)],
                           ["K11", "Y"],
                           lambda y, ops: np.maximum(np.clip(y + ops[0], -1, 1) + ops[1], 0)),
}


def _operand_shape(code: str, out_shape: tuple[int, ...]) -> tuple[int, ...]:
    _, k, _, ow = out_shape
    return {"K11": (k, 1, 1), "Y": out_shape, "1W": (1, ow)}[code]


@pytest.mark.parametrize("epilogue", sorted(DEPTHWISE_EPILOGUES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("data_shape,multiplier,kernel,attrs", DEPTHWISE_CASES)
def test_depthwise_jit(data_shape, multiplier, kernel, attrs, dtype, epilogue,
                       random_array) -> None:
    c = data_shape[1]
    attrs = dict(attrs, groups=c)
    x = random_array(data_shape, dtype, seed=31)
    w = random_array((c * multiplier, 1) + kernel, dtype, seed=32)
    p = _params(x, w, attrs)
    y = ref_conv2d_attrs(x, w, attrs)
    ops, codes, reference = DEPTHWISE_EPILOGUES[epilogue]
    operands = [random_array(_operand_shape(code, y.shape), dtype, seed=33 + i)
                for i, code in enumerate(codes)]
    kernel_ = conv2d_cpu(p, Epilogue.build(ops, [o.shape for o in operands], y.shape),
                         "depthwise_jit")
    assert kernel_.strategy == "depthwise_jit"
    got = _run(kernel_, x, w, *operands)
    want = reference(y, [o.astype(np.float64) for o in operands])
    np.testing.assert_allclose(got, want, **SUM_TOLERANCES[dtype])


@pytest.mark.parametrize("epilogue", ["bias_residual_relu", "clip_then_residual"])
@pytest.mark.parametrize("data_shape", [(1, 7, 6, 5), (2, 5, 5, 6)])
def test_depthwise_jit_split_over_workers(monkeypatch, data_shape, epilogue,
                                          random_array) -> None:
    """Channel ranges handed to 3 workers (small convs run on one: forced here) cover every
    output once; an epilogue left over for apply() takes whole images."""
    monkeypatch.setenv(NUM_THREADS.name, "3")
    monkeypatch.setattr(depthwise_jit, "SERIAL_OUTPUTS", 0)
    c = data_shape[1]
    attrs = {"groups": c, "padding": [1], "strides": [2, 1]}
    x = random_array(data_shape, "float32", seed=36)
    w = random_array((2 * c, 1, 3, 3), "float32", seed=37)
    y = ref_conv2d_attrs(x, w, attrs)
    ops, codes, reference = DEPTHWISE_EPILOGUES[epilogue]
    operands = [random_array(_operand_shape(code, y.shape), "float32", seed=38 + i)
                for i, code in enumerate(codes)]
    kernel = DepthwiseJitConv(_params(x, w, attrs),
                              Epilogue.build(ops, [o.shape for o in operands], y.shape))
    assert kernel.chunks == (1 if kernel.epilogue.ops else -(-9 // data_shape[0]))
    assert kernel.workers == min(3, data_shape[0] * kernel.chunks)
    got = _run(kernel, x, w, *operands)
    want = reference(y, [o.astype(np.float64) for o in operands])
    np.testing.assert_allclose(got, want, **SUM_TOLERANCES["float32"])


def test_depthwise_jit_folds_the_epilogue_into_its_loop() -> None:
    """bias, one add and the clamps after it go into the loop; what follows stays for apply."""
    shape = (1, 4, 5, 5)
    fused = Epilogue.build([("add", 0), ("add", 1), ("relu", None), ("clip", (-2.0, 6.0))],
                           [(4, 1, 1), shape], shape)
    bias, residual, lo, hi, rest = fold_epilogue(fused)
    assert (bias, residual.operand, lo, hi, rest.ops) == (0, 1, 0.0, 6.0, ())
    # clip(relu(y), 5, 3) is 3 everywhere, as np.clip gives for lo > hi
    assert fold_epilogue(Epilogue.build([("relu", None), ("clip", (5.0, 3.0))], [], shape))[2:4] \
        == (5.0, 3.0)
    left = Epilogue.build([("relu", None), ("add", 0)], [(4, 1, 1)], shape)
    bias, residual, lo, hi, rest = fold_epilogue(left)
    assert (bias, residual, lo, hi) == (None, None, 0.0, np.inf)
    assert [op.kind for op in rest.ops] == ["add"]


def test_depthwise_jit_keeps_nan_as_numpy_does(random_array) -> None:
    """fastmath stays off: a NaN in the data reaches the output through relu and clip."""
    x = random_array((1, 2, 6, 6), "float32", seed=34)
    x[0, 1, 2, 3] = np.nan
    w = random_array((2, 1, 3, 3), "float32", seed=35)
    p = _params(x, w, {"groups": 2, "padding": [1]})
    epilogue = Epilogue.build([("relu", None), ("clip", (0.0, 6.0))], [], (1, 2, 6, 6))
    got = _run(DepthwiseJitConv(p, epilogue), x, w)
    want = np.clip(np.maximum(ref_conv2d_attrs(x, w, {"groups": 2, "padding": [1]}), 0), 0, 6)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).sum() == 9
    np.testing.assert_allclose(got, want, **SUM_TOLERANCES["float32"])


# -- weights changed between runs --------------------------------------------------------------

def _conv_module(strategy: str, monkeypatch) -> gr.GraphModule:
    monkeypatch.setenv(CONV.name, strategy)
    lib = Module("convlib")
    lib.register("fused_conv", Chain("fused_conv", [Step("conv2d", {"padding": [1, 1]}),
                                                    Step("add"), Step("relu")]))
    nodes = [null("data"), null("weight"), null("bias"),
             tvm_op("conv", "fused_conv", [0, 1, 2])]
    graph = make_graph(nodes, [3], shapes=[[2, 4, 6, 6], [5, 4, 3, 3], [5, 1, 1], [2, 5, 6, 6]])
    return gr.create(graph, lib, gr.cpu())


def _expected(x, w, b) -> np.ndarray:
    return np.maximum(ref_conv2d_attrs(x, w, {"padding": [1]}) + b, 0)


@pytest.mark.parametrize("strategy", ["im2col", "winograd", "winograd4"])
def test_no_stale_weights(monkeypatch, strategy, random_array) -> None:
    m = _conv_module(strategy, monkeypatch)
    x = random_array((2, 4, 6, 6), "float32", seed=14)
    weights = [random_array((5, 4, 3, 3), "float32", seed=s) for s in (15, 16, 17, 18, 19)]
    biases = [random_array((5, 1, 1), "float32", seed=s) for s in (20, 21, 22, 23, 24)]
    tol = SUM_TOLERANCES["float32"]

    def check(w, b) -> None:
        m.run(data=x)
        np.testing.assert_allclose(m.get_output(0).numpy(), _expected(x, w, b), **tol)

    m.load_params({"weight": weights[0], "bias": biases[0]})
    check(weights[0], biases[0])
    check(weights[0], biases[0])  # the cached transform is reused
    m.set_input("weight", weights[1])
    check(weights[1], biases[0])
    m.load_params({"bias": biases[1]})
    check(weights[1], biases[1])
    m.load_params(gr.save_param_dict({"weight": weights[2]}))
    check(weights[2], biases[1])
    m.get_input("weight").native[...] = weights[3]  # writes through the returned view
    check(weights[3], biases[1])
    m.set_input("weight", weights[3])
    own = weights[4].copy()
    m.set_input_zero_copy("weight", own)
    check(weights[4], biases[1])
    own[...] = weights[0]  # the bound array changes in place: no setter sees it
    check(weights[0], biases[1])


def check_weight_computed_by_a_node(device: str, random_array) -> None:
    """conv(data, w0 * k) for three k: a weight produced by another node changes every run
    (its counter is volatile), so a kernel deriving data from it must redo that each run."""
    lib = Module("convlib")
    lib.register("scale", Chain("scale", [Step("multiply")]), device=device)
    lib.register("conv", Chain("conv", [Step("conv2d", {"padding": [1, 1]})]), device=device)
    nodes = [null("data"), null("w0"), null("k"), tvm_op("w", "scale", [1, 2]),
             tvm_op("conv", "conv", [0, 3])]
    graph = make_graph(nodes, [4], shapes=[[1, 2, 5, 5], [3, 2, 3, 3], [1], [3, 2, 3, 3],
                                           [1, 3, 5, 5]])
    m = gr.create(graph, lib, gr.device(device))
    x = random_array((1, 2, 5, 5), "float32", seed=25)
    w0 = random_array((3, 2, 3, 3), "float32", seed=26)
    m.load_params({"w0": w0})
    for k in (1.0, 2.0, -3.0):
        m.run(data=x, k=np.array([k], "float32"))
        want = ref_conv2d_attrs(x, w0 * k, {"padding": [1]})
        np.testing.assert_allclose(m.get_output(0).numpy(), want, **SUM_TOLERANCES["float32"])


def test_weight_computed_by_a_node_is_never_cached(monkeypatch, random_array) -> None:
    monkeypatch.setenv(CONV.name, "winograd")
    check_weight_computed_by_a_node("cpu", random_array)


def test_shared_params_follow_the_owner(monkeypatch, random_array) -> None:
    """share_params binds the other module's arrays: a write there reaches this module's conv."""
    a = _conv_module("winograd", monkeypatch)
    b = _conv_module("winograd", monkeypatch)
    x = random_array((2, 4, 6, 6), "float32", seed=27)
    w0, w1 = (random_array((5, 4, 3, 3), "float32", seed=s) for s in (28, 29))
    bias = random_array((5, 1, 1), "float32", seed=30)
    a.load_params({"weight": w0, "bias": bias})
    b.share_params(a, gr.save_param_dict({"weight": w0, "bias": bias}))
    b.run(data=x)
    np.testing.assert_allclose(b.get_output(0).numpy(), _expected(x, w0, bias),
                               **SUM_TOLERANCES["float32"])
    a.set_input("weight", w1)
    b.run(data=x)
    np.testing.assert_allclose(b.get_output(0).numpy(), _expected(x, w1, bias),
                               **SUM_TOLERANCES["float32"])


@pytest.mark.parametrize("m", ["winograd", "winograd4"])
@pytest.mark.parametrize("shape", [(1, 3, 13, 9), (2, 4, 9, 14), (1, 2, 4, 5)])
def test_winograd_bands_of_tile_rows(monkeypatch, m, shape, random_array) -> None:
    """Fewer images than workers: tile-row bands of one image go to different workers (the
    last band overhanging the image), each with its rows of a residual-add epilogue."""
    monkeypatch.setenv("GRAPH_RUNTIME_NUM_THREADS", "3")
    monkeypatch.setattr(winograd, "BAND_MIN_BYTES", 0)  # bands for small images too
    x = random_array(shape, "float32", seed=31)
    w = random_array((5, shape[1], 3, 3), "float32", seed=32)
    attrs = {"padding": [1, 0, 2, 1]}
    p = _params(x, w, attrs)
    residual = random_array((p.n, p.o, p.oh, p.ow), "float32", seed=33)
    epilogue = Epilogue.build([("add", 0), ("relu", None)], [residual.shape],
                              (p.n, p.o, p.oh, p.ow))
    kernel = conv2d_cpu(p, epilogue, m)
    assert kernel.banded and kernel.bands > 1
    got = _run(kernel, x, w, residual)
    want = np.maximum(ref_conv2d_attrs(x, w, attrs) + residual, 0)
    np.testing.assert_allclose(got, want, **SUM_TOLERANCES["float32"])
