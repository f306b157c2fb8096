"""oneDNN kernels (lib/kernels/onednn/) against float64 NumPy, and the path without oneDNN.

Each kernel is forced (GRAPH_RUNTIME_CONV=onednn) over odd shapes, pads, strides, dilations,
groups and channel counts that no SIMD block divides, with every fused epilogue. Accuracy is
judged by the bound recursive float32 summation guarantees: |error| <= terms * u * sum|terms|.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
import test_conv_strategies as strategies
import test_pool as pool_tests
from test_conv import ref_conv2d_attrs
from support import require_onednn

from graph_runtime.errors import LibraryError
from graph_runtime.lib.conv_params import conv2d_params
from graph_runtime.lib.kernels.cpu.conv_choice import candidates, conv2d_cpu
from graph_runtime.lib.kernels.conv_epilogue import Epilogue
from graph_runtime.lib.kernels.onednn import abi, binding
from graph_runtime.lib.kernels.onednn.pool import OnednnPool
from graph_runtime.lib.library import TensorSpec
from graph_runtime.settings import CONV, NUM_THREADS, ONEDNN_THREADS

CONV_ENV = CONV.name
THREADS_ENV = NUM_THREADS.name

U32 = float(np.finfo(np.float32).eps) / 2


@pytest.fixture
def onednn(monkeypatch):
    """Skip (with the reason) where oneDNN cannot run; force it where it can.

    CI sets GRAPH_RUNTIME_REQUIRE_ONEDNN=1 so that a missing library fails instead, except in
    its run with oneDNN turned off.
    """
    require_onednn()
    monkeypatch.setenv(CONV_ENV, "onednn")
    return binding.library()


@pytest.fixture
def fresh_loader(monkeypatch):
    """Let a test change the settings the loader reads; the real state comes back after."""
    saved = (binding._loaded, binding._reason, binding._tried)
    binding._tried = False
    yield
    binding._loaded, binding._reason, binding._tried = saved


# (data shape, weight shape, attrs): the strategy tests' cases plus channel counts that 8 and
# 16 do not divide, depthwise with a multiplier, and one ResNet-like layer.
CASES = strategies.CASES + [
    ((1, 17, 9, 10), (13, 17, 3, 3), {"padding": [1, 0, 2, 1]}),
    ((2, 19, 8, 7), (19, 1, 3, 3), {"groups": 19, "padding": [1], "strides": [2, 2]}),
    ((1, 10, 8, 8), (20, 1, 5, 5), {"groups": 10, "padding": [2], "dilation": [1, 2]}),
    ((1, 24, 12, 12), (42, 8, 3, 3), {"groups": 3, "padding": [1], "strides": [2, 1]}),
    ((1, 33, 6, 6), (70, 33, 1, 1), {"strides": [2, 2]}),
    ((2, 64, 14, 14), (64, 64, 3, 3), {"padding": [1]}),
    # several images, and input rows the stride never reaches at the bottom (ResNet's 1x1
    # downsample): a whole-batch primitive must keep the images' real stride
    ((3, 16, 14, 14), (32, 16, 1, 1), {"strides": [2, 2]}),
    ((2, 8, 10, 11), (12, 8, 3, 3), {"strides": [2, 2], "padding": [0, 1, 0, 0]}),
]


def _ids(case) -> str:
    data, weight, attrs = case
    return f"{data}-{weight}-{'-'.join(f'{k}{v}' for k, v in attrs.items()) or 'plain'}"


def _conv_bound(x, w, attrs, extra_terms: int = 0, extra_abs=0.0) -> np.ndarray:
    """Worst-case float32 error of the conv (and added terms) at each output."""
    terms = w.shape[1] * w.shape[2] * w.shape[3] + extra_terms + 1
    absolute = ref_conv2d_attrs(np.abs(x), np.abs(w), attrs) + extra_abs
    return 2 * terms * U32 * absolute + 1e-30


def _check(got, want, bound) -> None:
    err = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"error {err[worst]:.3g} > bound {bound[worst]:.3g} at "
                                  f"{worst}")


@pytest.mark.parametrize("mode", ["workers", "openmp"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_conv_matches_float64(onednn, monkeypatch, case, mode, run_op, random_array) -> None:
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    data_shape, weight_shape, attrs = case
    x = random_array(data_shape, "float32", seed=1)
    w = random_array(weight_shape, "float32", seed=2)
    p = conv2d_params([TensorSpec(x.shape, "float32"), TensorSpec(w.shape, "float32")], attrs)
    kernel = conv2d_cpu(p, Epilogue((), (p.n, p.o, p.oh, p.ow)))
    assert kernel.strategy == "onednn"
    assert not kernel.impl.startswith("ref"), kernel.impl  # oneDNN's slow reference code
    (got,) = run_op("cpu", "conv2d", [x, w], attrs)
    _check(got, ref_conv2d_attrs(x, w, attrs), _conv_bound(x, w, attrs))


@pytest.mark.parametrize("threads", ["1", "3", "7"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_conv_bands_over_workers(onednn, monkeypatch, threads, case, run_op,
                                 random_array) -> None:
    """Images and bands of output rows go to the runtime's workers, each band its own
    single-threaded primitive with the padding of its edge: any worker count gives the conv."""
    from graph_runtime.lib.kernels.onednn import conv as onednn_conv
    monkeypatch.setenv(THREADS_ENV, threads)
    monkeypatch.setenv(ONEDNN_THREADS.name, "workers")  # bands are the workers mode's split
    monkeypatch.setattr(onednn_conv, "MIN_SPLIT_FLOPS", 0)  # band even these small convs
    data_shape, weight_shape, attrs = case
    x = random_array(data_shape, "float32", seed=3)
    w = random_array(weight_shape, "float32", seed=4)
    r = random_array(ref_conv2d_attrs(x, w, attrs).shape, "float32", seed=5)
    (got,) = run_op("cpu", {"ops": [{"op": "conv2d", **attrs}, {"op": "add"},
                                    {"op": "relu"}]}, [x, w, r])
    y = ref_conv2d_attrs(x, w, attrs)
    _check(got, np.maximum(y + r, 0), _conv_bound(x, w, attrs, 1, 1.0 + np.abs(y)))


@pytest.mark.parametrize("epilogue", sorted(strategies.EPILOGUES))
@pytest.mark.parametrize("case", [CASES[0], CASES[6], CASES[-5], CASES[-4]], ids=_ids)
def test_conv_fused_epilogues(onednn, epilogue, case, run_op, random_array) -> None:
    ops, reference, operands = strategies.EPILOGUES[epilogue]
    data_shape, weight_shape, attrs = case
    x = random_array(data_shape, "float32", seed=7)
    w = random_array(weight_shape, "float32", seed=8)
    y = ref_conv2d_attrs(x, w, attrs)
    bias = random_array((y.shape[1], 1, 1), "float32", seed=9)
    residual = random_array(y.shape, "float32", seed=10)
    inputs = [x, w] + {"bias": [bias], "residual": [residual], "both": [bias, residual]}[operands]
    (got,) = run_op("cpu", {"ops": [{"op": "conv2d", **attrs}] + ops}, inputs)
    want = reference(y, bias.astype(np.float64), residual.astype(np.float64))
    _check(got, want, _conv_bound(x, w, attrs, 2, 2.0 + np.abs(y)))


@pytest.mark.parametrize("clip", [(-1.0, 1.5), (0.0, 6.0)])
def test_conv_scalar_add_and_clip_as_post_ops(onednn, clip, run_op, random_array) -> None:
    """relu -> add(scalar) -> clip: an eltwise, a per-tensor binary and a clip post-op."""
    x = random_array((1, 5, 6, 7), "float32", seed=3)
    w = random_array((9, 5, 3, 3), "float32", seed=4)
    s = np.array([0.75], "float32")
    func = {"ops": [{"op": "conv2d", "padding": [1]}, {"op": "relu"}, {"op": "add"},
                    {"op": "clip", "a_min": clip[0], "a_max": clip[1]}]}
    (got,) = run_op("cpu", func, [x, w, s])
    y = ref_conv2d_attrs(x, w, {"padding": [1]})
    _check(got, np.clip(np.maximum(y, 0) + 0.75, *clip),
           _conv_bound(x, w, {"padding": [1]}, 1, 1.0))


def test_conv_weight_changes_between_runs(onednn, monkeypatch, random_array) -> None:
    """set_input, load_params (dict and bytes), writes through get_input's view, zero copy:
    the weight reordered into oneDNN's layout follows every one of them."""
    strategies.test_no_stale_weights(monkeypatch, "onednn", random_array)


