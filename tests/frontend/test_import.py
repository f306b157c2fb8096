"""ONNX import: each supported pattern against ONNX Runtime on every backend, and the passes."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from onnx_builders import (F32, I64, RNG, assert_matches, helper, init, model, onnx, run_ort,
                           run_ours, tensor, weights)

from graph_runtime import FrontendError
from graph_runtime.frontend import from_onnx, import_onnx

node = helper.make_node


def _x(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# -- one model per pattern: (model, feeds) ------------------------------------------------------

def conv_bn_relu() -> tuple:
    nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             node("BatchNormalization", ["c", "g", "be", "m", "v"], ["n"], epsilon=1e-3),
             node("Relu", ["n"], ["y"])]
    inits = [init("w", weights(8, 3, 3, 3)), init("b", weights(8)), init("g", weights(8) + 1),
             init("be", weights(8)), init("m", weights(8)), init("v", np.abs(weights(8)) + 0.5)]
    return model(nodes, [tensor("x", F32, [1, 3, 9, 9])], [tensor("y", F32, None)], inits), \
        {"x": _x(1, 3, 9, 9)}


def depthwise_clip_same() -> tuple:
    nodes = [node("Conv", ["x", "w"], ["c"], group=4, auto_pad="SAME_UPPER", strides=[2, 2],
                  kernel_shape=[3, 3]),
             node("Clip", ["c", "lo", "hi"], ["y"])]
    inits = [init("w", weights(4, 1, 3, 3)), init("lo", np.float32(0)),
             init("hi", np.float32(6))]
    return model(nodes, [tensor("x", F32, [1, 4, 8, 7])], [tensor("y", F32, None)], inits), \
        {"x": _x(1, 4, 8, 7)}


def conv_dilated_1d() -> tuple:
    nodes = [node("Conv", ["x", "w", "b"], ["y"], dilations=[2], pads=[2, 1])]
    inits = [init("w", weights(5, 3, 3)), init("b", weights(5))]
    return model(nodes, [tensor("x", F32, [2, 3, 11])], [tensor("y", F32, None)], inits), \
        {"x": _x(2, 3, 11)}


def conv_transpose() -> tuple:
    nodes = [node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                  output_padding=[1, 1])]
    inits = [init("w", weights(4, 3, 3, 3)), init("b", weights(3))]
    return model(nodes, [tensor("x", F32, [1, 4, 5, 5])], [tensor("y", F32, None)], inits), \
        {"x": _x(1, 4, 5, 5)}


def gemm_variants() -> tuple:
    nodes = [node("Gemm", ["a", "w", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0),
             node("Gemm", ["y", "b2"], ["z"])]
    inits = [init("w", weights(6, 4)), init("c", weights(6))]
    return model(nodes, [tensor("a", F32, [4, 3]), tensor("b2", F32, [6, 2])],
                 [tensor("z", F32, None)], inits), {"a": _x(4, 3), "b2": _x(6, 2)}


def matmul_broadcast() -> tuple:
    nodes = [node("MatMul", ["a", "b"], ["ab"]), node("MatMul", ["ab", "w"], ["y"]),
             node("Add", ["y", "bias"], ["z"])]
    inits = [init("w", weights(5, 3)), init("bias", weights(3))]
    return model(nodes, [tensor("a", F32, [2, 1, 4, 6]), tensor("b", F32, [3, 6, 5])],
                 [tensor("z", F32, None)], inits), {"a": _x(2, 1, 4, 6), "b": _x(3, 6, 5)}


def norms() -> tuple:
    nodes = [node("LayerNormalization", ["x", "g", "bb"], ["l"], axis=-2),
             node("InstanceNormalization", ["l", "s", "t"], ["i"]),
             node("GroupNormalization", ["i", "s", "t"], ["y"], num_groups=2)]
    inits = [init("g", weights(5, 6) + 1), init("bb", weights(5, 6)), init("s", weights(4) + 1),
             init("t", weights(4))]
    return model(nodes, [tensor("x", F32, [2, 4, 5, 6])], [tensor("y", F32, None)], inits,
                 opset=21), {"x": _x(2, 4, 5, 6)}


def softmax_old_axis() -> tuple:
    nodes = [node("Softmax", ["x"], ["s"], axis=1), node("LogSoftmax", ["s"], ["y"], axis=2)]
    return model(nodes, [tensor("x", F32, [2, 3, 4])], [tensor("y", F32, None)], opset=11), \
        {"x": _x(2, 3, 4)}


def pools() -> tuple:
    nodes = [node("MaxPool", ["x"], ["m"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
             node("AveragePool", ["m"], ["a"], kernel_shape=[2, 2], pads=[1, 0, 0, 1],
                  count_include_pad=1),
             node("GlobalAveragePool", ["a"], ["y"])]
    return model(nodes, [tensor("x", F32, [1, 2, 10, 9])], [tensor("y", F32, None)]), \
        {"x": _x(1, 2, 10, 9)}


def efficientnet_pooler() -> tuple:
    """Hugging Face's EfficientNet: AvgPool2d(1280, ceil_mode=True) over its 7x7 map, as torch
    exports it; then a ceil_mode max pool whose last window ONNX drops (onnx's shape inference
    keeps it) and a reader of its output."""
    nodes = [node("AveragePool", ["x"], ["p"], kernel_shape=[1280, 1280], strides=[1280, 1280],
                  pads=[0, 0, 0, 0], ceil_mode=1, count_include_pad=1),
             node("Flatten", ["p"], ["y"]),
             node("MaxPool", ["x"], ["m"], kernel_shape=[3, 3], strides=[3, 3],
                  pads=[1, 1, 2, 2], ceil_mode=1),
             node("Relu", ["m"], ["z"])]
    return model(nodes, [tensor("x", F32, [2, 1280, 7, 7])],
                 [tensor("y", F32, None), tensor("z", F32, None)]), {"x": _x(2, 1280, 7, 7)}


def resize_modes() -> tuple:
    nodes = [node("Resize", ["x", "", "s"], ["n"], mode="nearest"),
             node("Resize", ["n", "", "", "sz"], ["y"], mode="linear",
                  coordinate_transformation_mode="align_corners")]
    inits = [init("s", np.array([1, 1, 2, 2], np.float32)), init("sz", np.array([1, 2, 5, 7]))]
    return model(nodes, [tensor("x", F32, [1, 2, 3, 4])], [tensor("y", F32, None)], inits), \
        {"x": _x(1, 2, 3, 4)}


def elementwise_math() -> tuple:
    nodes = [node("Abs", ["x"], ["a"]), node("Add", ["a", "one"], ["a1"]),
             node("Sqrt", ["a1"], ["s"]), node("Log", ["s"], ["l"]), node("Exp", ["l"], ["e"]),
             node("Pow", ["e", "two"], ["p"]), node("Reciprocal", ["p"], ["r"]),
             node("Neg", ["r"], ["n"]), node("Div", ["n", "x2"], ["d"]),
             node("Sub", ["one", "d"], ["y"]), node("Erf", ["y"], ["z"]),
             node("Mul", ["z", "x"], ["out"])]
    inits = [init("one", np.float32(1)), init("two", np.float32(2))]
    return model(nodes, [tensor("x", F32, [3, 4]), tensor("x2", F32, [4])],
                 [tensor("out", F32, None)], inits), {"x": _x(3, 4), "x2": _x(4) + 3}


def activations() -> tuple:
    nodes = [node("LeakyRelu", ["x"], ["a"], alpha=0.1), node("HardSigmoid", ["a"], ["b"]),
             node("HardSwish", ["x"], ["c"]), node("Softplus", ["c"], ["d"]),
             node("Sigmoid", ["d"], ["e"]), node("Tanh", ["e"], ["f"]),
             node("Gelu", ["f"], ["g"]), node("Add", ["b", "g"], ["y"])]
    return model(nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, None)], opset=20), \
        {"x": _x(2, 8) * 3}


def where_compare_cast() -> tuple:
    nodes = [node("Greater", ["x", "zero"], ["m"]), node("Where", ["m", "x", "zero"], ["w"]),
             node("Cast", ["m"], ["mi"], to=I64), node("Equal", ["x", "x"], ["eq"]),
             node("Not", ["eq"], ["ne"]), node("Cast", ["ne"], ["y2"], to=F32),
             node("Add", ["w", "y2"], ["y"])]
    inits = [init("zero", np.float32(0))]
    return model(nodes, [tensor("x", F32, [3, 5])],
                 [tensor("y", F32, None), tensor("mi", I64, None)], inits), {"x": _x(3, 5)}


def shape_ops() -> tuple:
    nodes = [node("Reshape", ["x", "shp"], ["r"]), node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
             node("Unsqueeze", ["t", "ax0"], ["u"]), node("Squeeze", ["u", "ax0"], ["q"]),
             node("Slice", ["q", "st", "en", "axs", "stp"], ["sl"]),
             node("Split", ["sl", "sp"], ["s1", "s2"], axis=1),
             node("Concat", ["s2", "s1", "s2"], ["c"], axis=1),
             node("Pad", ["c", "pads", "pv"], ["p"]),
             node("Expand", ["p", "exp"], ["e"]), node("Tile", ["e", "reps"], ["ti"]),
             node("Flatten", ["ti"], ["y"], axis=2)]
    inits = [init("shp", np.array([2, 0, -1])), init("ax0", np.array([0])),
             init("st", np.array([-1, 0])), init("en", np.array([-100, 6])),
             init("axs", np.array([0, -1])), init("stp", np.array([-2, 2])),
             init("sp", np.array([1, 1])), init("pads", np.array([0, 1, 0, 0, 0, 2])),
             init("pv", np.float32(1.5)), init("exp", np.array([2, 1, 1, 1])),
             init("reps", np.array([1, 2, 1, 1]))]
    return model(nodes, [tensor("x", F32, [2, 3, 4, 3])], [tensor("y", F32, None)], inits), \
        {"x": _x(2, 3, 4, 3)}


def gather_embedding() -> tuple:
    nodes = [node("Gather", ["table", "ids"], ["e"]),
             node("Gather", ["e", "last"], ["y"], axis=1)]
    inits = [init("table", weights(10, 6)), init("last", np.array(-1))]
    return model(nodes, [tensor("ids", I64, [2, 5])], [tensor("y", F32, None)], inits), \
        {"ids": RNG.integers(0, 10, (2, 5)).astype(np.int64)}


def reductions() -> tuple:
    nodes = [node("ReduceMean", ["x", "a1"], ["m"], keepdims=1),
             node("ReduceSum", ["x", "a1"], ["s"], keepdims=0),
             node("ReduceMax", ["x"], ["mx"], keepdims=0),
             node("ReduceMin", ["x", "a2"], ["mn"]),
             node("ReduceProd", ["x", "a2"], ["pr"], keepdims=0),
             node("ReduceL2", ["x", "a1"], ["l2"], keepdims=1),
             node("ArgMax", ["x"], ["am"], axis=2, keepdims=0),
             node("ArgMin", ["x"], ["an"], axis=-1, select_last_index=1)]
    inits = [init("a1", np.array([1])), init("a2", np.array([0, -1]))]
    outs = [tensor(n, F32, None) for n in ("m", "s", "mx", "mn", "pr", "l2")]
    outs += [tensor("am", I64, None), tensor("an", I64, None)]
    return model(nodes, [tensor("x", F32, [2, 3, 4])], outs, inits, opset=18), \
        {"x": _x(2, 3, 4)}


def spatial_reductions() -> tuple:
    # PyTorch's dynamo exporter writes squeeze-excite and classifier pools as ReduceMean over
    # (H, W): imported as the global pool, after a conv whose output may be channels-last
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             node("ReduceMean", ["c", "hw"], ["se"], keepdims=1),
             node("Mul", ["c", "se"], ["y"]),
             node("ReduceMean", ["c", "hw2"], ["pooled"], keepdims=0),
             node("ReduceMax", ["c", "hw"], ["peak"], keepdims=1)]
    inits = [init("w", weights(6, 3, 3, 3)), init("hw", np.array([2, 3])),
             init("hw2", np.array([-1, -2]))]
    return model(nodes, [tensor("x", F32, [2, 3, 7, 5])],
                 [tensor(n, F32, None) for n in ("y", "pooled", "peak")], inits, opset=18), \
        {"x": _x(2, 3, 7, 5)}


def topk_cumsum_einsum() -> tuple:
    nodes = [node("TopK", ["x", "k"], ["v", "i"], axis=1),
             node("CumSum", ["v", "ax"], ["c"], reverse=1),
             node("Einsum", ["c", "w"], ["y"], equation="bk,kn->bn")]
    inits = [init("k", np.array([3])), init("ax", np.array(1)), init("w", weights(3, 2))]
    return model(nodes, [tensor("x", F32, [4, 6])],
                 [tensor("y", F32, None), tensor("i", I64, None)], inits), {"x": _x(4, 6)}


def attention_einsum() -> tuple:
    nodes = [node("Einsum", ["q", "k"], ["s"], equation="bhqd,bhkd->bhqk"),
             node("Softmax", ["s"], ["p"], axis=-1),
             node("Einsum", ["p", "k"], ["y"], equation="bhqk,bhkd->bqhd")]
    return model(nodes, [tensor("q", F32, [1, 2, 3, 4]), tensor("k", F32, [1, 2, 5, 4])],
                 [tensor("y", F32, None)]), {"q": _x(1, 2, 3, 4), "k": _x(1, 2, 5, 4)}


def gather_nd_onehot_hardmax() -> tuple:
    nodes = [node("GatherND", ["x", "idx"], ["g"], batch_dims=1),
             node("Hardmax", ["g"], ["h"]),
             node("OneHot", ["ids", "depth", "vals"], ["o"], axis=1),
             node("MatMul", ["h", "o"], ["y"])]
    inits = [init("idx", np.array([[[1], [-1]], [[0], [2]]])), init("depth", np.array(4)),
             init("vals", np.array([-1.0, 2.0], np.float32))]
    return model(nodes, [tensor("x", F32, [2, 3, 4]), tensor("ids", I64, [4])],
                 [tensor("y", F32, None)], inits), \
        {"x": _x(2, 3, 4), "ids": np.array([0, 3, -1, 5])}


def losses() -> tuple:
    nodes = [node("SoftmaxCrossEntropyLoss", ["s", "t", "w"], ["l1", "logp"], ignore_index=1),
             node("NegativeLogLikelihoodLoss", ["logp", "t"], ["l2"], reduction="sum"),
             node("RMSNormalization", ["s", "scale"], ["r"], axis=1),
             node("Swish", ["r"], ["y"], alpha=0.7)]
    inits = [init("w", np.abs(weights(5)) + 0.1), init("scale", weights(5, 3) + 1)]
    outs = [tensor(n, F32, None) for n in ("l1", "l2", "y")]
    return model(nodes, [tensor("s", F32, [2, 5, 3]), tensor("t", I64, [2, 3])], outs, inits,
                 opset=24), {"s": _x(2, 5, 3), "t": np.array([[0, 1, 4], [3, 1, 2]])}


def narrow_integers() -> tuple:
    nodes = [node("Add", ["a", "b"], ["s"]), node("Mul", ["s", "b"], ["m"]),
             node("Div", ["m", "c"], ["d"]), node("Max", ["d", "a"], ["y"])]
    return model(nodes, [tensor(n, onnx.TensorProto.INT8, [6]) for n in "abc"],
                 [tensor("y", onnx.TensorProto.INT8, None)]), \
        {"a": np.array([100, -100, 7, -7, 0, 127], np.int8),
         "b": np.array([100, -100, 3, 2, -1, 1], np.int8),
         "c": np.array([3, -3, 2, -2, 5, -1], np.int8)}


def pads_and_int64_division() -> tuple:
    nodes = [node("Pad", ["x", "p1"], ["a"], mode="reflect"),
             node("Pad", ["a", "p2"], ["e"], mode="edge"),
             node("Pad", ["e", "p1"], ["w"], mode="wrap"),
             node("Pad", ["w", "p2", "v"], ["y"]),
             node("Div", ["i", "j"], ["q"])]
    inits = [init("p1", np.array([0, 2, 1, 1])), init("p2", np.array([1, 0, 0, 3]))]
    return model(nodes, [tensor("x", F32, [3, 4]), tensor("v", F32, []),
                         tensor("i", I64, [6]), tensor("j", I64, [6])],
                 [tensor("y", F32, None), tensor("q", I64, None)], inits, opset=19), \
        {"x": _x(3, 4), "v": np.array(-7.5, np.float32),
         "i": np.array([7, -7, 7, -7, 6, -2**40]), "j": np.array([2, 2, -2, -2, 3, 3])}


def quantize_lppool_compress() -> tuple:
    nodes = [node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
             node("DequantizeLinear", ["q", "s", "z"], ["d"], axis=1),
             node("LpPool", ["d"], ["l"], kernel_shape=[2, 2], pads=[1, 0, 0, 1], p=3),
             node("Compress", ["l", "keep"], ["y"], axis=3)]
    inits = [init("s", np.array([0.05, 0.1, 0.02], np.float32)),
             init("z", np.array([3, 128, 250], np.uint8)),
             init("keep", np.array([True, False, True]))]
    return model(nodes, [tensor("x", F32, [1, 3, 4, 3])], [tensor("y", F32, None)], inits,
                 opset=21), {"x": _x(1, 3, 4, 3)}


def scatter_constant_indices() -> tuple:
    nodes = [node("ScatterElements", ["x", "ie", "u"], ["a"], axis=1),
             node("ScatterND", ["a", "ind", "u2"], ["b"]),
             node("ScatterND", ["b", "dup", "u2"], ["y"], reduction="add")]
    inits = [init("ie", np.array([[0, -1], [2, 3], [1, 0]])),
             init("ind", np.array([[2], [0], [-2]])), init("dup", np.array([[2], [0], [2]]))]
    return model(nodes, [tensor("x", F32, [3, 4]), tensor("u", F32, [3, 2]),
                         tensor("u2", F32, [3, 4])], [tensor("y", F32, None)], inits,
                 opset=18), {"x": _x(3, 4), "u": _x(3, 2), "u2": _x(3, 4)}


PATTERNS: dict[str, Callable[[], tuple]] = {
    f.__name__: f for f in (conv_bn_relu, depthwise_clip_same, conv_dilated_1d, conv_transpose,
                            gemm_variants, matmul_broadcast, norms, softmax_old_axis, pools,
                            efficientnet_pooler, resize_modes, elementwise_math, activations,
                            where_compare_cast, shape_ops, gather_embedding, reductions,
                            spatial_reductions, topk_cumsum_einsum,
                            attention_einsum, gather_nd_onehot_hardmax, losses,
                            narrow_integers, pads_and_int64_division,
                            quantize_lppool_compress, scatter_constant_indices)}


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_pattern_matches_onnxruntime(pattern: str, backend_name: str) -> None:
    m, feeds = PATTERNS[pattern]()
    assert_matches(m, feeds, backend_name)


def test_a_mean_or_max_over_height_and_width_is_a_global_pool() -> None:
    m, _ = spatial_reductions()
    graph_json, _, _ = from_onnx(m)
    funcs = [n["attrs"]["func_name"] for n in json.loads(graph_json)["nodes"] if n["op"] != "null"]
    assert sum("global_avg_pool2d" in f for f in funcs) == 2
    assert sum("global_max_pool2d" in f for f in funcs) == 1
    assert not any(f.endswith(("_mean", "_max")) for f in funcs)


def _pool_grid() -> list[tuple]:
    """Windows longer than the input, ceil_mode 0/1, pads, strides, count_include_pad 0/1."""
    cases = []
    for op in ("AveragePool", "MaxPool"):
        for k, s, pads, ceil in [(8, 1, [1, 2], 1), (8, 3, [1, 2], 0), (8, 3, [1, 2], 1),
                                 (10, 10, [0, 0], 1), (10, 3, [2, 0], 1), (13, 4, [3, 3], 1),
                                 (5, 3, [0, 0], 1), (9, 2, [0, 0], 0), (9, 10, [0, 0], 0)]:
            for cip in ((0, 1) if op == "AveragePool" else (0,)):
                cases.append((op, k, s, pads, ceil, cip))
    return cases


@pytest.mark.parametrize("op,k,s,pads,ceil,cip", _pool_grid())
def test_pool_windows_past_the_input_match_onnxruntime(op: str, k: int, s: int, pads: list,
                                                       ceil: int, cip: int,
                                                       backend_name: str) -> None:
    """Over a 7x6 image: where ONNX Runtime pools, the import matches it; where ONNX's formula
    floors to no window but ONNX Runtime truncates to one (ceil_mode=0), a refusal says so."""
    attrs = {"count_include_pad": cip} if op == "AveragePool" else {}
    m = model([node(op, ["x"], ["y"], kernel_shape=[k, k - 1], strides=[s, s],
                    pads=pads[:1] * 2 + pads[1:] * 2, ceil_mode=ceil, **attrs)],
              [tensor("x", F32, [1, 2, 7, 6])], [tensor("y", F32, None)], opset=19)
    feeds = {"x": _x(1, 2, 7, 6)}
    if ceil or k <= 7 + pads[0] + pads[1]:
        assert_matches(m, feeds, backend_name)
        return
    # ONNX Runtime gives no window (9 taps, stride 2) or one (stride 10)
    assert run_ort(m, feeds)[0].size == (0 if s == 2 else 2)
    with pytest.raises(FrontendError, match="ceil_mode=0 with a window spanning 9 on axis 2 but "
                                            "the padded input has only 7: ONNX's formula floors "
                                            "to no window"):
        from_onnx(m)


# -- the passes -----------------------------------------------------------------------------------

def _functions(m: Any, **kw: Any) -> tuple[list[str], dict]:
    result = import_onnx(m, **kw)
    return result.func_names, result.lib_doc["functions"]


def test_fusion_names_follow_tvm() -> None:
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             node("Relu", ["c1"], ["r1"]),
             node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2, 2]),
             node("Relu", ["c2"], ["r2"]),
             node("Flatten", ["r2"], ["f"]), node("Gemm", ["f", "fw", "fb"], ["g"], transB=1),
             node("Softmax", ["g"], ["y"])]
    inits = [init("w1", weights(4, 3, 3, 3)), init("b1", weights(4)),
             init("w2", weights(4, 4, 3, 3)), init("b2", weights(4)),
             init("fw", weights(5, 16)), init("fb", weights(5))]
    m = model(nodes, [tensor("x", F32, [1, 3, 5, 5])], [tensor("y", F32, None)], inits)
    names, functions = _functions(m)
    assert names == ["tvmgen_default_fused_nn_conv2d_add_nn_relu",
                     "tvmgen_default_fused_nn_conv2d_add_nn_relu_1",
                     "tvmgen_default_fused_reshape", "tvmgen_default_fused_nn_dense_add",
                     "tvmgen_default_fused_nn_softmax"]
    assert [s["op"] for s in functions[names[0]]["ops"]] == ["conv2d", "add", "relu"]
    assert functions[names[1]]["ops"][0]["strides"] == [2, 2]


def test_no_fusion_across_a_value_with_two_readers() -> None:
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Relu", ["h"], ["a"]),
             node("Sigmoid", ["h"], ["b"]), node("Add", ["a", "b"], ["y"])]
    m = model(nodes, [tensor("x", F32, [2, 4])], [tensor("y", F32, None)],
              [init("w", weights(4, 3))])
    names, _ = _functions(m)
    assert names[0] == "tvmgen_default_fused_nn_dense"
    assert len(names) == 3  # dense; sigmoid; relu + add (h has two readers: no chain takes it)


def test_pytorch_shape_chain_is_folded() -> None:
    nodes = [node("Shape", ["x"], ["s"]),
             node("Gather", ["s", "i0"], ["d0"], axis=0),
             node("Unsqueeze", ["d0", "ax"], ["u0"]),
             node("Concat", ["u0", "minus1"], ["shape"], axis=0),
             node("Reshape", ["x", "shape"], ["r"]),
             node("Relu", ["r"], ["y"])]
    inits = [init("i0", np.array(0)), init("ax", np.array([0])), init("minus1", np.array([-1]))]
    m = model(nodes, [tensor("x", F32, [2, 3, 4])], [tensor("y", F32, None)], inits)
    result = import_onnx(m)
    assert {"Shape", "Gather", "Unsqueeze", "Concat"} <= set(result.folded)
    ops = [s["op"] for f in result.lib_doc["functions"].values() for s in f.get("ops", [f])]
    assert ops == ["reshape", "relu"]
    assert result.params == {}
    x = _x(2, 3, 4)
    np.testing.assert_array_equal(run_ours(m, {"x": x}, "cpu")[0], np.maximum(x, 0).reshape(2, 12))


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_gather_elements_of_constants_is_folded(axis: int) -> None:
    """BERT's token-type ids: GatherElements of a (1, 512) buffer by constant (1, 32) indices
    (the onnx reference evaluator failed on it, leaving a runtime node); negative indices count
    from the end; the result matches ONNX Runtime."""
    data = np.arange(2 * 512, dtype=np.int64).reshape(2, 512)
    idx = np.random.default_rng(3).integers(-2 if axis == 0 else -512, 2 if axis == 0 else 512,
                                            (1, 32)).astype(np.int64)
    nodes = [node("GatherElements", ["data", "idx"], ["g"], axis=axis),
             node("Cast", ["g"], ["gf"], to=F32),
             node("Add", ["x", "gf"], ["y"])]
    m = model(nodes, [tensor("x", F32, [1, 32])], [tensor("y", F32, None)],
              [init("data", data), init("idx", idx)])
    result = import_onnx(m)
    assert result.folded["GatherElements"] == 1
    x = _x(1, 32)
    assert_matches(m, {"x": x}, "cpu")


def test_folding_floating_point_edges_is_quiet() -> None:
    """T5's relative-position buckets: Log of a constant holding 0 (-inf), cast to int64 and
    dropped by a Where, folded at import without NumPy's warnings, and the graph still right."""
    import warnings
    pos = np.array([0.0, 1.0, 8.0, 40.0], np.float32)
    nodes = [node("Log", ["pos"], ["lg"]),
             node("Cast", ["lg"], ["li"], to=I64),
             node("Greater", ["pos", "zero"], ["big"]),
             node("Where", ["big", "li", "minus"], ["w"]),
             node("Cast", ["w"], ["wf"], to=F32),
             node("Add", ["x", "wf"], ["y"])]
    m = model(nodes, [tensor("x", F32, [4])], [tensor("y", F32, None)],
              [init("pos", pos), init("zero", np.array(0.0, np.float32)),
               init("minus", np.array(-1, np.int64))])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = import_onnx(m)
    assert result.folded["Log"] == 1
    np.testing.assert_array_equal(run_ours(m, {"x": np.zeros(4, np.float32)}, "cpu")[0],
                                  np.array([-1, 0, 2, 3], np.float32))


