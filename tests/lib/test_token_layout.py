"""Tokens <-> image pairs (transpose + reshape) run as one copy, NHWC beside oneDNN convs."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.device import cpu
from graph_runtime.lib.kernels.cpu.token_layout import TokenLayoutCopy, token_layout
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.loader import function_from_json

TO_IMAGE = {"ops": [{"op": "transpose", "axes": [0, 2, 1]},
                    {"op": "reshape", "newshape": [2, 5, 3, 4]}]}
TO_TOKENS = {"ops": [{"op": "reshape", "newshape": [2, 5, 12]},
                     {"op": "transpose", "axes": [0, 2, 1]}]}


def _prepared(func, shape):
    chain = function_from_json("pair", func, "test")
    spec = [TensorSpec(shape, "float32")]
    return chain.prepare(cpu(), spec, chain.infer(spec), {})


@pytest.mark.parametrize("ops, axes, shapes, want", [
    (["transpose", "reshape"], [0, 2, 1], [(2, 12, 5), (2, 5, 12), (2, 5, 3, 4)], "to_image"),
    (["transpose", "reshape"], [0, -1, 1], [(2, 12, 5), (2, 5, 12), (2, 5, 3, 4)], "to_image"),
    (["reshape", "transpose"], [0, 2, 1], [(2, 5, 3, 4), (2, 5, 12), (2, 12, 5)], "to_tokens"),
    (["transpose", "reshape"], [1, 0, 2], [(2, 12, 5), (12, 2, 5), (12, 2, 5, 1)], None),
    (["transpose", "reshape"], [0, 2, 1], [(2, 12, 5), (2, 5, 12), (2, 5, 2, 6, 1)], None),
    (["transpose", "reshape"], [0, 2, 1], [(2, 12, 5), (2, 5, 12), (5, 2, 3, 4)], None),
    (["reshape", "transpose"], [0, 2, 1], [(2, 5, 3, 4), (2, 15, 4), (2, 4, 15)], None),
])
def test_pairs_are_recognised_exactly(ops, axes, shapes, want) -> None:
    assert token_layout(ops, axes, shapes) == want


@pytest.mark.parametrize("func, shape, reference", [
    (TO_IMAGE, (2, 12, 5), lambda x: x.transpose(0, 2, 1).reshape(2, 5, 3, 4)),
    (TO_TOKENS, (2, 5, 3, 4), lambda x: x.reshape(2, 5, 12).transpose(0, 2, 1)),
    ({"ops": TO_TOKENS["ops"] + [{"op": "gelu"}]}, (2, 5, 3, 4), None),
])
def test_a_pair_is_one_copy_and_gives_the_ops_result(func, shape, reference, run_op,
                                                     random_array) -> None:
    x = random_array(shape, "float32", seed=1)
    x.flat[3] = np.nan
    x.flat[7] = np.inf
    (got,) = run_op("cpu", func, [x])
    if reference is None:  # the tail after the pair: compare with the ops one at a time
        plain = [{"ops": [step]} for step in func["ops"]]
        want = x
        for step in plain:
            (want,) = run_op("cpu", step, [want])
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_array_equal(got, reference(x))
    kernel = _prepared(func, shape)
    inner = [fn for fn, _ in kernel._steps] if hasattr(kernel, "_steps") else [kernel]
    assert isinstance(inner[0], TokenLayoutCopy)


@pytest.mark.parametrize("direction", ["to_image", "to_tokens"])
def test_the_image_side_may_be_channels_last(direction, random_array) -> None:
    """Given NHWC bytes (the strided NCHW view) on its image side, the copy is the same."""
    image = (2, 5, 3, 4)
    kernel = TokenLayoutCopy(direction, image)
    assert kernel.channels_last_positions() == ((1,) if direction == "to_image" else (0,))
    tokens = random_array((2, 12, 5), "float32", seed=2)
    nchw = tokens.reshape(2, 3, 4, 5).transpose(0, 3, 1, 2)
    nhwc_buffer = np.empty(2 * 5 * 3 * 4, np.float32)
    nhwc = nhwc_buffer.reshape(2, 3, 4, 5).transpose(0, 3, 1, 2)
    if direction == "to_image":
        kernel(tokens, nhwc)
        np.testing.assert_array_equal(nhwc, nchw)
        np.testing.assert_array_equal(nhwc_buffer, tokens.reshape(-1))  # the same bytes
    else:
        nhwc[...] = nchw
        out = np.empty((2, 12, 5), np.float32)
        kernel(nhwc, out)
        np.testing.assert_array_equal(out, tokens)


def test_tokens_between_onednn_convs_stay_channels_last(monkeypatch, random_array) -> None:
    """conv -> image to tokens (+gelu) -> tokens to image -> conv, as SegFormer's Mix-FFN: the
    images stay NHWC (the pairs copy in memory order) and the result is the float64 one."""
    from graph_runtime.lib.chain import Chain, Step
    from test_conv import ref_conv2d_attrs
    funcs = {"to_tokens": Chain("to_tokens", [Step("reshape", {"newshape": [2, 6, 20]}),
                                              Step("transpose", {"axes": [0, 2, 1]}),
                                              Step("relu")]),
             "to_image": Chain("to_image", [Step("transpose", {"axes": [0, 2, 1]}),
                                            Step("reshape", {"newshape": [2, 6, 4, 5]})])}
    m, a = _between_convs(monkeypatch, random_array, funcs,
                          [("t", "to_tokens", [2]), ("i", "to_image", [3])],
                          [[2, 20, 6], [2, 6, 4, 5]])
    y = np.maximum(ref_conv2d_attrs(a["x"], a["w1"], {"padding": [1]}), 0)
    want = ref_conv2d_attrs(y, a["w2"], {"padding": [1]})
    np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=2e-5,
                               atol=2e-5 * float(np.abs(want).max()))
    g = m.executor.graph
    kept = {g.nodes[nid].name for nid in range(len(g.nodes))
            if g.entry_id(nid, 0) in m.executor.channels_last}
    assert kept == {"c1", "i"}


@pytest.mark.parametrize("axes, image_position", [((0, 2, 3, 1), 0), ((0, 3, 1, 2), 1),
                                                   ((0, -1, 1, 2), 1)])
def test_a_channel_permute_reads_or_writes_channels_last(axes, image_position, run_op,
                                                         random_array) -> None:
    """transpose(0,2,3,1) / (0,3,1,2), as ConvNeXt wraps its LayerNorm: one copy, the image
    side channels-last capable, the same values from NHWC bytes."""
    from graph_runtime.lib.kernels.cpu.token_layout import PermuteCopy
    shape = (2, 5, 3, 4) if image_position == 0 else (2, 3, 4, 5)
    x = random_array(shape, "float32", seed=3)
    func = {"ops": [{"op": "transpose", "axes": list(axes)}]}
    (got,) = run_op("cpu", func, [x])
    np.testing.assert_array_equal(got, x.transpose(axes))
    kernel = _prepared(func, shape)
    assert isinstance(kernel, PermuteCopy)
    assert kernel.channels_last_positions() == (image_position,)
    image = x if image_position == 0 else x.transpose(axes)
    nhwc = np.ascontiguousarray(image.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    if image_position == 0:
        out = np.empty(got.shape, np.float32)
        kernel(nhwc, out)
        np.testing.assert_array_equal(out, got)
    else:
        out = np.empty(image.size, np.float32).reshape(2, 3, 4, 5).transpose(0, 3, 1, 2)
        kernel(x, out)
        np.testing.assert_array_equal(out, image)


def _nhwc(image: np.ndarray) -> np.ndarray:
    """image's values as the strided NCHW view of NHWC bytes (what runtime/layouts.py binds)."""
    return np.ascontiguousarray(image.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


@pytest.mark.parametrize("axes, op, other_shape", [
    ((0, 3, 1, 2), "add", (2, 3, 4, 5)), ((0, 3, 1, 2), "subtract", (2, 3, 4, 5)),
    ((0, 3, 1, 2), "maximum", (1, 3, 1, 1)), ((0, 2, 3, 1), "multiply", (2, 4, 5, 3)),
    ((0, 2, 3, 1), "divide", (5, 3))])
def test_a_permute_and_one_binary_op_are_one_pass_in_either_layout(axes, op, other_shape,
                                                                  run_op, random_array) -> None:
    """transpose then a binary op taking its result first (ConvNeXt's permute back and residual
    add): one kernel with no intermediate, the same values as the ops one at a time, and the
    same again with NHWC bytes at each position it offers."""
    from graph_runtime.lib.kernels.cpu.token_layout import PermutedBinary
    source_shape = (2, 4, 5, 3) if axes == (0, 3, 1, 2) else (2, 3, 4, 5)
    x = random_array(source_shape, "float32", seed=4)
    other = random_array(other_shape, "float32", seed=5) + 2.0
    func = {"ops": [{"op": "transpose", "axes": list(axes)}, {"op": op}]}
    (got,) = run_op("cpu", func, [x, other])
    want = getattr(np, op)(x.transpose(axes), other)
    np.testing.assert_array_equal(got, want)
    chain = function_from_json("pair", func, "test")
    specs = [TensorSpec(source_shape, "float32"), TensorSpec(other_shape, "float32")]
    kernel = chain.prepare(cpu(), specs, chain.infer(specs), {})
    assert isinstance(kernel, PermutedBinary) and kernel.workspace_bytes() == 0
    offered = kernel.channels_last_positions()
    assert offered == {(0, 3, 1, 2): (1, 2) if other_shape == got.shape else (2,),
                       (0, 2, 3, 1): (0,)}[axes]
    arrays = [x, other, np.empty(got.shape, np.float32)]
    for pos in offered:
        arrays[pos] = _nhwc(arrays[pos])
    kernel(*arrays)
    np.testing.assert_array_equal(arrays[2], want)


def test_permute_op_permute_back_runs_in_token_order(run_op, random_array) -> None:
    """transpose to the image, subtract an image, transpose back, then more ops (ConvNeXt's
    last residual add of a stage before a LayerNorm): one pass on the tokens, the image
    NHWC-capable, the same values as the ops one at a time."""
    from graph_runtime.lib.kernels.cpu.token_layout import PermutedBinary
    func = {"ops": [{"op": "transpose", "axes": [0, 3, 1, 2]}, {"op": "subtract"},
                    {"op": "transpose", "axes": [0, 2, 3, 1]}, {"op": "softmax", "axis": -1}]}
    tokens = random_array((2, 4, 5, 3), "float32", seed=6)
    image = random_array((2, 3, 4, 5), "float32", seed=7)
    (got,) = run_op("cpu", func, [tokens, image])
    z = tokens - image.transpose(0, 2, 3, 1)
    e = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-6)
    chain = function_from_json("back", func, "test")
    specs = [TensorSpec((2, 4, 5, 3), "float32"), TensorSpec((2, 3, 4, 5), "float32")]
    kernel = chain.prepare(cpu(), specs, chain.infer(specs), {})
    assert isinstance(kernel._steps[0][0], PermutedBinary)
    assert kernel.channels_last_positions() == (1,)
    kernel.use_channels_last({1})
    out = np.empty(got.shape, np.float32)
    kernel(tokens, _nhwc(image), out)
    np.testing.assert_array_equal(out, got)