def test_conv_weight_computed_by_a_node(onednn, random_array) -> None:
    strategies.check_weight_computed_by_a_node("cpu", random_array)


def test_auto_may_choose_onednn(monkeypatch) -> None:
    """In auto mode oneDNN is one timed candidate among the others (where it loads)."""
    monkeypatch.setenv(CONV_ENV, "auto")
    p = conv2d_params([TensorSpec((1, 16, 12, 12), "float32"),
                       TensorSpec((16, 16, 3, 3), "float32")], {"padding": [1]})
    epilogue = Epilogue((), (1, 16, 12, 12))
    names = candidates(p, epilogue)
    assert ("onednn" in names) == binding.available()
    assert conv2d_cpu(p, epilogue).strategy in names


# -- without oneDNN -----------------------------------------------------------------------------

def test_setting_off_keeps_todays_kernels(monkeypatch, run_op, random_array) -> None:
    monkeypatch.setenv(binding.ONEDNN_ENV, "off")
    monkeypatch.setenv(CONV_ENV, "onednn")
    assert not binding.available()
    assert "GRAPH_RUNTIME_ONEDNN=off" in binding.unavailable_reason()
    assert "oneDNN not used" in binding.describe()
    x = random_array((2, 3, 7, 9), "float32", seed=1)
    w = random_array((5, 3, 3, 3), "float32", seed=2)
    p = conv2d_params([TensorSpec(x.shape, "float32"), TensorSpec(w.shape, "float32")],
                      {"padding": [1]})
    assert conv2d_cpu(p, Epilogue((), (2, 5, 7, 9))).strategy == "im2col"
    (got,) = run_op("cpu", "conv2d", [x, w], {"padding": [1]})
    _check(got, ref_conv2d_attrs(x, w, {"padding": [1]}), _conv_bound(x, w, {"padding": [1]}))


def test_missing_library_is_not_an_error(monkeypatch, fresh_loader, tmp_path) -> None:
    monkeypatch.setenv(binding.ONEDNN_ENV, "auto")
    monkeypatch.setenv(binding.ONEDNN_LIB_ENV, str(tmp_path / "libdnnl.so.3"))
    assert not binding.available()
    assert "libdnnl.so.3 not found" in binding.unavailable_reason()
    assert "pip install onednn-cpu-gomp" in binding.unavailable_reason()
    p = conv2d_params([TensorSpec((1, 2, 5, 5), "float32"), TensorSpec((3, 2, 3, 3), "float32")],
                      {})
    monkeypatch.setenv(CONV_ENV, "auto")
    assert conv2d_cpu(p, Epilogue((), (1, 3, 3, 3))).strategy != "onednn"
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")  # asked for: now it is an error
    with pytest.raises(LibraryError, match="oneDNN is not available: libdnnl.so.3 not found"):
        conv2d_cpu(p, Epilogue((), (1, 3, 3, 3)))