def test_batch_norm_folds_into_conv() -> None:
    m, _ = conv_bn_relu()
    result = import_onnx(m)
    assert result.bn_folded == 1
    assert list(result.lib_doc["functions"]) == ["tvmgen_default_fused_nn_conv2d_add_nn_relu"]
    assert len(result.params) == 2  # the scaled weight and the shifted bias


@pytest.mark.parametrize("pads, value, absorbed", [
    ([0, 0, 0, 1, 0, 0, 1, 2], 0.0, True),   # TensorFlow 'same' before a stride-2 conv
    ([0, 0, 2, 1, 0, 0, 0, 3], 0.0, True),
    ([0, 1, 0, 0, 0, 0, 0, 0], 0.0, False),  # channels padded: not a conv pad
    ([0, 0, 1, 1, 0, 0, 1, 1], 0.5, False),  # a nonzero border
])
def test_a_zero_pad_before_a_conv_becomes_its_padding(pads, value, absorbed) -> None:
    nodes = [node("Pad", ["x", "pads", "value"], ["p"], mode="constant"),
             node("Conv", ["p", "w", "b"], ["y"], strides=[2, 2], pads=[1, 0, 0, 1])]
    inits = [init("pads", np.array(pads, np.int64)), init("value", np.array(value, np.float32)),
             init("w", weights(4, 3 + pads[1], 3, 3)), init("b", weights(4))]
    m = model(nodes, [tensor("x", F32, [1, 3, 9, 8])], [tensor("y", F32, None)], inits)
    ops = {s["op"] for f in import_onnx(m).lib_doc["functions"].values()
           for s in f.get("ops", [f])}
    assert ("pad" not in ops) == absorbed
    assert_matches(m, {"x": _x(1, 3, 9, 8)}, "cpu")