@pytest.mark.parametrize("func, shape", [
    ({"ops": [{"op": "transpose", "axes": [0, 2, 3, 1]}, {"op": "softmax", "axis": -1}]},
     (2, 5, 3, 4)),
    ({"ops": [{"op": "reshape", "newshape": [2, 5, 12]}, {"op": "transpose", "axes": [0, 2, 1]},
              {"op": "softmax", "axis": -1}]}, (2, 5, 3, 4))])
def test_a_leading_copy_of_nhwc_bytes_becomes_a_view(func, shape, run_op, random_array) -> None:
    """A chain starting with a copy to channels last (a permute, or image to tokens) told its
    image is NHWC reads the result as a view of those bytes: the copy and its buffer go, the
    values stay."""
    x = random_array(shape, "float32", seed=8)
    (want,) = run_op("cpu", func, [x])
    chain = function_from_json("lead", func, "test")
    specs = [TensorSpec(shape, "float32")]
    kernel = chain.prepare(cpu(), specs, chain.infer(specs), {})
    before = kernel.workspace_bytes()
    assert kernel.channels_last_positions() == (0,) and len(kernel._steps) == 2
    kernel.use_channels_last({0})
    assert len(kernel._steps) == 1 and kernel.workspace_bytes() == before - x.nbytes
    out = np.empty(want.shape, np.float32)
    kernel(_nhwc(x), out)
    np.testing.assert_array_equal(out, want)