def test_int8_kernels_follow_the_setting(monkeypatch, fresh_loader, tmp_path) -> None:
    """The int8 ops' oneDNN candidate (onednn/choice.py: onednn_int8_or): the reference where
    the library is missing, and an error when GRAPH_RUNTIME_ONEDNN=on asks for it."""
    from graph_runtime.lib.ops.quantized import _qdense_cpu
    specs = [TensorSpec((4, 32), "uint8"), TensorSpec((32, 16), "int8"),
             TensorSpec((16,), "float32"), TensorSpec((16,), "float32")]
    out = [TensorSpec((4, 16), "uint8")]
    monkeypatch.setenv(binding.ONEDNN_ENV, "auto")
    monkeypatch.setenv(binding.ONEDNN_LIB_ENV, str(tmp_path / "libdnnl.so.3"))
    assert "Int8Matmul" not in repr(_qdense_cpu(None, 0, specs, out, {}))
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    with pytest.raises(LibraryError, match="oneDNN is not available: libdnnl.so.3 not found"):
        _qdense_cpu(None, 0, specs, out, {})


def test_untested_version_is_refused(monkeypatch, fresh_loader) -> None:
    if not binding.available():
        pytest.skip(f"oneDNN not available: {binding.unavailable_reason()}")
    binding._tried = False
    monkeypatch.setattr(binding, "TESTED", ((9, 9),))
    assert not binding.available()
    assert "only 9.9 is tested" in binding.unavailable_reason()


def test_setting_is_checked(monkeypatch) -> None:
    monkeypatch.setenv(binding.ONEDNN_ENV, "maybe")
    with pytest.raises(LibraryError, match="GRAPH_RUNTIME_ONEDNN must be auto, on or off"):
        binding.onednn_mode()


def test_failed_call_names_the_call_and_status(onednn) -> None:
    handle = ctypes.c_void_p()
    with pytest.raises(LibraryError, match=r"dnnl_memory_desc_create_with_tag failed: "
                                           r"dnnl_invalid_arguments"):
        onednn.call("dnnl_memory_desc_create_with_tag", ctypes.byref(handle), 4,
                    binding.dims_array((1, 2, 3, 4)), abi.F32, 100000)


# -- pools --------------------------------------------------------------------------------------

POOL_CASES = [c for c in pool_tests.CASES + pool_tests.JIT_CASES if len(c[0]) == 4] + [
    ((1, 19, 15, 15), {"pool_size": [3, 3], "strides": [2, 2], "padding": [1]}),
    ((2, 21, 7, 9), {"pool_size": [2, 2], "strides": [2, 2], "ceil_mode": True}),
]


def _pool_kernel(op: str, shape, attrs, make_function) -> object:
    from graph_runtime.backends import get_backend
    from graph_runtime.lib.ops.pool import _pool_cpu
    specs = [TensorSpec(shape, "float32")]
    outputs = make_function(op).infer(specs, attrs)
    return _pool_cpu(op)(get_backend("cpu"), 0, specs, outputs, attrs)


@pytest.mark.parametrize("count_include_pad", [None, False, True])
@pytest.mark.parametrize("shape,attrs", POOL_CASES)
def test_pools_match_float64(onednn, monkeypatch, shape, attrs, count_include_pad, run_op,
                             make_function, assert_close, random_array) -> None:
    """max (count_include_pad None) and avg pools, forced onto oneDNN wherever it applies."""
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    x = random_array(shape, "float32", seed=5)
    if count_include_pad is None:
        op, reference = "max_pool2d", pool_tests.onnx_pool(x, "MaxPool",
                                                            **pool_tests.ours_to_onnx(attrs))
    else:
        attrs = dict(attrs, count_include_pad=count_include_pad)
        op = "avg_pool2d"
        onnx_attrs = dict(pool_tests.ours_to_onnx(attrs), count_include_pad=int(count_include_pad))
        reference = pool_tests.onnx_pool(x, "AveragePool", **onnx_attrs)
    kernel = _pool_kernel(op, shape, attrs, make_function)
    if isinstance(kernel, OnednnPool):  # else oneDNN cannot express it, or only in ref code
        assert not kernel.impl.startswith("ref"), kernel.impl
    elif shape == POOL_CASES[-2][0]:
        pytest.fail(f"ResNet's 3x3/s2 pool stayed off oneDNN: {kernel}")
    (got,) = run_op("cpu", op, [x], attrs)
    assert_close(got, reference)


@pytest.mark.parametrize("count_include_pad", [None, False, True])
@pytest.mark.parametrize("shape,attrs", [c for c in pool_tests.LONG_CASES if len(c[0]) == 4])
def test_pools_longer_than_the_data(onednn, monkeypatch, shape, attrs, count_include_pad,
                                    run_op, make_function, assert_close, random_array) -> None:
    """Windows longer than the data run their data taps on oneDNN (an include-padding
    average whose window was shortened stays off it: oneDNN would divide by the short one)."""
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    x = random_array(shape, "float32", seed=7)
    kind = "max" if count_include_pad is None else "avg"
    if count_include_pad is not None:
        attrs = dict(attrs, count_include_pad=count_include_pad)
    kernel = _pool_kernel(f"{kind}_pool2d", shape, attrs, make_function)
    if shape == pool_tests.LONG_CASES[0][0]:
        assert isinstance(kernel, OnednnPool) != bool(count_include_pad), kernel
    (got,) = run_op("cpu", f"{kind}_pool2d", [x], attrs)
    assert_close(got, pool_tests.brute_pool(x, kind, attrs))