def test_batch_norm_alone_becomes_multiply_add() -> None:
    nodes = [node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"])]
    inits = [init(n, np.abs(weights(3)) + 0.5) for n in ("g", "b", "m", "v")]
    m = model(nodes, [tensor("x", F32, [2, 3, 4])], [tensor("y", F32, None)], inits)
    names, _ = _functions(m)
    assert names == ["tvmgen_default_fused_multiply_add"]
    assert_matches(m, {"x": _x(2, 3, 4)}, "cpu")


def test_function_ops_are_inlined_from_their_schema() -> None:
    q = _x(1, 2, 3, 4)
    nodes = [node("Attention", ["q", "k", "v"], ["y"], is_causal=1)]
    m = model(nodes, [tensor(n, F32, [1, 2, 3, 4]) for n in "qkv"], [tensor("y", F32, None)],
              opset=23)
    result = import_onnx(m)
    ops = {s["op"] for f in result.lib_doc["functions"].values() for s in f.get("ops", [f])}
    assert {"batch_matmul", "softmax"} <= ops
    feeds = {"q": q, "k": _x(1, 2, 3, 4), "v": _x(1, 2, 3, 4)}
    assert_matches(m, feeds, "cpu")


def test_if_with_a_constant_condition_takes_its_branch() -> None:
    then = helper.make_graph([node("Relu", ["x"], ["t"])], "then", [], [tensor("t", F32, [3])])
    other = helper.make_graph([node("Neg", ["x"], ["e"])], "else", [], [tensor("e", F32, [3])])
    nodes = [node("Shape", ["x"], ["s"]), node("ReduceSum", ["s"], ["n"], keepdims=0),
             node("Greater", ["n", "two"], ["c"]),
             node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    m = model(nodes, [tensor("x", F32, [3])], [tensor("y", F32, None)],
              [init("two", np.array(2))])
    result = import_onnx(m)
    assert result.folded["If"] == 1 and result.func_names == ["tvmgen_default_fused_nn_relu"]
    assert_matches(m, {"x": _x(3)}, "cpu")


def test_infinite_pad_value_goes_through_a_param() -> None:
    nodes = [node("Pad", ["x", "pads", "ninf"], ["p"]),
             node("MaxPool", ["p"], ["y"], kernel_shape=[2, 2])]
    inits = [init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1])),
             init("ninf", np.array(-np.inf, np.float32))]
    m = model(nodes, [tensor("x", F32, [1, 1, 3, 3])], [tensor("y", F32, None)], inits)
    result = import_onnx(m)
    assert "-Infinity" not in json.dumps(result.lib_doc)
    assert_matches(m, {"x": _x(1, 1, 3, 3)}, "cpu")


