"""conv2d, conv2d_transpose and the 2-D pools on every backend against float64 NumPy references."""
from __future__ import annotations

import math

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec

# Convolutions sum C*KH*KW products: absolute errors grow with that, so per-dtype tolerances.
SUM_TOLERANCES = {"float16": {"rtol": 1e-2, "atol": 5e-2}, "float32": {"rtol": 1e-5, "atol": 1e-4},
                  "float64": {"rtol": 1e-10, "atol": 1e-10}}


def _pads(padding) -> tuple[int, int, int, int]:
    if isinstance(padding, int):
        padding = [padding]
    if len(padding) == 1:
        return (padding[0],) * 4
    if len(padding) == 2:
        return (padding[0], padding[1], padding[0], padding[1])
    return tuple(padding)


def _check(run_op, backend_name, op, inputs, want, attrs) -> None:
    (got,) = run_op(backend_name, op, inputs, attrs)
    assert got.shape == want.shape, f"shape {got.shape} != reference {want.shape}"
    assert got.dtype == inputs[0].dtype
    np.testing.assert_allclose(got.astype(np.float64), want, **SUM_TOLERANCES[str(got.dtype)])


def ref_conv2d(x, w, strides=(1, 1), padding=0, dilation=(1, 1), groups=1) -> np.ndarray:
    """Direct definition: per output channel and kernel tap, a strided slice times a weight."""
    pt, pl, pb, pr = _pads(padding)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    n, _, h, wd = xp.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilation
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (wd - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        first = (oc // og) * cg
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, first:first + cg, i * dh:i * dh + (oh - 1) * sh + 1:sh,
                           j * dw:j * dw + (ow - 1) * sw + 1:sw]
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, i, j].astype(np.float64))
    return out


def ref_conv2d_attrs(x, w, attrs) -> np.ndarray:
    """ref_conv2d with the conv2d node attrs given (Relay's defaults for the others)."""
    return ref_conv2d(x, w, attrs.get("strides", (1, 1)), attrs.get("padding", 0),
                      attrs.get("dilation", (1, 1)), attrs.get("groups", 1))


def ref_conv2d_transpose(x, w, strides=(1, 1), padding=0, dilation=(1, 1), groups=1,
                         output_padding=(0, 0)) -> np.ndarray:
    """Scatter definition: each input pixel adds weight * value at stride-spaced output taps."""
    pt, pl, pb, pr = _pads(padding)
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilation
    cg = c // groups
    full_h = (h - 1) * sh + dh * (kh - 1) + 1 + output_padding[0]
    full_w = (wd - 1) * sw + dw * (kw - 1) + 1 + output_padding[1]
    full = np.zeros((n, og * groups, full_h, full_w))
    x64 = x.astype(np.float64)
    w64 = w.astype(np.float64)
    for g in range(groups):
        for iy in range(h):
            for ix in range(wd):
                for i in range(kh):
                    for j in range(kw):
                        value = np.einsum("nc,co->no", x64[:, g * cg:(g + 1) * cg, iy, ix],
                                          w64[g * cg:(g + 1) * cg, :, i, j])
                        full[:, g * og:(g + 1) * og, iy * sh + i * dh, ix * sw + j * dw] += value
    return full[:, :, pt:full_h - pb, pl:full_w - pr]


# (data shape, weight shape, attrs): plain, non-square kernel with asymmetric padding, strides,
# dilation and groups, depthwise with multiplier 2, 1x1, the 2-value padding form, size-1
# everything, a zero batch, and zero input channels.
CONV_CASES = [
    ((1, 3, 5, 5), (4, 3, 3, 3), {"padding": [1, 1]}),
    ((2, 4, 7, 6), (6, 2, 3, 2), {"strides": [2, 1], "padding": [1, 0, 2, 1],
                                  "dilation": [1, 2], "groups": 2}),
    ((1, 3, 6, 6), (6, 1, 3, 3), {"strides": [2, 2], "padding": [1], "groups": 3}),
    ((2, 3, 4, 4), (5, 3, 1, 1), {}),
    ((1, 2, 5, 4), (3, 2, 2, 3), {"padding": [2, 1], "strides": [3, 2]}),
    ((1, 1, 1, 1), (1, 1, 1, 1), {}),
    ((0, 3, 4, 4), (2, 3, 3, 3), {"padding": 1}),
    ((1, 0, 3, 3), (2, 0, 2, 2), {}),
]