@pytest.mark.parametrize("op", ["global_avg_pool2d", "global_max_pool2d"])
@pytest.mark.parametrize("shape", [(1, 1280, 7, 7), (3, 19, 5, 6)])
def test_global_pools(onednn, monkeypatch, op, shape, run_op, assert_close, random_array) -> None:
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    x = random_array(shape, "float32", seed=6)
    (got,) = run_op("cpu", op, [x])
    fold = np.mean if "avg" in op else np.max
    assert_close(got, fold(x.astype(np.float64), axis=(2, 3), keepdims=True))


# -- dense / matmul / batch_matmul --------------------------------------------------------------

GEMM_CASES = [
    ("dense", (1, 37), (19, 37), {}),
    ("dense", (5, 3, 33), (17, 33), {}),
    ("dense", (64, 512), (1000, 512), {}),
    ("matmul", (7, 13), (13, 9), {}),
    ("matmul", (13, 7), (9, 13), {"transpose_a": True, "transpose_b": True}),
    ("matmul", (2, 3, 11), (11, 5), {}),
    ("batch_matmul", (3, 7, 10), (3, 6, 10), {}),
    ("batch_matmul", (1, 7, 10), (4, 10, 6), {"transpose_b": False}),
    ("batch_matmul", (4, 10, 7), (1, 6, 10), {"transpose_a": True}),
]


def _gemm_ref(op, a, b, attrs):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if op == "dense":
        return a64 @ b64.T
    if attrs.get("transpose_a"):
        a64 = np.swapaxes(a64, -1, -2)
    if attrs.get("transpose_b", op == "batch_matmul"):
        b64 = np.swapaxes(b64, -1, -2)
    return a64 @ b64


@pytest.mark.parametrize("mode", ["workers", "openmp"])
@pytest.mark.parametrize("threads", ["1", "2", "5"])
@pytest.mark.parametrize("op,a_shape,b_shape,attrs", GEMM_CASES)
def test_gemms_match_float64(onednn, monkeypatch, mode, threads, op, a_shape, b_shape, attrs,
                             run_op, random_array) -> None:
    """Forced onto oneDNN, cut into blocks of rows or of the batch for 1, 2 and 5 workers, or
    on that many OpenMP threads."""
    from graph_runtime.lib.kernels.onednn import matmul as onednn_matmul
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(THREADS_ENV, threads)
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    monkeypatch.setattr(onednn_matmul, "MIN_SPLIT_FLOPS", 0)
    a = random_array(a_shape, "float32", seed=11)
    b = random_array(b_shape, "float32", seed=12)
    (got,) = run_op("cpu", op, [a, b], attrs)
    want = _gemm_ref(op, a, b, attrs)
    k = a_shape[-2] if attrs.get("transpose_a") else a_shape[-1]
    _check(got, want, 2 * (k + 1) * U32 * _gemm_ref(op, np.abs(a), np.abs(b), attrs))


def test_dense_weight_changes_between_runs(onednn, monkeypatch, random_array) -> None:
    """dense's weight packed into oneDNN's layout follows set_input, load_params and zero copy."""
    import graph_runtime as gr
    from graph_runtime.lib import Module
    from graph_runtime.lib.chain import Chain, Step
    from support import make_graph, null, tvm_op

    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    lib = Module("denselib")
    lib.register("fc", Chain("fc", [Step("dense"), Step("add")]))
    graph = make_graph([null("x"), null("w"), null("b"), tvm_op("fc", "fc", [0, 1, 2])], [3],
                       shapes=[[4, 24], [10, 24], [10], [4, 10]])
    m = gr.create(graph, lib, gr.cpu())
    x = random_array((4, 24), "float32", seed=1)
    ws = [random_array((10, 24), "float32", seed=s) for s in (2, 3, 4, 5)]
    b = random_array((10,), "float32", seed=6)

    def check(w) -> None:
        m.run(x=x)
        want = x.astype(np.float64) @ w.astype(np.float64).T + b
        np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=1e-5, atol=1e-5)

    m.load_params({"w": ws[0], "b": b})
    check(ws[0])
    m.set_input("w", ws[1])
    check(ws[1])
    m.load_params(gr.save_param_dict({"w": ws[2]}))
    check(ws[2])
    own = ws[3].copy()
    m.set_input_zero_copy("w", own)
    check(ws[3])
    own[...] = ws[0]  # changed in place, no setter: the zero-copy weight is repacked every run
    check(ws[0])


def test_activations_are_post_ops_of_one_primitive(onednn) -> None:
    """conv2d -> add -> leaky_relu (or sigmoid, silu, hard_swish, gelu) prepares to one oneDNN
    conv."""
    import graph_runtime as gr
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.lib.kernels.onednn.conv import OnednnConv

    specs = [TensorSpec((1, 3, 8, 8), "float32"), TensorSpec((5, 3, 3, 3), "float32"),
             TensorSpec((5, 1, 1), "float32")]
    for act in (Step("leaky_relu", {"alpha": 0.1}), Step("sigmoid"), Step("silu"),
                Step("hard_swish"), Step("gelu", {"approximate": "tanh"})):
        chain = Chain("f", [Step("conv2d", {"padding": [1]}), Step("add"), act])
        kernel = chain.prepare(gr.cpu(), specs, chain.infer(specs), {})
        assert isinstance(kernel, OnednnConv), (act.op, kernel)
        assert kernel.epilogue.ops[-1].kind.startswith(act.op)