def test_dropout_and_identity_are_removed() -> None:
    nodes = [node("Dropout", ["x"], ["d"]), node("Identity", ["d"], ["i"]),
             node("Relu", ["i"], ["y"])]
    m = model(nodes, [tensor("x", F32, [4])], [tensor("y", F32, None)])
    result = import_onnx(m)
    assert result.removed == {"Dropout": 1, "Identity": 1}
    assert result.func_names == ["tvmgen_default_fused_nn_relu"]


# -- refusals -------------------------------------------------------------------------------------

def _unsupported_model() -> Any:
    nodes = [node("Relu", ["x"], ["r"], name="ok"),
             node("Det", ["r"], ["h"], name="det_1"),
             node("Unsqueeze", ["h", "axes"], ["h2"]),
             node("Det", ["x"], ["d"], name="det_2"),
             node("MaxPool", ["x4"], ["p"], kernel_shape=[2, 2], storage_order=1,
                  name="pool_so"),
             node("Add", ["d", "s"], ["y"], name="sum")]
    inits = [init("s", np.float32(1)), init("axes", np.array([0], np.int64))]
    return model(nodes, [tensor("x", F32, [3, 3]), tensor("x4", F32, [1, 1, 4, 4])],
                 [tensor("y", F32, None), tensor("p", F32, None), tensor("h2", F32, None)],
                 inits, opset=17)


