"""Convolutions through cuDNN (lib/kernels/cuda_cudnn.py): which chain ops one cuDNN call takes
and what it refuses, everywhere; on a GPU, plain and fused convolutions against float64 NumPy
(TF32 off, as the suite runs CUDA), the im2col kernel where cuDNN is off or refuses, NaN through
the fused relu, and a ResNet-style model captured as a CUDA graph against the CPU."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graph_runtime as gr
from graph_runtime.device import Device
from graph_runtime.lib.chain import Chain, Step, _fuse_epilogue
from graph_runtime.lib.conv_params import conv2d_params
from graph_runtime.lib.kernels.cuda_cudnn import CudnnConv, CudnnEpilogue, cudnn_epilogue, \
    cudnn_refusal
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.loader import function_from_json
from graph_runtime.settings import CUDA_CUDNN, CUDA_TF32, overridden

from test_conv import ref_conv2d

DATA = Path(__file__).resolve().parents[1] / "data" / "onnx"
OUT = TensorSpec((2, 8, 5, 5), "float32")
BIAS = TensorSpec((8, 1, 1), "float32")
BIAS4 = TensorSpec((1, 8, 1, 1), "float32")
ROW = TensorSpec((1, 8, 5, 1), "float32")


@pytest.mark.parametrize("ops,operands,want", [
    ([("add", 0), ("relu", None)], [BIAS], (2, CudnnEpilogue(0, None))),
    ([("add", 0), ("add", 1), ("relu", None)], [BIAS4, OUT], (3, CudnnEpilogue(0, 1))),
    ([("add", 0), ("add", 1), ("relu", None)], [OUT, BIAS], (3, CudnnEpilogue(1, 0))),
    ([("relu", None), ("add", 0)], [BIAS], (1, CudnnEpilogue(None, None))),
    ([("add", 0), ("relu", None)], [OUT], (2, CudnnEpilogue(None, 0))),
    # no relu to end on, a second bias, a row-shaped operand, another activation: nothing
    ([("add", 0)], [BIAS], (0, None)),
    ([("add", 0), ("add", 1), ("relu", None)], [BIAS, BIAS], (0, None)),
    ([("add", 0), ("relu", None)], [ROW], (0, None)),
    ([("add", 0), ("clip", (0.0, 6.0))], [BIAS], (0, None)),
    ([("add", 0), ("relu", None)], [TensorSpec((8, 1, 1), "float64")], (0, None)),
])
def test_what_one_cudnn_call_applies(ops, operands, want) -> None:
    assert cudnn_epilogue(ops, operands, OUT) == want


def test_float64_and_other_ranks_are_not_fused() -> None:
    ops = [("add", 0), ("relu", None)]
    assert cudnn_epilogue(ops, [BIAS], TensorSpec((2, 8, 5, 5), "float64")) == (0, None)
    assert cudnn_epilogue(ops, [BIAS], TensorSpec((8, 5, 5), "float32")) == (0, None)


def _plan(ops: list[str], operands: list[tuple[int, ...]]) -> Any:
    chain = Chain("f", [Step("conv2d", {"padding": [1]})] + [Step(op) for op in ops])
    inputs = [TensorSpec((2, 3, 5, 5), "float32"), TensorSpec((8, 3, 3, 3), "float32")]
    inputs += [TensorSpec(shape, "float32") for shape in operands]
    return chain._plan(inputs, {}, [OUT])


def test_chain_merges_what_the_kernel_takes() -> None:
    """The merged step reads the bias and residual it took and writes the relu's output; an op
    after the relu stays a step of its own, reading the merged step's result."""
    plan = _plan(["add", "add", "relu", "sigmoid"], [(8, 1, 1), OUT.shape])
    fused = _fuse_epilogue(plan, 5, lambda head, ops, operands: cudnn_epilogue(
        ops, operands, head.outputs[0])[0])
    assert [p.op.name for p in fused] == ["conv2d", "sigmoid"]
    assert fused[0].epilogue == [("add", 0), ("add", 1), ("relu", None)]
    assert fused[0].slots == [0, 1, 2, 3] and fused[0].out_slots == [5]
    assert fused[1].slots == [5] and fused[1].out_slots == [4]
    untouched = _fuse_epilogue(_plan(["add"], [(8, 1, 1)]), 4,
                               lambda head, ops, operands: 0)
    assert [p.op.name for p in untouched] == ["conv2d", "add"]
    assert untouched[0].epilogue is None


@pytest.mark.parametrize("attrs,dtype,shapes,why", [
    ({"padding": [0, 1, 1, 0]}, "float32", ((1, 3, 5, 5), (4, 3, 3, 3)), "opposite sides"),
    ({}, "float16", ((1, 3, 5, 5), (4, 3, 3, 3)), "float16"),
    ({}, "float32", ((0, 3, 5, 5), (4, 3, 3, 3)), "empty"),
])
def test_refusals_say_why(attrs, dtype, shapes, why) -> None:
    p = conv2d_params([TensorSpec(s, dtype) for s in shapes], attrs)
    assert why in cudnn_refusal(p)