def test_a_timed_winner_is_made_afresh(onednn, monkeypatch, run_op, random_array) -> None:
    """The choice times oneDNN on made-up arrays: the kernel the graph gets packs its own
    weight, never the timing's (a 70x130 dense came out wrong when the timed one was kept)."""
    from graph_runtime.lib import tuning
    from graph_runtime.lib.kernels.onednn import choice
    monkeypatch.setenv(binding.ONEDNN_ENV, "auto")
    timed = choice._race  # times (and so packs made-up weights), then oneDNN "wins"
    monkeypatch.setattr(choice, "_race", lambda race, one, other, shapes: race.known(dict(
        timed(race, one, other, shapes).seconds, on=0.0)))
    tuning.clear()
    a = random_array((70, 130), "float32", seed=1)
    w = random_array((33, 130), "float32", seed=2)
    (got,) = run_op("cpu", "dense", [a, w])
    want = a.astype(np.float64) @ w.astype(np.float64).T
    _check(got, want, 2 * 131 * U32 * (np.abs(a) @ np.abs(w).T))


# -- oneDNN's layout between oneDNN nodes -------------------------------------------------------

@pytest.mark.parametrize("mode", ["workers", "openmp"])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_a_conv_net_keeps_nhwc_between_onednn_nodes(onednn, monkeypatch, threads, mode,
                                                    random_array) -> None:
    """conv+bias+relu -> depthwise+clip -> max pool -> 1x1 conv + residual -> global pool: the
    entries between them stay NHWC (no reorders left inside), the result is the float64 one,
    and the intermediate outputs read back in NCHW."""
    import graph_runtime as gr
    from graph_runtime.lib import Module
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.lib.kernels.onednn import conv as onednn_conv
    from graph_runtime.lib.kernels.onednn.conv import OnednnConv
    from graph_runtime.lib.kernels.onednn.pool import OnednnPool
    from support import make_graph, null, tvm_op

    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    monkeypatch.setenv(THREADS_ENV, threads)
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    monkeypatch.setattr(onednn_conv, "MIN_SPLIT_FLOPS", 0)  # bands over NHWC arrays too
    lib = Module("nhwc")
    lib.register("conv_relu", Chain("conv_relu", [Step("conv2d", {"padding": [1]}), Step("add"),
                                                  Step("relu")]))
    lib.register("dw_clip", Chain("dw_clip", [Step("conv2d", {"padding": [1], "groups": 6}),
                                              Step("clip", {"a_min": 0.0, "a_max": 6.0})]))
    lib.register("pool", Chain("pool", [Step("max_pool2d", {"pool_size": [2, 2],
                                                            "strides": [2, 2]})]))
    lib.register("project", Chain("project", [Step("conv2d"), Step("add")]))
    lib.register("gap", Chain("gap", [Step("global_avg_pool2d")]))
    nodes = [null("x"), null("w1"), null("b1"), tvm_op("c1", "conv_relu", [0, 1, 2]),
             null("w2"), tvm_op("dw", "dw_clip", [3, 4]), tvm_op("p", "pool", [5]),
             null("w3"), tvm_op("pr", "project", [6, 7, 6]), tvm_op("g", "gap", [8])]
    shapes = [[2, 5, 8, 10], [6, 5, 3, 3], [6, 1, 1], [2, 6, 8, 10], [6, 1, 3, 3],
              [2, 6, 8, 10], [2, 6, 4, 5], [6, 6, 1, 1], [2, 6, 4, 5], [2, 6, 1, 1]]
    graph = make_graph(nodes, [9], shapes=shapes)
    m = gr.create(graph, lib, gr.cpu())
    arrays = {name: random_array(tuple(shapes[i]), "float32", seed=i)
              for i, name in [(0, "x"), (1, "w1"), (2, "b1"), (4, "w2"), (7, "w3")]}
    m.set_input(**arrays)
    m.run()
    a = {k: v.astype(np.float64) for k, v in arrays.items()}
    y1 = np.maximum(ref_conv2d_attrs(a["x"], a["w1"], {"padding": [1]}) + a["b1"], 0)
    y2 = np.clip(ref_conv2d_attrs(y1, a["w2"], {"padding": [1], "groups": 6}), 0, 6)
    y3 = y2.reshape(2, 6, 4, 2, 5, 2).max(axis=(3, 5))
    y4 = ref_conv2d_attrs(y3, a["w3"], {}) + y3
    want = y4.mean(axis=(2, 3), keepdims=True)
    got = m.get_output(0).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()))
    g = m.executor.graph
    kept = {g.nodes[nid].name for nid in range(len(g.nodes))
            if g.entry_id(nid, 0) in m.executor.channels_last}
    assert kept == {"c1", "dw", "p", "pr"}
    kernels = [s.kernel for s in m.executor.steps]
    convs = [k for k in kernels if isinstance(k, OnednnConv)]
    assert len(convs) == 3 and all(isinstance(k, OnednnPool) for k in kernels[2::2])
    assert not any(k.impl.startswith("ref") for k in kernels), kernels
    assert convs[0].data_in is not None and convs[0].out is None  # x is the user's: NCHW
    assert all(c.data_in is None and c.out is None for c in convs[1:])
    debug = m.debug_get_outputs()
    for name, value in (("c1", y1), ("dw", y2), ("p", y3), ("pr", y4)):
        np.testing.assert_allclose(debug[name][0], value, rtol=2e-5,
                                   atol=2e-5 * float(np.abs(value).max()))