def test_refusal_lists_every_unsupported_op_with_nodes_and_opset() -> None:
    with pytest.raises(FrontendError) as info:
        from_onnx(_unsupported_model())
    message = str(info.value)
    assert "opset 17" in message
    assert "op type Det is not supported (nodes 'det_1', 'det_2')" in message
    assert "MaxPool: storage_order=1 (node 'pool_so')" in message
    assert "'sum'" not in message and "'ok'" not in message


def test_symbolic_dims_need_a_shape_when_frozen() -> None:
    nodes = [node("MatMul", ["x", "w"], ["y"])]
    m = model(nodes, [tensor("x", F32, ["batch", 4])], [tensor("y", F32, None)],
              [init("w", weights(4, 2))])
    with pytest.raises(FrontendError, match=r"input 'x' has symbolic dims \(batch, 4\).*"
                                            r"--shape x=N,4"):
        from_onnx(m, freeze=True)
    assert_matches(m, {"x": _x(3, 4)}, "cpu", shape={"x": [3, 4]})
    with pytest.raises(FrontendError, match="dim 1 is fixed at 4"):
        from_onnx(m, {"x": [3, 5]})


# -- outputs, dtypes, files -----------------------------------------------------------------------

def test_int64_and_passthrough_outputs_keep_onnx_order_and_dtypes(backend_name: str) -> None:
    nodes = [node("ArgMax", ["x"], ["am"], axis=1),
             node("Identity", ["x"], ["same"]),
             node("Constant", [], ["c"], value=helper.make_tensor("v", I64, [2], [4, 5])),
             node("Relu", ["x"], ["r"])]
    m = model(nodes, [tensor("x", F32, [2, 3])],
              [tensor("r", F32, None), tensor("am", I64, None), tensor("same", F32, None),
               tensor("c", I64, None), tensor("r", F32, None)])
    assert_matches(m, {"x": _x(2, 3)}, backend_name)


