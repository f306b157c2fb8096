"""OpenCL Winograd conv2d (lib/kernels/opencl/winograd.py) on PoCL, against float64 references.

Both tile sizes through both layouts (the packed GEMM's panels, and plain V and U arrays for
make_gemm as GPUs run it), and the transformed weight following every way a weight can change
between runs.
"""
from __future__ import annotations

import numpy as np
import pytest
from support import make_graph, null, tvm_op
from test_conv import SUM_TOLERANCES, ref_conv2d_attrs
from test_conv_strategies import check_weight_computed_by_a_node, winograd_rms_bound

import graph_runtime as gr
from graph_runtime.errors import LibraryError
from graph_runtime.lib import Module
from graph_runtime.lib.chain import Chain, Step
from graph_runtime.lib.conv_params import conv2d_params
from graph_runtime.lib.kernels.opencl import winograd as winograd_cl
from graph_runtime.lib.kernels.winograd_math import transform_weight
from graph_runtime.lib.library import TensorSpec
from graph_runtime.settings import OPENCL_CONV

pytestmark = pytest.mark.opencl

# (data shape, weight shape, attrs): odd sizes, symmetric and asymmetric padding, batches,
# outputs that are no multiple of either tile, tile counts below, at and past the GEMM's
# 32-column panel, output channels past its 12-row blocks, and an image smaller than a tile.
CASES = [
    ((2, 3, 7, 9), (5, 3, 3, 3), {"padding": [1, 1]}),
    ((1, 4, 8, 8), (6, 4, 3, 3), {"padding": [0, 1, 2, 0]}),
    ((3, 5, 5, 6), (4, 5, 3, 3), {}),
    ((1, 6, 11, 10), (13, 6, 3, 3), {"padding": [1]}),
    ((2, 16, 17, 23), (26, 16, 3, 3), {"padding": [2, 0, 1, 3]}),
    ((1, 8, 16, 16), (12, 8, 3, 3), {"padding": [1]}),
    ((4, 3, 3, 3), (2, 3, 3, 3), {"padding": [1]}),
    ((1, 2, 3, 4), (3, 2, 3, 3), {}),
]
METHODS = ("winograd", "winograd4")
F32 = "float32"


def _tolerance(m: int, channels: int) -> dict:
    """F(2x2,3x3) holds conv's float32 tolerance; F(4x4,3x3)'s larger constants lose bits as the
    sum grows, as much as the CPU's winograd4 does (2.4e-4 there, 1.9e-4 here at 16 channels), so
    its absolute tolerance scales with the sum's length over CONV_CASES' 27 taps."""
    if m == 2:
        return SUM_TOLERANCES["float32"]
    return {"rtol": 1e-5, "atol": 2e-4 * max(1.0, np.sqrt(channels * 9 / 27))}


def _device(backend, host: np.ndarray):
    arr = backend.empty(0, host.shape, host.dtype)
    backend.from_host(host, arr)
    return arr


def _run(m: int, x: np.ndarray, w: np.ndarray, attrs, panel: bool | None = None) -> np.ndarray:
    from graph_runtime.backends import get_backend
    backend = get_backend("opencl")
    p = conv2d_params([TensorSpec(x.shape, str(x.dtype)), TensorSpec(w.shape, str(w.dtype))],
                      attrs)
    run = winograd_cl.WinogradCl(backend, 0, p, m, panel)
    assert panel is None or run.panel == panel
    out = _device(backend, np.full((p.n, p.o, p.oh, p.ow), np.nan, x.dtype))
    run(_device(backend, x), _device(backend, w), out)
    return backend.to_host(out)


@pytest.mark.parametrize("panel", [True, False], ids=["panel", "plain"])
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("data_shape,weight_shape,attrs", CASES)
def test_matches_the_reference(m, panel, data_shape, weight_shape, attrs, opencl_available,
                               random_array) -> None:
    x = random_array(data_shape, "float32", seed=41)
    w = random_array(weight_shape, "float32", seed=42)
    got = _run(m, x, w, attrs, panel)
    np.testing.assert_allclose(got, ref_conv2d_attrs(x, w, attrs), **_tolerance(m, x.shape[1]))