def test_a_squeeze_excite_scale_between_convs_keeps_their_nhwc(onednn, monkeypatch,
                                                                random_array) -> None:
    """conv+relu -> global pool -> 1x1 conv+bias+sigmoid, times the conv's output -> 1x1 conv
    (RegNet's and EfficientNet's block): NumPy's multiply reads and writes the NHWC bytes
    through their NCHW views, so neither conv reorders, and the result is the float64 one."""
    import graph_runtime as gr
    from graph_runtime.lib import Module
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.lib.kernels.onednn.conv import OnednnConv
    from support import make_graph, null, tvm_op

    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    lib = Module("se")
    lib.register("conv_relu", Chain("conv_relu", [Step("conv2d", {"padding": [1]}), Step("add"),
                                                  Step("relu")]))
    lib.register("gap", Chain("gap", [Step("global_avg_pool2d")]))
    lib.register("excite", Chain("excite", [Step("conv2d"), Step("add"), Step("sigmoid"),
                                            Step("multiply")]))
    lib.register("project", Chain("project", [Step("conv2d")]))
    nodes = [null("x"), null("w1"), null("b1"), tvm_op("c1", "conv_relu", [0, 1, 2]),
             tvm_op("g", "gap", [3]), null("w2"), null("b2"),
             tvm_op("se", "excite", [4, 5, 6, 3]), null("w3"), tvm_op("pr", "project", [7, 8])]
    shapes = [[1, 5, 8, 10], [8, 5, 3, 3], [8, 1, 1], [1, 8, 8, 10], [1, 8, 1, 1],
              [8, 8, 1, 1], [8, 1, 1], [1, 8, 8, 10], [6, 8, 1, 1], [1, 6, 8, 10]]
    graph = make_graph(nodes, [9], shapes=shapes)
    m = gr.create(graph, lib, gr.cpu())
    arrays = {name: random_array(tuple(shapes[i]), "float32", seed=i)
              for i, name in [(0, "x"), (1, "w1"), (2, "b1"), (5, "w2"), (6, "b2"), (8, "w3")]}
    m.set_input(**arrays)
    m.run()
    a = {k: v.astype(np.float64) for k, v in arrays.items()}
    y1 = np.maximum(ref_conv2d_attrs(a["x"], a["w1"], {"padding": [1]}) + a["b1"], 0)
    pooled = y1.mean(axis=(2, 3), keepdims=True)
    scale = 1 / (1 + np.exp(-(ref_conv2d_attrs(pooled, a["w2"], {}) + a["b2"])))
    want = ref_conv2d_attrs(y1 * scale, a["w3"], {})
    got = m.get_output(0).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max()))
    g = m.executor.graph
    kept = {g.nodes[nid].name for nid in range(len(g.nodes))
            if g.entry_id(nid, 0) in m.executor.channels_last}
    assert {"c1", "se"} <= kept
    first, last = [s.kernel for s in m.executor.steps if isinstance(s.kernel, OnednnConv)]
    assert first.out is None and last.data_in is None  # no reorder on either side of the scale
    np.testing.assert_allclose(m.debug_get_outputs(["se"])["se"][0], y1 * scale, rtol=2e-5,
                               atol=2e-5 * float(np.abs(y1).max()))


# -- threading policy ---------------------------------------------------------------------------

def test_threading_modes_split_work_their_way(onednn, monkeypatch) -> None:
    """openmp: one primitive over the batch on OpenMP threads; workers: single-threaded bands
    over the runtime's workers; a conv's result is the same either way."""
    from graph_runtime.lib.kernels.onednn.conv import OnednnConv
    from graph_runtime.lib.kernels.onednn import conv as onednn_conv
    monkeypatch.setattr(onednn_conv, "MIN_SPLIT_FLOPS", 0)
    monkeypatch.setenv(THREADS_ENV, "2")
    p = conv2d_params([TensorSpec((1, 8, 12, 12), "float32"), TensorSpec((8, 8, 3, 3), "float32")],
                      {"padding": [1]})
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    results = {}
    for mode, (openmp, pieces) in {"openmp": (2, 1), "workers": (1, 4)}.items():
        monkeypatch.setenv(ONEDNN_THREADS.name, mode)
        kernel = OnednnConv(p, Epilogue((), (1, 8, 12, 12)))
        assert (kernel.openmp, len(kernel.pieces)) == (openmp, pieces)
        out = np.empty((1, 8, 12, 12), np.float32)
        kernel(x, w, out)
        results[mode] = out
    np.testing.assert_allclose(results["openmp"], results["workers"], rtol=1e-5, atol=1e-5)


def test_auto_leaves_a_busy_cpu_to_the_process_keeping_it(monkeypatch) -> None:
    """A process spinning on one of this process's CPUs is seen (busy_cpus) and auto then
    picks the workers, one per CPU left (the calling thread alone where one is left); the
    reason is said."""
    import subprocess
    import sys
    from graph_runtime.lib.kernels.onednn import policy
    monkeypatch.delenv(NUM_THREADS.name, raising=False)  # a count set is kept (_beside)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: no second mode to choose")
    spin = subprocess.Popen([sys.executable, "-c",
                             f"import os; os.sched_setaffinity(0, {{{cpus[0]}}})\nwhile True: pass"])
    try:
        import time
        time.sleep(0.3)  # the child is running
        assert cpus[0] in policy.busy_cpus(0.2)
        decided = policy._decide("auto", len(cpus))
    finally:
        spin.kill()
        spin.wait()
    assert decided.openmp == 1 and 1 <= decided.workers <= max(1, len(cpus) - 1)
    assert f"CPU {cpus[0]}" in decided.why and "busy" in decided.why
    if len(cpus) == 2:
        assert decided.workers == 1 and decided.why.startswith("one thread")