def test_external_data_model(tmp_path: Any) -> None:
    m, feeds = conv_bn_relu()
    path = tmp_path / "model.onnx"
    saved = onnx.ModelProto()
    saved.CopyFrom(m)  # save_model moves the tensors of the proto it is given out of it
    onnx.save_model(saved, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.data", size_threshold=0)
    assert (tmp_path / "model.data").is_file()
    got = run_ours(path, feeds, "cpu")  # type: ignore[arg-type]
    np.testing.assert_allclose(got[0], run_ort(m, feeds)[0], rtol=1e-4, atol=1e-5)


def test_lib_json_is_what_runs() -> None:
    m, _ = conv_bn_relu()
    result = import_onnx(m)
    doc = json.loads(json.dumps(result.lib_doc))
    assert doc["format"] == "graph_runtime.lib"
    assert sorted(result.module().function_names()) == sorted(doc["functions"])


def test_importing_graph_runtime_does_not_import_onnx() -> None:
    code = ("import sys, graph_runtime, graph_runtime.frontend, graph_runtime.cli; "
            "print('onnx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_missing_onnx_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(FrontendError, match=r"pip install graph_runtime\[onnx\]"):
        from_onnx("model.onnx")


def test_an_op_type_has_one_converter() -> None:
    # Which of two converters won used to follow import order (MatMulInteger, Scatter*): a
    # second registration is refused, naming both.
    from graph_runtime.frontend.convert import CONVERTERS, converts
    before = CONVERTERS["Relu"]

    def another(ctx: Any, node: Any, args: list) -> list:
        return []
    with pytest.raises(FrontendError, match=r"Relu has two converters: .*\.another"):
        converts("Relu")(another)
    assert CONVERTERS["Relu"] is before
    assert converts("Relu")(before) is before  # the same function again is harmless


# What symbolic import keeps folded, deferred import freezes, folding runs fast and sizes first:
# per-op facts registered beside the converters (frontend/convert.py's OpFacts), each once.
SHAPE_INPUTS = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 3),
    "Resize": (1, 2, 3), "Upsample": (1,), "Unsqueeze": (1,), "Squeeze": (1,), "Split": (1,),
    "ConstantOfShape": (0,), "Range": (0, 1, 2), "OneHot": (1,), "TopK": (1,), "CumSum": (1,),
    "Trilu": (1,), "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,), "Dropout": (1, 2),
}
VALUE_INPUTS = {
    **SHAPE_INPUTS, "Pad": (1, 2, 3), "OneHot": (1, 2), "Clip": (1, 2), "CenterCropPad": (1,),
    "BlackmanWindow": (0,), "HammingWindow": (0,), "HannWindow": (0,), "Loop": (0, 1),
    "If": (0,),
}
FOLDED_FAST = {"Shape", "Gather", "GatherElements", "Concat", "Cast", "Identity", "Tile",
               "Expand", "DequantizeLinear", "QuantizeLinear"}
