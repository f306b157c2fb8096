"""The compiled silu pass (lib/kernels/cpu/silu_pass.py) a oneDNN conv runs for its last silu.

The pass against float64, edges included, and oneDNN convs ending in silu (whole batches on the
OpenMP team, bands on the workers, NHWC neighbours, the NCHW-data first conv, a residual before
the silu) against float64 NumPy; a silu before another op stays oneDNN's post-op.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import require_onednn
from test_conv import ref_conv2d_attrs

from graph_runtime.lib.kernels.cpu import silu_pass
from graph_runtime.lib.library import TensorSpec
from graph_runtime.settings import CONV, NUM_THREADS, ONEDNN_THREADS

U32 = float(np.finfo(np.float32).eps) / 2


def _silu64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        x = x.astype(np.float64)
        return x / (1.0 + np.exp(-x))


def test_the_pass_is_within_two_ulps_of_float64_with_numpys_edges() -> None:
    """Over a grid through every region of the logistic (tiny results, the turn, saturation)
    and NumPy's answers at 0, -0, +-inf and NaN."""
    grid = np.linspace(-110.0, 110.0, 400_001).astype(np.float32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 88.8, -88.8, 1e-30, -1e-30],
                     np.float32)
    x = np.concatenate([grid, edges])
    got = x.copy()
    silu_pass.silu_in_place(got)
    want = _silu64(x)
    # below x = -88.7, e^-x overflows float32 and the result is -0 (as in float32 NumPy):
    # results under 1e-30 are held to an absolute bound
    finite = np.isfinite(want) & (np.abs(want) >= 1e-30)
    err = np.abs(got[finite] - want[finite]) / np.abs(want[finite])
    assert err.max() <= 4 * U32, float(err.max())
    tiny = ~finite & np.isfinite(want)
    assert np.all(np.abs(got[tiny] - want[tiny]) <= 1e-30)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got[-9:-4], np.float32(x[-9:-4]) * (
            1 / (1 + np.exp(-x[-9:-4].astype(np.float64)))).astype(np.float32))
    assert np.isnan(got[-6]) and np.isnan(got[-5])  # -inf * 0 and NaN, as NumPy gives them


@pytest.mark.parametrize("count", [1, 15, 16, 17, 1000, 4099])
def test_a_band_on_the_team_covers_every_value_once(count) -> None:
    """The team's threads split a band by whole cache lines: every value is done once, the
    values around the band are left alone, whatever the count."""
    require_onednn()
    x = np.random.default_rng(count).standard_normal(count + 32).astype(np.float32)
    want = x.copy()
    want[16:16 + count] = _silu64(x[16:16 + count])
    band = silu_pass.SiluBand(count, on_team=True)
    band.bind_address(x.ctypes.data + 64)
    band.run()
    np.testing.assert_allclose(x, want, rtol=4 * U32, atol=0)


CASES = [  # (data, weight, attrs, with a residual add before the silu)
    ((2, 16, 24, 20), (64, 16, 1, 1), {}, False),
    ((1, 32, 30, 26), (32, 1, 3, 3), {"padding": [1], "groups": 32}, False),  # depthwise
    ((2, 3, 33, 31), (16, 3, 3, 3), {"padding": [1], "strides": [2, 2]}, False),  # first conv
    ((1, 24, 17, 19), (24, 24, 3, 3), {"padding": [1]}, True),
]


def _conv_bias_chain(case: int) -> tuple[np.ndarray, list[TensorSpec], list[Any]]:
    """CASES[case]'s conv output (zeros, for its shape), the chain's input specs and its steps
    up to the silu: conv2d, the bias add, and the residual add where the case has one."""
    from graph_runtime.lib.chain import Step
    data, weight, attrs, residual = CASES[case]
    conv = ref_conv2d_attrs(np.zeros(data), np.zeros(weight), attrs)
    specs = [TensorSpec(data, "float32"), TensorSpec(weight, "float32"),
             TensorSpec((weight[0], 1, 1), "float32")]
    steps = [Step("conv2d", attrs), Step("add")]
    if residual:
        specs.append(TensorSpec(conv.shape, "float32"))
        steps.append(Step("add"))
    return conv, specs, steps