def test_auto_looks_again_and_follows_a_neighbour(monkeypatch) -> None:
    """recheck(): no sleep, at most every RECHECK_S; a neighbour arriving after the first
    decision turns OpenMP into the workers, and QUIET_S without one gives OpenMP back."""
    import types
    from graph_runtime.lib.kernels.onednn import policy
    from graph_runtime.lib.kernels import threads
    monkeypatch.setenv(ONEDNN_THREADS.name, "auto")
    monkeypatch.delenv(NUM_THREADS.name, raising=False)
    monkeypatch.setattr(threads, "_usable_cpus", lambda: 2)
    for name, value in (("_decided", {}), ("_look", None), ("_quiet_since", None)):
        monkeypatch.setattr(policy, name, value)
    clock = [100.0]
    monkeypatch.setattr(policy, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(policy, "busy_cpus", lambda window_s=0.0: [])  # quiet at first
    loads: list[float] = []  # other processes' CPUs at each look
    monkeypatch.setattr(policy, "others_between", lambda first, second, own: loads.pop(0))
    assert not policy.recheck()  # nothing decided yet: the first kernel decides
    assert policy.policy().openmp == 2
    assert not policy.recheck()  # the first look only starts the count

    def look(after: float, load: float) -> bool:
        clock[0] += after
        loads.append(load)
        return policy.recheck()
    clock[0] += 1.0
    assert not policy.recheck() and not loads  # too soon: not even looked
    assert look(2.0, 0.6) and policy.policy().openmp == 1
    assert "looked again: other processes used 0.6 CPUs" in policy.policy().why
    # the neighbour's CPU left to it: of two, the calling thread alone, for every loop
    assert policy.policy().workers == 1 and policy.policy().why.startswith("one thread")
    assert not look(3.0, 0.9) and not look(3.0, 0.1)  # quiet from here
    assert not look(policy.QUIET_S - 1.0, 0.0) and policy.policy().openmp == 1
    assert look(2.0, 0.2) and policy.policy().openmp == 2
    assert not loads


def test_loops_follow_the_cpus_auto_leaves(onednn, monkeypatch) -> None:
    """num_threads() (every parallel loop's workers), GRAPH_RUNTIME_NUM_THREADS unset: the
    usable CPUs while OpenMP is taken, those left beside a busy neighbour once auto moved to
    the workers; a count the user set, or a mode forced, is kept as it is."""
    from graph_runtime.lib.kernels import threads
    from graph_runtime.lib.kernels.onednn import policy
    monkeypatch.delenv(NUM_THREADS.name, raising=False)
    monkeypatch.setenv(ONEDNN_THREADS.name, "auto")
    monkeypatch.setattr(threads, "_usable_cpus", lambda: 2)
    monkeypatch.setattr(policy, "_decided", {("auto", 2): policy.Threads(2, 1, "OpenMP")})
    assert threads.num_threads() == 2 and threads.cpu_threads() == 2
    policy._decided[("auto", 2)] = policy._beside(2, 1, "test: CPU 1 busy")
    assert threads.num_threads() == 1 and threads.cpu_threads() == 2
    monkeypatch.setattr(policy, "_decided", {("auto", 3): policy._beside(3, 1, "test")})
    monkeypatch.setattr(threads, "_usable_cpus", lambda: 3)
    assert threads.num_threads() == 2  # a worker for each CPU left
    monkeypatch.setenv(NUM_THREADS.name, "3")
    assert threads.num_threads() == 3 and policy._beside(3, 1, "test").workers == 3
    monkeypatch.delenv(NUM_THREADS.name)
    monkeypatch.setenv(ONEDNN_THREADS.name, "workers")
    assert threads.num_threads() == 3


@pytest.mark.parametrize("mode", ["workers", "openmp"])
def test_matmul_impl_is_read_without_building_the_kernel(onednn, monkeypatch, mode) -> None:
    # choice.py asks every oneDNN matmul it offers for its impl; one passed over must cost no
    # primitives and no packed weight, and the answer must be the built kernel's.
    from graph_runtime.lib.kernels.onednn.matmul import OnednnMatmul
    monkeypatch.setenv(ONEDNN_THREADS.name, mode)
    kernel = OnednnMatmul(1, 128, 768, 768, False, False, 1, 1)
    asked = kernel.impl
    assert kernel.items == [] and not hasattr(kernel, "weight")
    assert kernel.pieces() >= 1 and kernel.impl == asked and not asked.startswith("ref")


def test_a_frozen_weight_is_packed_once_for_every_kernel_reading_it(onednn) -> None:
    # a symbolic module's param (never written again): the kernels of each shape packing it
    # into one layout share one packed copy (an inner product's layout may depend on its rows:
    # AVX2); a weight not frozen keeps a packed copy per kernel
    from graph_runtime.lib.kernels.derived import freeze
    from graph_runtime.lib.kernels.onednn.matmul import OnednnMatmul
    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 64)).astype(np.float32)  # dense's (units, features)
    freeze(w)
    kernels = []
    for m in (5, 40, 40):
        kernel = OnednnMatmul(1, m, 96, 64, False, True, 1, 1)
        a = rng.standard_normal((m, 64)).astype(np.float32)
        out = np.empty((m, 96), np.float32)
        kernel(a, w, out)
        np.testing.assert_allclose(out, a @ w.T, rtol=1e-4, atol=1e-4)
        kernels.append(kernel)
    first = kernels[0].weight
    assert not first.direct and first._own is not None  # packed, by the first kernel
    same = kernels[1].weight.memory.desc == first.memory.desc
    assert (kernels[1].weight.buffer is first.buffer) == same
    assert (kernels[1].weight._own is None) == same
    assert kernels[2].weight.buffer is kernels[1].weight.buffer and kernels[2].weight._own is None
    loose = w.copy()  # not frozen
    kernel = OnednnMatmul(1, 5, 96, 64, False, True, 1, 1)
    out = np.empty((5, 96), np.float32)
    kernel(np.ones((5, 64), np.float32), loose, out)
    assert kernel.weight._own is not None and kernel.weight.buffer is not first.buffer
    np.testing.assert_allclose(out, np.ones((5, 64)) @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (False, False), (True, False)])
