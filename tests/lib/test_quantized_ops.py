"""Quantized ops (lib/ops/quantized.py): qconv2d and qdense on oneDNN's int8 primitives and on
the path without oneDNN, qadd, each against an exact integer NumPy reference.

The accumulator is exact integer arithmetic (int64 here); the requantization is the op's
definition in float32: float32(acc) * m + b, relu, rint, + y_zero, saturate. With power-of-two
multipliers, integer biases and an even output zero point every float step is exact, so both
paths must match bit for bit. With arbitrary multipliers oneDNN may round differently at a tie
(it adds the zero point before rounding, and may fuse the multiply-add): one step at most, and
only rarely.
"""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.lib.kernels.onednn import binding
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.ops.quantized import _qadd_cpu, _qconv2d_cpu, _qdense_cpu, qconv2d_params
from graph_runtime.settings import NUM_THREADS, ONEDNN, ONEDNN_THREADS

RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


@pytest.fixture(params=["auto", "off"])
def mode(request, monkeypatch) -> str:
    """Each kernel with oneDNN (skipped, with the reason, where it cannot load) and without."""
    monkeypatch.setenv(ONEDNN.name, request.param)
    if request.param == "auto" and not binding.available():
        pytest.skip(f"oneDNN not available: {binding.unavailable_reason()}")
    if request.param == "auto" and not binding.exact_int8():
        pytest.skip("oneDNN's int8 kernels saturate on this CPU (no VNNI): the NumPy kernels "
                    "run, as in the 'off' case")
    return request.param