PREDICTED = {"ConstantOfShape", "Range", "Tile", "Expand", "OneHot", "Pad", "Resize",
             "Upsample", "Gather", "MatMul", "DequantizeLinear", "QuantizeLinear", "HannWindow",
             "HammingWindow", "BlackmanWindow", "DFT", "STFT", "MelWeightMatrix", "AffineGrid",
             "MaxUnpool"}
WORKSPACES = {"Resize", "Upsample", "HannWindow", "HammingWindow", "BlackmanWindow", "DFT",
              "STFT", "MelWeightMatrix", "AffineGrid"}


def test_per_op_facts_are_registered_once_beside_the_converters() -> None:
    from graph_runtime.frontend.convert import CONVERTERS, FACTS, add_facts, converts
    from graph_runtime.frontend.symbolic_import import shape_slots
    assert shape_slots() == SHAPE_INPUTS
    assert {op: set(f.shape_inputs) | set(f.value_inputs) for op, f in FACTS.items()
            if f.shape_inputs or f.value_inputs} == {k: set(v) for k, v in VALUE_INPUTS.items()}
    assert {op for op, f in FACTS.items() if f.fold is not None} == FOLDED_FAST
    assert {op for op, f in FACTS.items() if f.predict is not None} == PREDICTED
    assert {op for op, f in FACTS.items() if f.workspace is not None} == WORKSPACES
    before = FACTS["Reshape"]
    with pytest.raises(FrontendError, match=r"Reshape has its facts registered twice"):
        add_facts("Reshape", shape_inputs=(2,))
    with pytest.raises(FrontendError, match=r"Reshape has its facts registered twice"):
        converts("Reshape", shape_inputs=(1, 2))(CONVERTERS["Reshape"])
    assert FACTS["Reshape"] is before
    add_facts("Reshape", shape_inputs=(1,))  # the same facts again are harmless