@pytest.mark.parametrize("data_shape,weight_shape,attrs", CONV_CASES)
def test_conv2d(backend_name: str, data_shape, weight_shape, attrs, run_op,
                random_array) -> None:
    x = random_array(data_shape, "float32", seed=1)
    w = random_array(weight_shape, "float32", seed=2)
    want = ref_conv2d_attrs(x, w, attrs)
    _check(run_op, backend_name, "conv2d", [x, w], want, attrs)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_conv2d_dtypes(backend_name: str, dtype: str, run_op, random_array) -> None:
    x = random_array((2, 4, 5, 5), dtype, seed=3)
    w = random_array((4, 2, 3, 3), dtype, seed=4)
    attrs = {"padding": [0, 1, 1, 0], "groups": 2, "strides": [1, 2]}
    _check(run_op, backend_name, "conv2d", [x, w], ref_conv2d(x, w, (1, 2), [0, 1, 1, 0],
                                                               groups=2), attrs)


TRANSPOSE_CASES = [
    ((1, 2, 3, 3), (2, 3, 3, 3), {}),
    ((2, 4, 3, 4), (4, 3, 3, 2), {"strides": [2, 2], "padding": [1, 1], "output_padding": [1, 0],
                                  "groups": 2}),
    ((1, 3, 4, 3), (3, 2, 2, 3), {"strides": [1, 2], "padding": [0, 1, 1, 0],
                                  "dilation": [2, 1]}),
    ((1, 2, 1, 1), (2, 1, 1, 1), {"strides": [2, 2], "output_padding": [1, 1]}),
    ((0, 2, 2, 2), (2, 2, 2, 2), {}),
]