def _ints(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    lo, hi = RANGES[dtype]
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def _requantize(acc: np.ndarray, m: np.ndarray, b: np.ndarray, y_zero: int, relu: bool,
                dtype: str, axis: int) -> np.ndarray:
    shape = [1] * acc.ndim
    shape[axis] = -1
    t = acc.astype(np.float32) * m.reshape(shape) + b.reshape(shape)
    if relu:
        t = np.maximum(t, np.float32(0))
    lo, hi = RANGES[dtype]
    return np.clip(np.rint(t) + np.float32(y_zero), lo, hi).astype(dtype)


def _conv_acc(x: np.ndarray, w: np.ndarray, x_zero: int, strides: tuple[int, int],
              pad: tuple[int, int, int, int], dilation: tuple[int, int], groups: int
              ) -> np.ndarray:
    """The exact int64 convolution of (x - x_zero) and w (padding contributes 0)."""
    xc = np.pad(x.astype(np.int64) - x_zero, ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    n, c, h, wd = xc.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilation
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (wd - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow), np.int64)
    for g in range(groups):
        xs = xc[:, g * cg:(g + 1) * cg]
        ws = w[g * og:(g + 1) * og].astype(np.int64)
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                           j * dw:j * dw + sw * (ow - 1) + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def _scales(rng: np.random.Generator, o: int, exact: bool, per_channel: bool
            ) -> tuple[np.ndarray, np.ndarray]:
    """(m, b): powers of two and integers (every float step exact), or arbitrary floats."""
    count = o if per_channel else 1
    if exact:
        m = 2.0 ** -rng.integers(7, 12, count)
        b = rng.integers(-40, 40, count)
    else:
        m = rng.uniform(2e-4, 2e-3, count)
        b = rng.uniform(-30, 30, count)
    return (np.broadcast_to(m, (o,)).astype(np.float32),
            np.broadcast_to(b, (o,)).astype(np.float32))


def _check(got: np.ndarray, want: np.ndarray, exact: bool) -> None:
    if exact:
        np.testing.assert_array_equal(got, want)
        return
    steps = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert steps.max() <= 1, f"{steps.max()} steps from the reference"
    assert np.count_nonzero(steps) <= max(2, got.size // 1000)


# (N, C, H, W, O, kh, kw, strides, pads (top, left, bottom, right), dilation, groups)
CONVS = [
    (1, 3, 9, 11, 5, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (2, 16, 14, 13, 24, 3, 3, (2, 2), (1, 0, 1, 2), (1, 1), 1),
    (1, 16, 10, 10, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 16),
    (1, 8, 7, 9, 12, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 2),
    (1, 6, 12, 12, 10, 3, 3, (1, 2), (2, 2, 2, 2), (2, 2), 1),
    (2, 5, 11, 7, 7, 5, 3, (2, 1), (2, 1, 2, 1), (1, 1), 1),
]


@pytest.mark.parametrize("case", CONVS, ids=[f"conv{i}" for i in range(len(CONVS))])
@pytest.mark.parametrize("x_dtype,out_dtype,x_zero,y_zero,relu,per_channel",
                         [("uint8", "uint8", 7, 6, True, True),
                          ("int8", "int8", -3, -10, False, True),
                          ("uint8", "int8", 128, 0, False, False),
                          ("int8", "uint8", 0, 100, True, False)])
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "float"])
def test_qconv2d_matches_integer_reference(mode, case, x_dtype, out_dtype, x_zero, y_zero,
                                           relu, per_channel, exact) -> None:
    n, c, h, wd, o, kh, kw, strides, pad, dilation, groups = case
    rng = np.random.default_rng(sum(case[:7]) + x_zero)
    x = _ints(rng, (n, c, h, wd), x_dtype)
    w = rng.integers(-127, 128, (o, c // groups, kh, kw)).astype(np.int8)
    m, b = _scales(rng, o, exact, per_channel)
    attrs = dict(strides=list(strides), padding=list(pad), dilation=list(dilation),
                 groups=groups, x_zero=x_zero, y_zero=y_zero, relu=relu, dtype=out_dtype)
    specs = [TensorSpec(x.shape, x_dtype), TensorSpec(w.shape, "int8"),
             TensorSpec((o,), "float32"), TensorSpec((o,), "float32")]
    p = qconv2d_params(specs, attrs)
    out = np.full((n, o, p.oh, p.ow), 3, out_dtype)
    kernel = _qconv2d_cpu(None, 0, specs, [TensorSpec(out.shape, out_dtype)], attrs)
    assert ("Int8Conv" in repr(kernel)) == (mode == "auto")
    kernel(x, w, m, b, out)
    acc = _conv_acc(x, w, x_zero, strides, pad, dilation, groups)
    _check(out, _requantize(acc, m, b, y_zero, relu, out_dtype, 1), exact or mode == "off")


def test_qconv2d_bands_nhwc_and_new_weights(monkeypatch) -> None:
    """Work items on two workers, NHWC data and output, and a weight written between runs."""
    monkeypatch.setenv(NUM_THREADS.name, "2")
    monkeypatch.setenv(ONEDNN_THREADS.name, "workers")  # items are the workers mode's split
    if not binding.available():
        pytest.skip(f"oneDNN not available: {binding.unavailable_reason()}")
    if not binding.exact_int8():
        pytest.skip("oneDNN's int8 kernels saturate on this CPU (no VNNI): not used here")
    rng = np.random.default_rng(5)
    x = _ints(rng, (2, 32, 41, 40), "uint8")
    m, b = _scales(rng, 64, True, True)
    attrs = dict(strides=[1, 1], padding=[1, 1, 1, 1], groups=1, x_zero=9, y_zero=4,
                 relu=True, dtype="uint8")
    specs = [TensorSpec(x.shape, "uint8"), TensorSpec((64, 32, 3, 3), "int8"),
             TensorSpec((64,), "float32"), TensorSpec((64,), "float32")]
    kernel = _qconv2d_cpu(None, 0, specs, [TensorSpec((2, 64, 41, 40), "uint8")], attrs)
    assert len(kernel.items) > 1
    kernel.use_channels_last((0, 4))
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    out = np.empty((2, 41, 40, 64), np.uint8).transpose(0, 3, 1, 2)
    for seed in (1, 2):
        w = np.random.default_rng(seed).integers(-127, 128, (64, 32, 3, 3)).astype(np.int8)
        kernel(x_nhwc, w, m, b, out)
        acc = _conv_acc(x, w, 9, (1, 1), (1, 1, 1, 1), (1, 1), 1)
        np.testing.assert_array_equal(out, _requantize(acc, m, b, 4, True, "uint8", 1))


@pytest.mark.parametrize("shape,n", [((3, 5, 37), 19), ((1, 2048), 1000), ((300, 512), 384)])
@pytest.mark.parametrize("x_dtype,out_dtype,x_zero,y_zero,relu",
                         [("uint8", "uint8", 128, 2, True), ("int8", "int8", -5, 0, False)])
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "float"])
def test_qdense_matches_integer_reference(mode, monkeypatch, shape, n, x_dtype, out_dtype,
                                          x_zero, y_zero, relu, exact) -> None:
    monkeypatch.setenv(NUM_THREADS.name, "2")
    rng = np.random.default_rng(n + x_zero)
    x = _ints(rng, shape, x_dtype)
    w = rng.integers(-128, 128, (shape[-1], n)).astype(np.int8)
    m, b = _scales(rng, n, exact, True)
    attrs = dict(x_zero=x_zero, y_zero=y_zero, relu=relu, dtype=out_dtype)
    specs = [TensorSpec(x.shape, x_dtype), TensorSpec(w.shape, "int8"),
             TensorSpec((n,), "float32"), TensorSpec((n,), "float32")]
    out = np.full(shape[:-1] + (n,), 3, out_dtype)
    kernel = _qdense_cpu(None, 0, specs, [TensorSpec(out.shape, out_dtype)], attrs)
    assert ("Int8Matmul" in repr(kernel)) == (mode == "auto")
    kernel(x, w, m, b, out)
    acc = (x.astype(np.int64) - x_zero) @ w.astype(np.int64)
    _check(out, _requantize(acc, m, b, y_zero, relu, out_dtype, -1), exact or mode == "off")


@pytest.mark.parametrize("a_shape,b_shape", [((2, 8, 5, 7), (2, 8, 5, 7)), ((2, 9, 33), (33,)),
                                             ((33,), (2, 9, 33)), ((4, 6), ()), ((), (5, 7)),
                                             ((2, 1, 4, 5), (2, 3, 1, 5))])
@pytest.mark.parametrize("a_dtype,b_dtype,out_dtype,relu",
                         [("uint8", "uint8", "uint8", True), ("int8", "uint8", "int8", False)])
def test_qadd_is_dequantize_add_quantize(a_shape, b_shape, a_dtype, b_dtype, out_dtype,
                                         relu) -> None:
    """ONNX's DequantizeLinear, Add, Relu and QuantizeLinear in float32, bit for bit."""
    rng = np.random.default_rng(len(a_shape) + len(b_shape))
    a, b = _ints(rng, a_shape, a_dtype), _ints(rng, b_shape, b_dtype)
    attrs = dict(a_scale=0.021, a_zero=3, b_scale=0.034, b_zero=-5 if b_dtype == "int8" else 130,
                 y_scale=0.047, y_zero=7, relu=relu, dtype=out_dtype)
    shape = np.broadcast_shapes(a_shape, b_shape)
    kernel = _qadd_cpu(None, 0, [TensorSpec(a_shape, a_dtype), TensorSpec(b_shape, b_dtype)],
                       [TensorSpec(shape, out_dtype)], attrs)
    f = np.float32
    y = (a.astype(f) - f(3)) * f(0.021) + (b.astype(f) - f(attrs["b_zero"])) * f(0.034)
    if relu:
        y = np.maximum(y, f(0))
    lo, hi = RANGES[out_dtype]
    want = np.clip(np.rint(y / f(0.047)) + f(7), lo, hi).astype(out_dtype)
    out = np.empty(shape, out_dtype)
    kernel(a, b, out)
    np.testing.assert_array_equal(out, want)
    if len(shape) == 4 and a_shape == b_shape:
        assert set(kernel.channels_last_positions()) == {0, 1, 2}
        nhwc = [np.ascontiguousarray(v.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
                for v in (a, b)]
        out_nhwc = np.empty((shape[0], shape[2], shape[3], shape[1]),
                            out_dtype).transpose(0, 3, 1, 2)
        kernel(*nhwc, out_nhwc)
        np.testing.assert_array_equal(out_nhwc, want)


def _dynamic_quantize_reference(x: np.ndarray) -> tuple[np.ndarray, np.float32, np.uint8]:
    """ONNX's DynamicQuantizeLinear in float32 steps (the importer's lowering before the op)."""
    f = np.float32
    low, high = min(f(x.min()), f(0)), max(f(x.max()), f(0))
    span = f(high - low)
    scale = f(f(1) if span == 0 else span) / f(255)
    zero = f(np.rint(np.clip(f(0) - low / scale, 0, 255)))
    y = np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.uint8)
    return y, scale, np.uint8(zero)


@pytest.mark.parametrize("shape,kind", [((3, 7, 11), "normal"), ((2, 64, 56, 56), "normal"),
                                        ((5, 9), "zeros"), ((40,), "positive"),
                                        ((33,), "negative"), ((6, 6), "nan")])
def test_dynamic_quantize_is_onnx_definition(shape, kind) -> None:
    from graph_runtime.lib.ops.quantized_integer import _dynamic_quantize_cpu
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    if kind == "zeros":
        x[...] = 0
    elif kind == "positive":
        x = np.abs(x) + 0.5
    elif kind == "negative":
        x = -np.abs(x) - 0.5
    elif kind == "nan":
        x[2, 3] = np.nan
    y, scale, zero = np.empty(shape, np.uint8), np.empty((), np.float32), np.empty((), np.uint8)
    outs = [TensorSpec(shape, "uint8"), TensorSpec((), "float32"), TensorSpec((), "uint8")]
    _dynamic_quantize_cpu(None, 0, [TensorSpec(shape, "float32")], outs, {})(x, y, scale, zero)
    if kind == "nan":
        assert np.isnan(scale) and zero == 0 and not y.any()
        return
    want_y, want_scale, want_zero = _dynamic_quantize_reference(x)
    assert scale == want_scale and zero == want_zero
    np.testing.assert_array_equal(y, want_y)


@pytest.mark.parametrize("per_column", [True, False])
def test_dense_integer_scaled_is_the_graphs_float_steps(mode, per_column) -> None:
    """float32(acc) * float32(x_scale * w_scale) + bias: exact without oneDNN; within one float32
    rounding of it with oneDNN (which may fuse the multiply and the add)."""
    from graph_runtime.lib.ops.quantized_integer import _scaled_cpu
    rng = np.random.default_rng(12)
    x, w = _ints(rng, (2, 7, 45), "uint8"), rng.integers(-128, 128, (45, 13)).astype(np.int8)
    x_zero, x_scale = np.array(121, np.uint8), np.array(0.0173, np.float32)
    w_scale = np.broadcast_to(rng.uniform(0.001, 0.01, 13 if per_column else 1),
                              (13,)).astype(np.float32)
    bias = rng.standard_normal(13).astype(np.float32)
    specs = [TensorSpec(a.shape, str(a.dtype)) for a in (x, x_zero, w, x_scale, w_scale, bias)]
    out = np.empty((2, 7, 13), np.float32)
    _scaled_cpu(None, 0, specs, [TensorSpec(out.shape, "float32")], {})(
        x, x_zero, w, x_scale, w_scale, bias, out)
    acc = (x.astype(np.int64) - 121) @ w.astype(np.int64)
    want = acc.astype(np.float32) * (x_scale * w_scale) + bias
    if mode == "off":
        np.testing.assert_array_equal(out, want)
    else:
        np.testing.assert_allclose(out, want, rtol=2 ** -22, atol=2 ** -22 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["normal", "zeros", "nan"])
def test_dense_dynamic_scaled_is_dynamic_quantize_then_dense_integer_scaled(mode, kind) -> None:
    """One call giving what the two ops give (its quantize is ONNX's DynamicQuantizeLinear,
    checked against the float32 steps above), the product against exact integers."""
    from graph_runtime.lib.ops.quantized_integer import _dynamic_scaled_cpu
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((2, 9, 40)) * 2).astype(np.float32)
    if kind == "zeros":
        x[...] = 0
    elif kind == "nan":
        x[1, 2, 3] = np.nan
    w = rng.integers(-128, 128, (40, 11)).astype(np.int8)
    w_scale = rng.uniform(0.001, 0.01, 11).astype(np.float32)
    bias = rng.standard_normal(11).astype(np.float32)
    specs = [TensorSpec(a.shape, str(a.dtype)) for a in (x, w, w_scale, bias)]
    kernel = _dynamic_scaled_cpu(None, 0, specs, [TensorSpec((2, 9, 11), "float32")], {})
    out = np.empty((2, 9, 11), np.float32)
    for _ in range(2):  # a second run reuses the scratch arrays
        kernel(x, w, w_scale, bias, out)
    if kind == "nan":  # the scale is NaN: so is every product, as the two nodes give
        assert np.isnan(out).all()
        return
    q, x_scale, x_zero = _dynamic_quantize_reference(x)
    acc = (q.astype(np.int64) - int(x_zero)) @ w.astype(np.int64)
    want = acc.astype(np.float32) * (x_scale * w_scale) + bias
    if mode == "off":
        np.testing.assert_array_equal(out, want)
    else:
        np.testing.assert_allclose(out, want, rtol=2 ** -22, atol=2 ** -22 * np.abs(want).max())