def test_a_convnext_block_keeps_its_images_channels_last(monkeypatch, random_array) -> None:
    """conv -> permute to channels last + softmax (its LayerNorm's stand-in) -> permute back +
    the residual add -> conv, as a ConvNeXt block: every image between the convs stays NHWC
    (the residual too), the permute before the softmax reads the conv's bytes in place, and the
    result is the float64 one."""
    from graph_runtime.lib.chain import Chain, Step
    from test_conv import ref_conv2d_attrs
    funcs = {"mix": Chain("mix", [Step("transpose", {"axes": [0, 2, 3, 1]}),
                                  Step("softmax", {"axis": -1})]),
             "back": Chain("back", [Step("transpose", {"axes": [0, 3, 1, 2]}), Step("add")])}
    m, a = _between_convs(monkeypatch, random_array, funcs,
                          [("m", "mix", [2]), ("b", "back", [3, 2])],
                          [[2, 4, 5, 6], [2, 6, 4, 5]])
    y = ref_conv2d_attrs(a["x"], a["w1"], {"padding": [1]})
    z = y.transpose(0, 2, 3, 1)
    e = np.exp(z - z.max(-1, keepdims=True))
    mixed = (e / e.sum(-1, keepdims=True)).transpose(0, 3, 1, 2) + y
    want = ref_conv2d_attrs(mixed, a["w2"], {"padding": [1]})
    np.testing.assert_allclose(m.get_output(0).numpy(), want, rtol=2e-5,
                               atol=2e-5 * float(np.abs(want).max()))
    ex = m.executor
    g = ex.graph
    kept = {g.nodes[nid].name for nid in range(len(g.nodes))
            if g.entry_id(nid, 0) in ex.channels_last}
    assert kept == {"c1", "b"}
    mix = next(s.kernel for s in ex.steps if g.nodes[s.nid].name == "m")
    assert len(mix._steps) == 1  # the permute is a view of c1's NHWC bytes