@pytest.mark.parametrize("data_shape,weight_shape,attrs", TRANSPOSE_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_conv2d_transpose(backend_name: str, dtype, data_shape, weight_shape, attrs, run_op,
                          random_array) -> None:
    x = random_array(data_shape, dtype, seed=5)
    w = random_array(weight_shape, dtype, seed=6)
    want = ref_conv2d_transpose(x, w, attrs.get("strides", (1, 1)), attrs.get("padding", 0),
                                attrs.get("dilation", (1, 1)), attrs.get("groups", 1),
                                attrs.get("output_padding", (0, 0)))
    _check(run_op, backend_name, "conv2d_transpose", [x, w], want, attrs)


def test_conv2d_transpose_float16(backend_name: str, run_op, random_array) -> None:
    x = random_array((1, 2, 3, 3), "float16", seed=7)
    w = random_array((2, 2, 3, 3), "float16", seed=8)
    want = ref_conv2d_transpose(x, w, (2, 2), 1)
    _check(run_op, backend_name, "conv2d_transpose", [x, w], want,
           {"strides": [2, 2], "padding": [1, 1]})


# -- pools --------------------------------------------------------------------------------------

def ref_pool(x, kind, pool_size, strides=(1, 1), padding=0, dilation=(1, 1), ceil_mode=False,
             count_include_pad=False) -> np.ndarray:
    """Explicit loop over output pixels; windows clipped to the data (and padding for counts)."""
    pt, pl, pb, pr = _pads(padding)
    n, c, h, w = x.shape
    sizes = []
    for size, k, s, d, pad in ((h, pool_size[0], strides[0], dilation[0], pt + pb),
                               (w, pool_size[1], strides[1], dilation[1], pl + pr)):
        span = (size + pad - d * (k - 1) - 1) / s
        sizes.append((math.ceil(span) if ceil_mode else math.floor(span)) + 1)
    oh, ow = sizes
    out = np.zeros((n, c, oh, ow))
    x64 = x.astype(np.float64)
    for y in range(oh):
        for z in range(ow):
            rows = [y * strides[0] - pt + i * dilation[0] for i in range(pool_size[0])]
            cols = [z * strides[1] - pl + j * dilation[1] for j in range(pool_size[1])]
            inside_r = [r for r in rows if 0 <= r < h]
            inside_c = [q for q in cols if 0 <= q < w]
            window = x64[:, :, inside_r][:, :, :, inside_c]
            if kind == "max":
                out[:, :, y, z] = window.max(axis=(2, 3))
                continue
            if count_include_pad:
                count = (sum(-pt <= r < h + pb for r in rows)
                         * sum(-pl <= q < w + pr for q in cols))
            else:
                count = len(inside_r) * len(inside_c)
            out[:, :, y, z] = window.sum(axis=(2, 3)) / count
    return out


POOL_CASES = [
    ((1, 2, 4, 4), {"pool_size": [2, 2], "strides": [2, 2]}),
    ((2, 3, 5, 5), {"pool_size": [3, 3], "strides": [2, 2], "padding": [1]}),
    ((1, 2, 5, 6), {"pool_size": [2, 3], "strides": [2, 2], "ceil_mode": True}),
    ((1, 1, 6, 5), {"pool_size": [3, 2], "strides": [2, 1], "padding": [1, 0, 2, 1],
                    "ceil_mode": True}),
    ((1, 2, 7, 7), {"pool_size": [2, 2], "dilation": [2, 3], "padding": [1, 1]}),
    ((1, 1, 1, 1), {"pool_size": [1, 1]}),
    ((0, 2, 3, 3), {"pool_size": [2, 2]}),
]


@pytest.mark.parametrize("shape,attrs", POOL_CASES)
def test_max_pool2d(backend_name: str, shape, attrs, run_op, random_array) -> None:
    x = random_array(shape, "float32", seed=9)
    want = ref_pool(x, "max", attrs["pool_size"], attrs.get("strides", (1, 1)),
                    attrs.get("padding", 0), attrs.get("dilation", (1, 1)),
                    attrs.get("ceil_mode", False))
    _check(run_op, backend_name, "max_pool2d", [x], want, attrs)


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("shape,attrs", POOL_CASES)
def test_avg_pool2d(backend_name: str, shape, attrs, count_include_pad, run_op,
                    random_array) -> None:
    x = random_array(shape, "float32", seed=10)
    attrs = dict(attrs, count_include_pad=count_include_pad)
    want = ref_pool(x, "avg", attrs["pool_size"], attrs.get("strides", (1, 1)),
                    attrs.get("padding", 0), attrs.get("dilation", (1, 1)),
                    attrs.get("ceil_mode", False), count_include_pad)
    _check(run_op, backend_name, "avg_pool2d", [x], want, attrs)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
@pytest.mark.parametrize("op,kind", [("max_pool2d", "max"), ("avg_pool2d", "avg")])
def test_pool_dtypes(backend_name: str, op, kind, dtype, run_op, random_array) -> None:
    x = random_array((1, 2, 5, 5), dtype, seed=11)
    attrs = {"pool_size": [3, 3], "strides": [2, 2], "padding": [1], "ceil_mode": True}
    _check(run_op, backend_name, op, [x], ref_pool(x, kind, (3, 3), (2, 2), 1, ceil_mode=True),
           attrs)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 1, 1, 1), (0, 3, 2, 2)])
@pytest.mark.parametrize("op", ["global_avg_pool2d", "global_max_pool2d"])
def test_global_pools(backend_name: str, op, shape, run_op, random_array) -> None:
    x = random_array(shape, "float32", seed=12)
    reduce = np.mean if op == "global_avg_pool2d" else np.max
    want = (reduce(x.astype(np.float64), axis=(2, 3), keepdims=True) if x.size
            else np.zeros(shape[:2] + (1, 1)))
    _check(run_op, backend_name, op, [x], want, {"layout": "NCHW"})