def test_a_batched_matmul_for_a_new_shape_takes_any_shape(onednn, trans_a, trans_b) -> None:
    # prepared for a symbolic module's shape (a decoder's attention products, one past length
    # more each step): one run-time-dims primitive serves every shape, each met again reused;
    # prepared elsewhere the product keeps one primitive of its own shape
    from graph_runtime.lib import tuning
    from graph_runtime.lib.kernels.onednn.matmul import OnednnMatmul
    rng = np.random.default_rng(4)
    assert not OnednnMatmul(8, 1, 40, 64, trans_a, trans_b, 8, 8, split=False).any_shape()
    with tuning.by_size_class():
        kernel = OnednnMatmul(8, 1, 40, 64, trans_a, trans_b, 8, 8, split=False)
        assert OnednnMatmul(8, 1, 40, 64, trans_a, trans_b, 8, 8, split=True).any_shape() is False
    assert kernel.any_shape()
    for m, n, k, b_batches in [(1, 40, 64, 8), (1, 41, 64, 8), (3, 64, 41, 1), (1, 40, 64, 8)]:
        a = rng.standard_normal((8, k, m) if trans_a else (8, m, k)).astype(np.float32)
        b = rng.standard_normal((b_batches, n, k) if trans_b else (b_batches, k, n)).astype(
            np.float32)
        out = np.empty((8, m, n), np.float32)
        kernel(a, b, out)
        op_a = a.transpose(0, 2, 1) if trans_a else a
        op_b = b.transpose(0, 2, 1) if trans_b else b
        np.testing.assert_allclose(out, op_a @ op_b, rtol=1e-4, atol=1e-4)
    assert len(kernel._by_shape) == 3 and len(kernel.items) == 1
    # a kept shape's memories hold addresses, not arrays: a dropped module's pool is freed
    assert all(memory._array is None for _, bindings in kernel._by_shape.values()
               for memory, _, _ in bindings)
    out2 = np.empty((8, 1, 40), np.float32)
    kernel(a, b, out2)  # the same inputs into another output: bound again
    np.testing.assert_allclose(out2, op_a @ op_b, rtol=1e-4, atol=1e-4)
    with pytest.raises(LibraryError, match=r"batch must be 1 or the output's 8"):
        kernel(np.ones((4, 1, 64) if not trans_a else (4, 64, 1), np.float32),
               np.ones((8, 40, 64) if trans_b else (8, 64, 40), np.float32),
               np.empty((8, 1, 40), np.float32))


def test_each_thread_lends_its_own_scratchpad(onednn, monkeypatch, run_op,
                                              random_array) -> None:
    """Every primitive's scratchpad is the user's (oneDNN's own is one per creating thread, and
    a band made on the caller runs on a worker): a primitive that needs one binds the running
    thread's buffer, never another thread's, and the grouped, dilated conv that oneDNN runs by
    GEMM (im2col in the scratchpad) on CPUs without AVX-512 gives the conv in bands on 3
    workers, again and again."""
    import threading
    from graph_runtime.lib.kernels.onednn import conv as onednn_conv
    addresses: list[int] = []
    alive = threading.Barrier(3)  # every thread holds its buffer while the others lend theirs

    def lend() -> None:
        addresses.append(binding._thread_scratchpad(4096))
        alive.wait()
    threads = [threading.Thread(target=lend) for _ in range(2)]
    for t in threads:
        t.start()
    lend()
    for t in threads:
        t.join()
    assert len(set(addresses)) == 3
    monkeypatch.setenv(THREADS_ENV, "3")
    monkeypatch.setenv(ONEDNN_THREADS.name, "workers")
    monkeypatch.setattr(onednn_conv, "MIN_SPLIT_FLOPS", 0)
    made = []
    real = binding.Primitive.__init__

    def record(self, pd, args) -> None:
        real(self, pd, args)
        made.append(self)
    monkeypatch.setattr(binding.Primitive, "__init__", record)
    data_shape, weight_shape, attrs = (1, 10, 8, 8), (20, 1, 5, 5), {
        "groups": 10, "padding": [2], "dilation": [1, 2]}
    x = random_array(data_shape, "float32", seed=6)
    w = random_array(weight_shape, "float32", seed=7)
    for _ in range(5):
        (got,) = run_op("cpu", "conv2d", [x, w], attrs)
        y = ref_conv2d_attrs(x, w, attrs)
        _check(got, y, _conv_bound(x, w, attrs))
    assert made and all((p._scratch is not None) == (p.pd.scratchpad_bytes > 0) for p in made)


def test_asked_while_off_it_still_loads_when_turned_on(monkeypatch, fresh_loader) -> None:
    """library() asked while GRAPH_RUNTIME_ONEDNN=off refuses, naming the setting, and tries
    nothing: the same process turned to auto loads it (a call made while off once kept the
    library from ever loading, its reason 'turned off' under auto)."""
    binding._loaded, binding._reason = None, ""
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "off")
    with pytest.raises(LibraryError, match="turned off by GRAPH_RUNTIME_ONEDNN=off"):
        binding.library()
    assert not binding.available()
    monkeypatch.setenv("GRAPH_RUNTIME_ONEDNN", "auto")
    assert "turned off" not in binding.unavailable_reason()
    require_onednn()  # (the rest needs the library installed)
    assert binding.available() and binding.library() is binding._loaded