def _between_convs(monkeypatch, random_array, funcs, middle, middle_shapes):
    """x -> conv (oneDNN) -> the middle nodes -> conv, run: (module, its inputs in float64).
    funcs: the middle's lib functions {name: Chain}; middle: (name, func, inputs) with c1 at
    node 2, the last middle node the second conv's data."""
    import graph_runtime as gr
    from graph_runtime.lib import Module
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.lib.kernels.onednn import binding
    from support import make_graph, null, require_onednn, tvm_op
    require_onednn()
    monkeypatch.setenv(binding.ONEDNN_ENV, "on")
    lib = Module("between")
    lib.register("conv", Chain("conv", [Step("conv2d", {"padding": [1]})]))
    for name, chain in funcs.items():
        lib.register(name, chain)
    last = 2 + len(middle)
    nodes = [null("x"), null("w1"), tvm_op("c1", "conv", [0, 1])] + [
        tvm_op(name, func, inputs) for name, func, inputs in middle] + [
        null("w2"), tvm_op("c2", "conv", [last, last + 1])]
    shapes = [[2, 3, 4, 5], [6, 3, 3, 3], [2, 6, 4, 5], *middle_shapes, [6, 6, 3, 3],
              [2, 6, 4, 5]]
    m = gr.create(make_graph(nodes, [last + 2], shapes=shapes), lib, gr.cpu())
    arrays = {name: random_array(tuple(shapes[i]), "float32", seed=i)
              for i, name in [(0, "x"), (1, "w1"), (last + 1, "w2")]}
    m.set_input(**arrays)
    m.run()
    return m, {k: v.astype(np.float64) for k, v in arrays.items()}