# -- validation at create() time ----------------------------------------------------------------

F32 = "float32"
ERRORS = [
    ("conv2d", [(1, 3, 5, 5), (2, 4, 3, 3)], {},
     r"conv2d: weight has 4 input channels per group but data has 3 channels / groups 1 = 3"),
    ("conv2d", [(1, 3, 5, 5), (2, 3, 3, 3)], {"data_layout": "NHWC"},
     r"conv2d: attribute 'data_layout' = 'NHWC': expected 'NCHW' \(the only data_layout"),
    ("conv2d", [(1, 3, 5, 5), (2, 3, 3, 3)], {"kernel_layout": "HWIO"},
     r"conv2d: attribute 'kernel_layout' = 'HWIO': expected 'OIHW'"),
    ("conv2d", [(1, 4, 5, 5), (3, 2, 3, 3)], {"groups": 2},
     r"conv2d: weight has 3 output channels, not divisible by groups 2"),
    ("conv2d", [(1, 3, 5, 5), (3, 1, 3, 3)], {"groups": 2},
     r"conv2d: data has 3 channels, not divisible by groups 2"),
    ("conv2d", [(1, 3, 2, 5), (2, 3, 3, 3)], {},
     r"conv2d: the height window \(3 taps, dilation 1\) spans 3 but the padded input has only 2"),
    ("conv2d", [(1, 3, 5, 5), (2, 3, 3, 3)], {"padding": [1, 1, 1]},
     r"conv2d: attribute 'padding' = \[1, 1, 1\]: expected 1, 2 or 4"),
    ("conv2d", [(1, 3, 5, 5), (2, 3, 3, 3)], {"strides": [0, 1]},
     r"conv2d: attribute 'strides' = \[0, 1\]: expected 2 positive integers"),
    ("conv2d", [(1, 3, 5, 5), (2, 3, 3, 3)], {"channels": 4},
     r"conv2d: attribute 'channels' = 4: expected 2"),
    ("conv2d", [(1, 3, 5), (2, 3, 3, 3)], {}, r"conv2d: data has shape \(1, 3, 5\) \(rank 3\)"),
    ("conv2d_transpose", [(1, 3, 5, 5), (2, 3, 3, 3)], {},
     r"conv2d_transpose: weight \(IOHW\) has 2 input channels but data has 3"),
    ("conv2d_transpose", [(1, 2, 5, 5), (2, 3, 3, 3)],
     {"strides": [2, 2], "output_padding": [2, 0]},
     r"conv2d_transpose: attribute 'output_padding' = \[2, 0\]: expected values in \[0, "),
    ("conv2d_transpose", [(1, 2, 1, 1), (2, 3, 1, 1)], {"padding": [1, 1]},
     r"conv2d_transpose: output height would be -1"),
    ("max_pool2d", [(1, 2, 4, 4)], {}, r"max_pool2d: missing required attribute 'pool_size'"),
    ("max_pool2d", [(1, 2, 4, 4)], {"pool_size": [2, 2], "layout": "NHWC"},
     r"max_pool2d: attribute 'layout' = 'NHWC': expected 'NCHW'"),
    ("avg_pool2d", [(1, 2, 2, 2)], {"pool_size": [3, 3]},
     r"avg_pool2d: the height window \(3 taps, dilation 1\) spans 3 but the padded input has"),
    ("max_pool2d", [(1, 2, 4, 4)], {"pool_size": [2, 2], "count_include_pad": True},
     r"max_pool2d: unknown attribute 'count_include_pad'"),
    ("global_avg_pool2d", [(1, 2, 0, 3)], {},
     r"global_avg_pool2d: data \(1, 2, 0, 3\) float32 has an empty 0x3 image"),
]


@pytest.mark.parametrize("op,shapes,attrs,message", ERRORS)
def test_errors(op: str, shapes, attrs, message: str, make_function) -> None:
    inputs = [TensorSpec(shape, F32) for shape in shapes]
    with pytest.raises(LibraryError, match=message):
        make_function(op).infer(inputs, attrs)