def test_refused_when_the_setting_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CUDA_CUDNN.name, "off")
    p = conv2d_params([TensorSpec((1, 3, 5, 5), "float32"),
                       TensorSpec((4, 3, 3, 3), "float32")], {"padding": [1]})
    assert cudnn_refusal(p) == "GRAPH_RUNTIME_CUDA_CUDNN=off"


# -- on a GPU -----------------------------------------------------------------------------------

@pytest.fixture
def cudnn_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN wherever it takes a convolution (auto would measure it against im2col)."""
    monkeypatch.setenv(CUDA_CUDNN.name, "on")


def _run_cuda(func: Any, inputs: list[np.ndarray], attrs: dict | None = None) -> tuple[Any, Any]:
    """(the prepared kernel, its host output) of func on cuda(0)."""
    from graph_runtime.backends import get_backend
    chain = Chain(func, [Step(func)]) if isinstance(func, str) \
        else function_from_json("f", func, "test")
    backend = get_backend("cuda")
    specs = [TensorSpec(tuple(a.shape), str(a.dtype)) for a in inputs]
    (out_spec,) = chain.infer(specs, attrs)
    run = chain.prepare(Device(backend.device_type, 0), specs, [out_spec], dict(attrs or {}))
    args = [backend.empty(0, a.shape, a.dtype) for a in inputs]
    for host, arr in zip(inputs, args):
        backend.from_host(host, arr)
    out = backend.empty(0, tuple(out_spec.shape), np.dtype(out_spec.dtype))
    run(*args, out)
    backend.sync(0)
    return run, backend.to_host(out)


CUDNN_CASES = [
    ((2, 3, 9, 9), (8, 3, 3, 3), {"padding": [1]}),
    ((2, 3, 16, 16), (8, 3, 7, 7), {"padding": [3], "strides": [2, 2]}),  # a ResNet stem
    ((2, 16, 6, 6), (8, 16, 1, 1), {}),
    ((1, 4, 9, 8), (6, 2, 3, 3), {"padding": [2, 1], "dilation": [2, 1], "groups": 2}),
    ((1, 6, 7, 7), (6, 1, 3, 3), {"padding": [1], "strides": [2, 1], "groups": 6}),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("data_shape,weight_shape,attrs", CUDNN_CASES)
def test_cudnn_conv(dtype, data_shape, weight_shape, attrs, random_array, cudnn_on) -> None:
    x = random_array(data_shape, dtype, seed=1)
    w = random_array(weight_shape, dtype, seed=2)
    run, got = _run_cuda("conv2d", [x, w], attrs)
    assert isinstance(run, CudnnConv), run
    assert run.note().startswith("cuDNN ")
    want = ref_conv2d(x, w, attrs.get("strides", (1, 1)), attrs.get("padding", 0),
                      attrs.get("dilation", (1, 1)), attrs.get("groups", 1))
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-10,
                               atol=1e-4 if dtype == "float32" else 1e-10)


def _fused_reference(x, w, bias, residual) -> np.ndarray:
    y = ref_conv2d(x, w, padding=1)
    if bias is not None:
        y = y + bias.astype(np.float64).reshape(1, -1, 1, 1)
    if residual is not None:
        y = y + residual
    return np.maximum(y, 0)


@pytest.mark.cuda
@pytest.mark.parametrize("ops,parts", [
    (["add", "relu"], ["bias"]),
    (["add", "add", "relu"], ["bias", "residual"]),
    (["add", "add", "relu"], ["residual", "bias"]),
    (["add", "relu"], ["residual"]),
    (["relu"], []),
])
def test_cudnn_fused_bias_residual_relu(ops, parts, random_array, cudnn_on) -> None:
    x = random_array((2, 6, 8, 8), "float32", seed=3)
    w = random_array((5, 6, 3, 3), "float32", seed=4)
    operands = {"bias": random_array((5, 1, 1), "float32", seed=5),
                "residual": random_array((2, 5, 8, 8), "float32", seed=6)}
    func = {"ops": [{"op": "conv2d", "padding": [1]}] + [{"op": op} for op in ops]}
    run, got = _run_cuda(func, [x, w] + [operands[k] for k in parts])
    assert isinstance(run, CudnnConv) and run.epilogue is not None, run
    assert run.note().endswith("relu")
    want = _fused_reference(x, w, operands["bias"] if "bias" in parts else None,
                            operands["residual"] if "residual" in parts else None)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert (got >= 0).all()


@pytest.mark.cuda
def test_cudnn_relu_keeps_nan(random_array, cudnn_on) -> None:
    """relu(NaN) is NaN (NumPy's maximum): the fused call propagates it."""
    x = random_array((1, 3, 6, 6), "float32", seed=7)
    x[0, 1, 2, 3] = np.nan
    w = random_array((4, 3, 3, 3), "float32", seed=8)
    bias = random_array((4, 1, 1), "float32", seed=9)
    func = {"ops": [{"op": "conv2d", "padding": [1]}, {"op": "add"}, {"op": "relu"}]}
    _, got = _run_cuda(func, [x, w, bias])
    want = _fused_reference(x, w, bias, None)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want).sum() == 4 * 9