@pytest.mark.parametrize("mode", ["workers", "openmp"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_conv_ending_in_silu_leaves_it_to_the_pass(monkeypatch, case, mode,
                                                     random_array) -> None:
    """conv -> add bias (-> add residual) -> silu: one oneDNN conv without the swish post-op,
    its silu pass over the rows, equal to float64 NumPy; in bands on the workers too."""
    import graph_runtime as gr
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.lib.kernels.onednn import binding as onednn_binding
    from graph_runtime.lib.kernels.onednn import conv as onednn_conv

    require_onednn()
    monkeypatch.setenv(CONV.name, "onednn")
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    monkeypatch.setattr(onednn_conv, "MIN_SPLIT_FLOPS", 0)  # bands even for these sizes
    data, weight, attrs, residual = CASES[case]
    conv, specs, steps = _conv_bias_chain(case)
    chain = Chain("f", steps + [Step("silu")])
    kernel = chain.prepare(gr.cpu(), specs, chain.infer(specs), {})
    assert isinstance(kernel, onednn_conv.OnednnConv), kernel
    assert kernel.silu_after and "silu pass" in repr(kernel)
    out = np.empty(conv.shape, np.float32)
    if data[1] == 3:  # an NHWC output: oneDNN's first-conv kernel reads the NCHW data itself
        kernel.use_channels_last({kernel.out_position})
        n, c, h, w = conv.shape
        out = np.empty((n, h, w, c), np.float32).transpose(0, 3, 1, 2)
        # NHWC's bytes for one channel block only; whole images only (bands on the workers)
        block = onednn_binding.channel_block()
        if mode == "openmp":
            assert (kernel.nchw_data is not None) == (weight[0] == block)
    bands = kernel.silu_bands if kernel.nchw_data is None else kernel.nchw_data.silu_bands
    if mode == "openmp":  # one primitive over the batch, its silu on the same team
        assert [b.on_team for b in bands] == [True]
    else:  # single-threaded items on the workers, each with its rows' silu
        assert len(bands) > 1 and not any(b.on_team for b in bands)
    arrays = [random_array(s.shape, "float32", seed=k) for k, s in enumerate(specs)]
    a = [x.astype(np.float64) for x in arrays]
    pre = ref_conv2d_attrs(a[0], a[1], attrs) + a[2]
    if residual:
        pre = pre + a[3]
    want = _silu64(pre)
    bound = (np.abs(ref_conv2d_attrs(np.abs(a[0]), np.abs(a[1]), attrs)) + np.abs(a[2])
             + (np.abs(a[3]) if residual else 0))
    terms = weight[1] * weight[2] * weight[3] + 2
    tolerance = terms * U32 * bound + 8 * U32 * np.abs(want) + 1e-30
    for _ in range(2):  # the second run over the same arrays: the addresses bound already
        out[...] = np.nan
        kernel(*arrays, out)
        np.testing.assert_array_less(np.abs(out - want), tolerance)


def test_a_silu_before_another_op_stays_onednns_post_op(monkeypatch) -> None:
    """conv -> silu -> add: the silu is not last, so oneDNN's swish post-op applies it."""
    import graph_runtime as gr
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.lib.kernels.onednn.conv import OnednnConv

    require_onednn()
    monkeypatch.setenv(CONV.name, "onednn")
    specs = [TensorSpec((1, 8, 6, 6), "float32"), TensorSpec((8, 8, 1, 1), "float32"),
             TensorSpec((8, 1, 1), "float32")]
    chain = Chain("f", [Step("conv2d"), Step("silu"), Step("add")])
    kernel = chain.prepare(gr.cpu(), specs, chain.infer(specs), {})
    assert isinstance(kernel, OnednnConv) and not kernel.silu_after and not kernel.silu_bands


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_swish_post_op_is_a_candidate_of_its_own(monkeypatch, case, random_array) -> None:
    """A conv ending in silu is offered oneDNN twice, the silu as the pass (onednn) or as the
    swish post-op (onednn_swish), which the tuning service races; forced, the post-op one
    computes the same float64 answer with no pass. A conv without a last silu is offered only
    onednn, and forcing onednn_swish keeps oneDNN for it."""
    import graph_runtime as gr
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.lib.kernels.conv_epilogue import Epilogue, EpilogueOp
    from graph_runtime.lib.kernels.cpu.conv_choice import candidates
    from graph_runtime.lib.kernels.onednn.conv import OnednnConv

    require_onednn()
    data, weight, attrs, residual = CASES[case]
    conv, specs, steps = _conv_bias_chain(case)
    monkeypatch.setenv(CONV.name, "onednn_swish")
    chain = Chain("f", steps + [Step("silu")])
    kernel = chain.prepare(gr.cpu(), specs, chain.infer(specs), {})
    assert isinstance(kernel, OnednnConv) and kernel.strategy == "onednn_swish", kernel
    assert not kernel.silu_after and not kernel.silu_bands and "silu pass" not in repr(kernel)
    arrays = [random_array(s.shape, "float32", seed=k) for k, s in enumerate(specs)]
    a = [x.astype(np.float64) for x in arrays]
    pre = ref_conv2d_attrs(a[0], a[1], attrs) + a[2] + (a[3] if residual else 0)
    want = _silu64(pre)
    bound = (np.abs(ref_conv2d_attrs(np.abs(a[0]), np.abs(a[1]), attrs)) + np.abs(a[2])
             + (np.abs(a[3]) if residual else 0))
    # oneDNN's swish: its own exp and division, a few ulps of the result beside the sum's
    tolerance = (weight[1] * weight[2] * weight[3] + 2) * U32 * bound \
        + 64 * U32 * np.abs(want) + 1e-30
    out = np.full(conv.shape, np.nan, np.float32)
    kernel(*arrays, out)
    np.testing.assert_array_less(np.abs(out - want), tolerance)

    relu = Chain("g", steps + [Step("relu")])
    other = relu.prepare(gr.cpu(), specs, relu.infer(specs), {})
    assert isinstance(other, OnednnConv) and other.strategy == "onednn", other
    n, o = data[0], weight[0]
    p = kernel.p
    ops = [EpilogueOp("add", operand=0, shape=(1, o, 1, 1)), EpilogueOp("silu")]
    out_shape = (n, o, p.oh, p.ow)
    assert {"onednn", "onednn_swish"} <= set(candidates(p, Epilogue(tuple(ops), out_shape)))
    assert "onednn_swish" not in candidates(p, Epilogue(tuple(ops[:1]), out_shape))