def test_conv2d_int_dtype_refused(make_function) -> None:
    specs = [TensorSpec((1, 1, 2, 2), "int32"), TensorSpec((1, 1, 1, 1), "int32")]
    with pytest.raises(LibraryError, match=r"conv2d: input 0 has dtype int32; supported: "):
        make_function("conv2d").infer(specs, {})


# -- the OpenCL conv2d methods, each forced on PoCL whatever the device would pick --------------

# CONV_CASES plus shapes that cross the packed GEMM's blocks (12 rows, 32 columns) and the direct
# kernel's 16-wide strips: depthwise with a multiplier, a 1x1, and 40 taps with 13 channels per
# group.
METHOD_CASES = CONV_CASES + [
    ((2, 4, 9, 21), (8, 1, 3, 3), {"padding": [1, 1], "groups": 4, "strides": [1, 2]}),
    ((1, 5, 6, 7), (13, 5, 1, 1), {}),
    ((2, 10, 11, 37), (26, 5, 2, 4), {"groups": 2, "padding": [1, 2], "dilation": [2, 1]}),
]


def _run_conv_method(method: str, x: np.ndarray, w: np.ndarray, attrs) -> np.ndarray:
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.conv_params import conv2d_params
    from graph_runtime.lib.kernels.opencl.conv import conv2d_cl
    backend = get_backend("opencl")
    p = conv2d_params([TensorSpec(x.shape, str(x.dtype)), TensorSpec(w.shape, str(w.dtype))],
                      attrs)
    args = []
    for host in (x, w):
        arr = backend.empty(0, host.shape, host.dtype)
        backend.from_host(host, arr)
        args.append(arr)
    out = backend.empty(0, (p.n, p.o, p.oh, p.ow), x.dtype)
    conv2d_cl(backend, 0, p, method)(args[0], args[1], out)
    return backend.to_host(out)


@pytest.mark.opencl
@pytest.mark.parametrize("method", ["direct", "panel", "im2col"])
@pytest.mark.parametrize("data_shape,weight_shape,attrs", METHOD_CASES)
def test_conv2d_opencl_methods(method: str, data_shape, weight_shape, attrs, opencl_available,
                               random_array) -> None:
    x = random_array(data_shape, "float32", seed=31)
    w = random_array(weight_shape, "float32", seed=32)
    want = ref_conv2d_attrs(x, w, attrs)
    got = _run_conv_method(method, x, w, attrs)
    np.testing.assert_allclose(got.astype(np.float64), want, **SUM_TOLERANCES["float32"])


@pytest.mark.opencl
@pytest.mark.parametrize("method", ["direct", "panel", "im2col"])
@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_conv2d_opencl_methods_dtypes(method: str, dtype: str, opencl_available,
                                      random_array) -> None:
    x = random_array((2, 6, 7, 19), dtype, seed=33)
    w = random_array((14, 3, 3, 3), dtype, seed=34)
    attrs = {"padding": [1, 1], "groups": 2}
    want = ref_conv2d(x, w, padding=[1, 1], groups=2)
    got = _run_conv_method(method, x, w, attrs)
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got.astype(np.float64), want, **SUM_TOLERANCES[dtype])


def _opencl_params(data_shape, weight_shape, attrs):
    from graph_runtime.lib.conv_params import conv2d_params
    from graph_runtime.lib.kernels.opencl.gemm import GemmShape
    p = conv2d_params([TensorSpec(data_shape, F32), TensorSpec(weight_shape, F32)], attrs)
    kk = p.cg * p.kh * p.kw
    shape = GemmShape(p.og, p.oh * p.ow, kk, F32, batch=p.n * p.groups, a_batches=p.groups,
                      b_batches=p.n * p.groups)
    return p, shape