@pytest.mark.parametrize("panel", [True, False], ids=["panel", "plain"])
@pytest.mark.parametrize("m", [2, 4])
def test_images_in_chunks(m, panel, monkeypatch, opencl_available, random_array) -> None:
    """On a CPU device the batch goes through in chunks of images (one each here)."""
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.kernels.opencl.gemm import is_cpu_device
    backend = get_backend("opencl")
    if not is_cpu_device(backend, 0):
        pytest.skip("opencl:0 is not a CPU device: one chunk")
    monkeypatch.setattr(winograd_cl, "CHUNK_BYTES", 1)
    x = random_array((3, 6, 9, 11), F32, seed=46)
    w = random_array((7, 6, 3, 3), F32, seed=47)
    attrs = {"padding": [1, 2, 0, 1]}
    p = conv2d_params([TensorSpec(x.shape, F32), TensorSpec(w.shape, F32)], attrs)
    run = winograd_cl.WinogradCl(backend, 0, p, m, panel)
    assert (run.chunks, run.images) == (3, 1)
    out = _device(backend, np.full((p.n, p.o, p.oh, p.ow), np.nan, x.dtype))
    run(_device(backend, x), _device(backend, w), out)
    np.testing.assert_allclose(backend.to_host(out), ref_conv2d_attrs(x, w, attrs),
                               **_tolerance(m, 6))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m", [2, 4])
def test_weight_transform_matches_the_host_one(m, dtype, opencl_available,
                                               random_array) -> None:
    """The device's U = G g G^T, in the dtype, against winograd.transform_weight in float64."""
    from graph_runtime.backends import get_backend
    backend = get_backend("opencl")
    w = random_array((13, 5, 3, 3), dtype, seed=45)
    p = conv2d_params([TensorSpec((1, 5, 6, 6), dtype), TensorSpec(w.shape, dtype)], {})
    run = winograd_cl.WinogradCl(backend, 0, p, m, panel=False)
    run._transform_weight(_device(backend, w), run.u.base_data)
    want = transform_weight(w, m)
    scale = np.abs(want).max()
    atol = {"float32": 1e-7, "float64": 1e-15}[dtype] * scale
    planes = backend.to_host(run.u).reshape((m + 2) ** 2, run.u_plane)
    got = planes[:, :13 * 5].reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)


@pytest.mark.parametrize("m", [2, 4])
def test_float64(m, opencl_available, random_array) -> None:
    x = random_array((2, 7, 9, 10), "float64", seed=43)
    w = random_array((14, 7, 3, 3), "float64", seed=44)
    got = _run(m, x, w, {"padding": [1]})
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, ref_conv2d_attrs(x, w, {"padding": [1]}),
                               **SUM_TOLERANCES["float64"])


@pytest.mark.parametrize("panel", [True, False], ids=["panel", "plain"])
@pytest.mark.parametrize("m", [2, 4])
def test_holds_many_channels(m, panel, opencl_available, random_array) -> None:
    """128 channels: within _tolerance, and an RMS error within what float32 Winograd of this
    size is expected to make (winograd_rms_bound), however the device rounds and sums."""
    x = random_array((1, 128, 12, 12), "float32", seed=3)
    w = random_array((8, 128, 3, 3), "float32", seed=4)
    got = _run(m, x, w, {"padding": [1]}, panel)
    want = ref_conv2d_attrs(x, w, {"padding": [1]})
    np.testing.assert_allclose(got, want, **_tolerance(m, 128))
    rms = np.sqrt(np.mean((got - want) ** 2))
    assert rms <= winograd_rms_bound(m, x, w), (rms, winograd_rms_bound(m, x, w))


@pytest.mark.parametrize("weight_shape,attrs", [
    ((4, 3, 5, 5), {"padding": [2]}),
    ((4, 3, 3, 3), {"strides": [2, 2]}),
    ((4, 3, 3, 3), {"dilation": [2, 2]}),
    ((6, 1, 3, 3), {"groups": 3}),
])
def test_method_refused_where_it_does_not_apply(weight_shape, attrs, opencl_available) -> None:
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.kernels.opencl.conv import conv2d_cl
    p = conv2d_params([TensorSpec((1, 3, 9, 9), "float32"), TensorSpec(weight_shape, "float32")],
                      attrs)
    with pytest.raises(LibraryError, match=r"conv2d: method 'winograd' takes a 3x3 kernel with "
                                           r"stride 1, dilation 1, groups 1 .*; got "):
        conv2d_cl(get_backend("opencl"), 0, p, "winograd")


# -- weights changed between runs --------------------------------------------------------------