@pytest.mark.cuda
def test_cudnn_tf32(monkeypatch: pytest.MonkeyPatch, random_array,
                    cudnn_on) -> None:
    """With TF32 on (the runtime's default), the products round to 10 mantissa bits: close to
    float32, within TF32's error."""
    monkeypatch.setenv(CUDA_TF32.name, "on")
    x = random_array((4, 32, 12, 12), "float32", seed=10)
    w = random_array((64, 32, 3, 3), "float32", seed=11)
    run, got = _run_cuda("conv2d", [x, w], {"padding": [1]})
    assert isinstance(run, CudnnConv)
    want = ref_conv2d(x, w, padding=1)
    assert np.abs(got - want).max() / np.abs(want).max() < 5e-3


@pytest.mark.cuda
def test_im2col_where_cudnn_is_off_or_refuses(monkeypatch: pytest.MonkeyPatch,
                                              random_array) -> None:
    x = random_array((1, 3, 6, 6), "float32", seed=12)
    w = random_array((4, 3, 3, 3), "float32", seed=13)
    bias = random_array((4, 1, 1), "float32", seed=14)
    func = {"ops": [{"op": "conv2d", "padding": [1]}, {"op": "add"}, {"op": "relu"}]}
    want = _fused_reference(x, w, bias, None)
    with overridden(CUDA_CUDNN, "off"):
        run, got = _run_cuda(func, [x, w, bias])
    assert not isinstance(run, CudnnConv)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    run, got = _run_cuda("conv2d", [x, w], {"padding": [0, 1, 1, 0]})
    assert not isinstance(run, CudnnConv)
    np.testing.assert_allclose(got, ref_conv2d(x, w, padding=[0, 1, 1, 0]), rtol=1e-5,
                               atol=1e-4)


@pytest.mark.cuda
def test_resnet_on_cuda_replayed_as_a_graph(cudnn_on) -> None:
    """The test ResNet (conv + bias + residual + relu blocks, a strided shortcut) on cuda(0):
    its convolutions are cuDNN's, fused where a relu follows; the captured, replayed runs equal
    the CPU's answers."""
    from graph_runtime.frontend import from_onnx
    from graph_runtime.lib.chain import kernel_note
    graph_json, lib, params = from_onnx(str(DATA / "resnet_ts.onnx"))
    blob = gr.save_param_dict(params)
    gpu = gr.create(graph_json, lib, gr.cuda(0))
    host = gr.create(graph_json, lib, gr.cpu(0))
    gpu.load_params(blob)
    host.load_params(blob)
    notes = [kernel_note(step.kernel) for step in gpu.executor.steps]
    assert sum(note.startswith("cuDNN") and note.endswith("relu") for note in notes) == 9, notes
    assert sum(note.startswith("cuDNN") for note in notes) == 12, notes
    rng = np.random.default_rng(0)
    states = []
    for _ in range(4):  # plain, captured, replayed twice
        x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
        gpu.run(data=x)
        host.run(data=x)
        states.append(gpu.executor.cuda_graph.state)
        np.testing.assert_allclose(gpu.get_output(0).numpy(), host.get_output(0).numpy(),
                                   rtol=1e-4, atol=1e-4)
    assert states == ["capture", "replaying", "replaying", "replaying"]
    assert gpu.executor.cuda_graph_reason == ""


@pytest.mark.cuda
def test_auto_measures_each_shape_once(monkeypatch: pytest.MonkeyPatch, random_array) -> None:
    """auto (the default): cuDNN's kernel and im2col's are replayed as CUDA graphs once per
    shape; the faster runs, and a second node of that shape takes the answer kept."""
    from graph_runtime.lib.ops import conv
    monkeypatch.setattr(conv, "_CUDNN_FASTER", {})
    x = random_array((2, 8, 10, 10), "float32", seed=15)
    w = random_array((16, 8, 3, 3), "float32", seed=16)
    bias = random_array((16, 1, 1), "float32", seed=17)
    func = {"ops": [{"op": "conv2d", "padding": [1]}, {"op": "add"}, {"op": "relu"}]}
    want = _fused_reference(x, w, bias, None)
    run, got = _run_cuda(func, [x, w, bias])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    measured = dict(conv._CUDNN_FASTER)
    # with the fused bias and relu; where im2col won, the plain convolution is measured too
    faster = [v for k, v in measured.items() if k[2] == (True, False)]
    assert len(faster) == 1 and len(measured) == (1 if faster[0] else 2), measured
    assert isinstance(run, CudnnConv) == faster[0]
    run, got = _run_cuda(func, [x, w, bias])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert conv._CUDNN_FASTER == measured