@pytest.mark.opencl
def test_conv2d_opencl_method_choice(opencl_available) -> None:
    """On PoCL (a CPU device) depthwise runs direct and a wide layer the packed-panel GEMM."""
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.kernels.opencl.conv_choice import pick_method
    from graph_runtime.lib.kernels.opencl.gemm import is_cpu_device
    backend = get_backend("opencl")
    if not is_cpu_device(backend, 0):
        pytest.skip("opencl:0 is not a CPU device; the choice below is the CPU one")
    picks = {}
    # Stride 2: no Winograd, so nothing is timed.
    for groups, weight in ((64, (64, 1, 3, 3)), (1, (64, 64, 3, 3))):
        p, shape = _opencl_params((1, 64, 8, 8), weight,
                                  {"padding": [1, 1], "groups": groups, "strides": [2, 2]})
        picks[groups] = pick_method(backend, 0, p, shape, build=None)
    assert picks == {64: "direct", 1: "panel"}


@pytest.mark.opencl
def test_conv2d_opencl_winograd_is_timed_once(opencl_available) -> None:
    """Where Winograd applies the GEMM method and both tile sizes are timed on the device, once
    per shape: a second prepare reuses the choice."""
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.kernels.opencl.conv import conv2d_cl
    from graph_runtime.lib import tuning
    from graph_runtime.lib.kernels.opencl.conv_choice import CHOICE, pick_method
    backend = get_backend("opencl")
    p, shape = _opencl_params((1, 16, 10, 14), (24, 16, 3, 3), {"padding": [1, 1]})
    built = []

    def build(method):
        built.append(method)
        return conv2d_cl(backend, 0, p, method)
    first = pick_method(backend, 0, p, shape, build)
    assert built[0] in ("panel", "im2col") and built[1:] == ["winograd", "winograd4"]
    assert first in built
    assert pick_method(backend, 0, p, shape, build) == first
    assert len(built) == 3
    assert [e.chosen for e in tuning.remembered()
            if e.choice == CHOICE.name and e.key == p.key()] == [first]


@pytest.mark.opencl
def test_conv2d_opencl_method_env(monkeypatch, opencl_available, run_op, random_array) -> None:
    """GRAPH_RUNTIME_OPENCL_CONV forces a method where it applies and is refused when unknown."""
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.kernels.opencl.conv import conv2d_cl
    from graph_runtime.settings import OPENCL_CONV
    from graph_runtime.lib.kernels.opencl.winograd import WinogradCl
    backend = get_backend("opencl")
    monkeypatch.setenv(OPENCL_CONV.name, "winograd4")
    p, _ = _opencl_params((1, 4, 9, 9), (5, 4, 3, 3), {"padding": [1, 1]})
    run = conv2d_cl(backend, 0, p)
    assert isinstance(run, WinogradCl) and run.m == 4
    p, _ = _opencl_params((1, 4, 9, 9), (5, 4, 3, 3), {"strides": [2, 2]})
    assert not isinstance(conv2d_cl(backend, 0, p), WinogradCl)  # does not apply: auto
    x = random_array((1, 4, 9, 9), F32, seed=35)
    w = random_array((5, 4, 3, 3), F32, seed=36)
    for method in ("direct", "winograd", "winograd4"):
        monkeypatch.setenv(OPENCL_CONV.name, method)
        (got,) = run_op("opencl", "conv2d", [x, w], {"padding": [1, 1]})
        np.testing.assert_allclose(got, ref_conv2d(x, w, padding=[1, 1]),
                                   **SUM_TOLERANCES["float32"])
    monkeypatch.setenv(OPENCL_CONV.name, "fft")
    with pytest.raises(LibraryError, match=r"GRAPH_RUNTIME_OPENCL_CONV must be auto or one of "
                                           r"direct, panel, im2col, winograd, winograd4, got "):
        conv2d_cl(backend, 0, p)


def test_conv2d_opencl_unknown_method(opencl_available) -> None:
    with pytest.raises(LibraryError, match=r"conv2d: method 'fft': expected one of direct, "):
        _run_conv_method("fft", np.zeros((1, 1, 3, 3), np.float32),
                         np.zeros((1, 1, 1, 1), np.float32), {})