@pytest.mark.parametrize("case", CONVS[:4], ids=[f"conv{i}" for i in range(4)])
def test_conv2d_integer_scaled_is_the_graphs_float_steps(mode, case) -> None:
    """conv2d_integer's exact accumulator, then float32(acc) * float32(x_scale * w_scale[o])
    + bias[o]: exact without oneDNN, within one float32 rounding of it with oneDNN."""
    from graph_runtime.lib.ops.quantized_integer import _conv_scaled_cpu
    n, c, h, wd, o, kh, kw, strides, pad, dilation, groups = case
    rng = np.random.default_rng(o)
    x = _ints(rng, (n, c, h, wd), "uint8")
    w = rng.integers(-128, 128, (o, c // groups, kh, kw)).astype(np.int8)
    x_zero, x_scale = np.array(99, np.uint8), np.array(0.031, np.float32)
    w_scale = rng.uniform(0.001, 0.01, o).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    attrs = dict(strides=list(strides), padding=list(pad), dilation=list(dilation),
                 groups=groups)
    specs = [TensorSpec(a.shape, str(a.dtype)) for a in (x, x_zero, w, x_scale, w_scale, bias)]
    acc = _conv_acc(x, w, 99, strides, pad, dilation, groups)
    out = np.empty(acc.shape, np.float32)
    kernel = _conv_scaled_cpu(None, 0, specs, [TensorSpec(out.shape, "float32")], attrs)
    assert ("Int8Conv" in repr(kernel)) == (mode == "auto")
    kernel(x, x_zero, w, x_scale, w_scale, bias, out)
    want = acc.astype(np.float32) * (x_scale * w_scale).reshape(1, -1, 1, 1) \
        + bias.reshape(1, -1, 1, 1)
    if mode == "off":
        np.testing.assert_array_equal(out, want)
    else:
        np.testing.assert_allclose(out, want, rtol=2 ** -22, atol=2 ** -22 * np.abs(want).max())


@pytest.mark.parametrize("dtype,out_dtype", [("int8", "int8"), ("uint8", "int8"),
                                             ("int8", "uint8")])
def test_qlookup_is_the_table_at_each_byte(dtype, out_dtype) -> None:
    """qlookup over flat memory and over a strided view (NumPy's take) against indexing."""
    from graph_runtime.lib.ops.quantized_lookup import _qlookup_cpu, _qlookup_infer
    rng = np.random.default_rng(31)
    x = _ints(rng, (3, 40, 7), dtype)
    table = rng.integers(0, 256, 256).astype(np.uint8).view(out_dtype)
    specs = [TensorSpec(x.shape, dtype), TensorSpec((256,), out_dtype)]
    (spec,) = _qlookup_infer(specs, {})
    assert spec == TensorSpec(x.shape, out_dtype)
    kernel = _qlookup_cpu(None, 0, specs, [spec], {})
    want = table[x.view(np.uint8).astype(np.int64)]
    for view in (x, np.asfortranarray(x)):
        out = np.empty(x.shape, out_dtype)
        kernel(view, table, out)
        np.testing.assert_array_equal(out, want)
    with pytest.raises(Exception, match="expected \\(256,\\)"):
        _qlookup_infer([specs[0], TensorSpec((255,), out_dtype)], {})