@pytest.fixture(name="transforms")
def transforms_fixture(monkeypatch) -> list[int]:
    """Counts the weight transforms WinogradCl launches."""
    calls: list[int] = []
    real = winograd_cl.WinogradCl._transform_weight

    def counted(self, weight, u):
        calls.append(self.m)
        real(self, weight, u)
    monkeypatch.setattr(winograd_cl.WinogradCl, "_transform_weight", counted)
    return calls


def _conv_module(method: str, monkeypatch) -> gr.GraphModule:
    monkeypatch.setenv(OPENCL_CONV.name, method)
    lib = Module("convlib")
    lib.register("fused_conv", Chain("fused_conv", [Step("conv2d", {"padding": [1, 1]}),
                                                    Step("add"), Step("relu")]),
                 device="opencl")
    nodes = [null("data"), null("weight"), null("bias"),
             tvm_op("conv", "fused_conv", [0, 1, 2])]
    graph = make_graph(nodes, [3], shapes=[[2, 4, 6, 6], [5, 4, 3, 3], [5, 1, 1], [2, 5, 6, 6]])
    return gr.create(graph, lib, gr.opencl())


def _expected(x, w, b) -> np.ndarray:
    return np.maximum(ref_conv2d_attrs(x, w, {"padding": [1]}) + b, 0)


@pytest.mark.parametrize("chunked", [False, True], ids=["one_chunk", "chunks"])
@pytest.mark.parametrize("method", METHODS)
def test_no_stale_weights(method, chunked, monkeypatch, transforms, opencl_available,
                          random_array) -> None:
    """Each weight change is transformed once, on a run's first chunk of images."""
    if chunked:
        monkeypatch.setattr(winograd_cl, "CHUNK_BYTES", 1)  # one image per chunk (CPU devices)
    m = _conv_module(method, monkeypatch)
    x = random_array((2, 4, 6, 6), "float32", seed=14)
    weights = [random_array((5, 4, 3, 3), "float32", seed=s) for s in (15, 16, 17, 18, 19)]
    biases = [random_array((5, 1, 1), "float32", seed=s) for s in (20, 21, 22, 23, 24)]
    tol = SUM_TOLERANCES["float32"]

    def check(w, b, made: int) -> None:
        m.run(data=x)
        np.testing.assert_allclose(m.get_output(0).numpy(), _expected(x, w, b), **tol)
        assert len(transforms) == made

    m.load_params({"weight": weights[0], "bias": biases[0]})
    check(weights[0], biases[0], 1)
    check(weights[0], biases[0], 1)  # the uploaded transform is reused
    m.set_input("weight", weights[1])
    check(weights[1], biases[0], 2)
    m.load_params({"bias": biases[1]})
    check(weights[1], biases[1], 2)  # another input's write leaves the weight's transform
    m.load_params(gr.save_param_dict({"weight": weights[2]}))
    check(weights[2], biases[1], 3)
    m.set_input("weight", gr.nd.array(weights[3], gr.opencl()))  # device to device
    check(weights[3], biases[1], 4)
    m.get_input("weight").native.set(weights[4])  # writes through the returned view
    check(weights[4], biases[1], 5)
    check(weights[4], biases[1], 6)  # a handed-out view may change unseen: every run


@pytest.mark.parametrize("method", METHODS)
def test_zero_copy_weight_is_transformed_every_run(method, monkeypatch, transforms,
                                                   opencl_available, random_array) -> None:
    m = _conv_module(method, monkeypatch)
    x = random_array((2, 4, 6, 6), "float32", seed=25)
    w0, w1 = (random_array((5, 4, 3, 3), "float32", seed=s) for s in (26, 27))
    bias = random_array((5, 1, 1), "float32", seed=28)
    m.load_params({"bias": bias})
    own = gr.nd.array(w0, gr.opencl())
    m.set_input_zero_copy("weight", own)
    m.run(data=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), _expected(x, w0, bias),
                               **SUM_TOLERANCES["float32"])
    own.copyfrom(w1)  # the bound array changes in place: no setter sees it
    m.run(data=x)
    np.testing.assert_allclose(m.get_output(0).numpy(), _expected(x, w1, bias),
                               **SUM_TOLERANCES["float32"])
    assert len(transforms) == 2


@pytest.mark.parametrize("method", METHODS)
def test_weight_computed_by_a_node_is_never_cached(method, monkeypatch, transforms,
                                                   opencl_available, random_array) -> None:
    monkeypatch.setenv(OPENCL_CONV.name, method)
    check_weight_computed_by_a_node("opencl", random_array)
    assert len(transforms) == 3
