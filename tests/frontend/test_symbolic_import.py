"""Import without --shape: symbolic dims kept, shape chains fitted into attrs, one graph for all."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import graph_runtime as gr  # noqa: E402
from graph_runtime.errors import FrontendError  # noqa: E402
from graph_runtime.frontend import from_onnx  # noqa: E402
from graph_runtime.frontend.symbolic_import import _expression  # noqa: E402

RNG = np.random.default_rng(0)


def reshape_model() -> onnx.ModelProto:
    """x (batch, seq, 8) -> MatMul -> Relu -> Reshape to (batch, -1) through Shape/Gather/Concat."""
    w = RNG.standard_normal((8, 16)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Concat", ["b", "m1"], ["ns"], axis=0),
             helper.make_node("Reshape", ["r", "ns"], ["flat"]),
             helper.make_node("Softmax", ["flat"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([0], np.int64), "i0"),
         numpy_helper.from_array(np.array([-1], np.int64), "m1")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_expressions_fit_the_probes() -> None:
    names, base, other = ["b", "s"], [37, 41], [53, 59]
    assert _expression(37 * 41 * 4, [53 * 41 * 4, 37 * 59 * 4], names, base, other) == "4*b*s"
    assert _expression(42, [42, 60], names, base, other) == "s+1"
    assert _expression(41 * 41, [41 * 41, 59 * 59], names, base, other) == "s*s"
    assert _expression(5, [6, 7], names, base, other) is None


def test_one_import_runs_every_shape_like_onnxruntime() -> None:
    model = reshape_model()
    graph_json, lib, params = from_onnx(model)
    shapes = json.loads(graph_json)["attrs"]["shape"][1]
    assert shapes[0] == ["batch", "seq", 8] and shapes[-1] == ["batch", "16*seq"]
    module = gr.create(graph_json, lib)
    module.load_params(params)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, seq in [(1, 3), (2, 5), (4, 1)]:
        x = RNG.standard_normal((batch, seq, 8)).astype(np.float32)
        module.run(x=x)
        np.testing.assert_allclose(module.get_output(0).numpy(),
                                   session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert module.specializations == 3


def test_symbolic_module_outputs_answer_to_the_models_names() -> None:
    """The fitted graph keeps the ONNX output name; every specialisation answers to it."""
    graph_json, lib, params = from_onnx(reshape_model())
    assert json.loads(graph_json)["metadata"] == {"output_names": ["y"]}
    module = gr.create(graph_json, lib)
    module.load_params(params)
    assert module.get_output_index("y") == 0
    for batch in (1, 3):
        x = RNG.standard_normal((batch, 2, 8)).astype(np.float32)
        module.run(x=x)
        np.testing.assert_array_equal(module.get_output("y").numpy(),
                                      module.get_output(0).numpy())


def test_constant_depending_on_dims_is_refused_with_the_fix() -> None:
    # Trilu's converter builds its (n, n) mask at import: no ONNX node to compute instead.
    nodes = [helper.make_node("Trilu", ["x"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FrontendError, match=r"symbolic dims \(n\): a constant made at import "
                                            r"depends on the dims at params\..*--shape"):
        from_onnx(model)
    assert from_onnx(model, shape={"x": [3, 3]})[2]


def positions_model() -> onnx.ModelProto:
    """y = x + Range(0, seq) + seq + ConstantOfShape([seq]): folded values that follow the dims,
    read as data (as BERT's position ids and GPT-2's causal mask are)."""
    one = numpy_helper.from_array(np.array([1.0], np.float32))
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i1"], ["seq"], axis=0),
             helper.make_node("Range", ["zero", "seq", "step"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["seq"], ["seqf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["seq", "i0"], ["seq1"]),
             helper.make_node("ConstantOfShape", ["seq1"], ["ones"], value=one),
             helper.make_node("Add", ["x", "rf"], ["a"]),
             helper.make_node("Add", ["a", "seqf"], ["b"]),
             helper.make_node("Add", ["b", "ones"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(1, np.int64), "i1"),
         numpy_helper.from_array(np.array([0], np.int64), "i0"),
         numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array(1, np.int64), "step")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_values_that_follow_the_dims_are_computed_not_folded() -> None:
    model = positions_model()
    graph_json, lib, params = from_onnx(model)
    assert all(a.shape in ((), (1,)) for a in params.values()), {
        k: a.shape for k, a in params.items()}
    module = gr.create(graph_json, lib)
    module.load_params(params)
    for batch, seq in [(1, 3), (2, 7), (3, 1)]:
        x = RNG.standard_normal((batch, seq)).astype(np.float32)
        module.run(x=x)
        want = x + np.arange(seq, dtype=np.float32) + seq + 1
        np.testing.assert_allclose(module.get_output(0).numpy(), want, rtol=1e-6)


DYNAMIC = Path(__file__).resolve().parents[1] / "data" / "onnx"


@pytest.mark.parametrize("name", ["bert_dyn", "gpt2_dyn"])
def test_transformers_import_once_and_match_onnxruntime_at_every_shape(name: str) -> None:
    path = DYNAMIC / f"{name}.onnx"
    graph_json, lib, params = from_onnx(path)
    module = gr.create(graph_json, lib)
    module.load_params(params)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    takes_mask = len(session.get_inputs()) > 1
    for batch, seq in [(1, 8), (1, 57), (4, 32), (2, 128)]:
        feeds = {"input_ids": RNG.integers(0, 100, (batch, seq)).astype(np.int64)}
        if takes_mask:
            mask = np.ones((batch, seq), np.int64)
            mask[0, seq - 3:] = 0  # padding, so the mask changes the result
            feeds["attention_mask"] = mask
        want = session.run(None, feeds)
        module.run(**feeds)
        for i, expected in enumerate(want):
            np.testing.assert_allclose(module.get_output(i).numpy(), expected, rtol=1e-4,
                                       atol=1e-5, err_msg=f"{name} {batch}x{seq} output {i}")
    assert module.specializations == 4
    # A cached shape: no specialisation, and the profile has no `specialise` row.
    module.run(**feeds)
    assert module.specializations == 4
    assert all(t.func_name != "__specialise" for t in module.profile())
    module.set_input(**{k: v[:, :5] for k, v in feeds.items()})
    rows = module.profile()
    assert rows[0].func_name == "__specialise" and rows[0].label.startswith("specialise (")
    assert module.specializations == 5


def _matches_onnxruntime(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]],
                         path: str = "propagation") -> dict:
    """Import once (checking which way), then every feed against ONNX Runtime; the graph doc."""
    from graph_runtime.frontend.importer import import_onnx
    result = import_onnx(model)
    assert result.symbolic_path == path, result.propagation_refusal
    module = gr.create(result.graph_json, result.module())
    module.load_params(result.params)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        want = session.run(None, feed)
        module.run(**feed)
        for i, expected in enumerate(want):
            got = module.get_output(i).numpy()
            assert got.shape == expected.shape, (feed.keys(), got.shape, expected.shape)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    return json.loads(result.graph_json)


def _model(nodes: list, inputs: list, inits: dict[str, np.ndarray],
           opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_conv_with_dynamic_height_and_width_imports_once() -> None:
    """⌊(L + pads - k)/s⌋ + 1 is no product or sum of the dims: the probes could not fit it."""
    w1 = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((5, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2"], ["c2"], strides=[2, 1], pads=[0, 1, 2, 0]),
             helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    sizes = [(1, 16, 16), (2, 23, 41), (3, 9, 30)]
    doc = _matches_onnxruntime(
        _model(nodes, [x], {"w1": w1, "w2": w2}),
        [{"x": RNG.standard_normal((b, 3, h, w)).astype(np.float32)} for b, h, w in sizes])
    shapes = doc["attrs"]["shape"][1]
    assert ["batch", 4, "((height-1)//2)+1", "((width-1)//2)+1"] in shapes, shapes


def test_reshape_expand_tile_of_shape_derived_targets() -> None:
    """Targets computed from Shape (Gather, Mul, Concat) fold to expressions; the shape value
    read as data (Cast to float) is computed at run time by a dim_values node."""
    i = {"i0": np.array([0], np.int64), "i1": np.array([1], np.int64),
         "two": np.array([2], np.int64), "four": np.array([4], np.int64),
         "ones": np.array([1, 1, 1], np.int64)}
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
             helper.make_node("Mul", ["n", "two"], ["n2"]),
             helper.make_node("Concat", ["b", "n2", "four"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("Concat", ["b", "n2", "four"], ["big"], axis=0),
             helper.make_node("Expand", ["r", "big"], ["e"]),
             helper.make_node("Concat", ["i1", "i1", "two"], ["reps"], axis=0),
             helper.make_node("Tile", ["e", "reps"], ["t"]),
             helper.make_node("Cast", ["n2"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["t", "nf"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    doc = _matches_onnxruntime(_model(nodes, [x], i), [
        {"x": RNG.standard_normal((b, s, 8)).astype(np.float32)} for b, s in [(1, 2), (3, 5),
                                                                              (2, 1)]])
    assert ["batch", "2*seq", 8] in doc["attrs"]["shape"][1]


@pytest.mark.parametrize("op, cases", [
    ("Reshape", [((1, 6), [3, 2, 1]), ((4, 1), [2, 2, 1]), ((2, 3), [1, -1, 2])]),
    ("Expand", [((1, 6), [3, 6]), ((4, 1), [4, 5])]),
    ("Tile", [((1, 6), [2, 1]), ((4, 1), [1, 3])])])
def test_targets_from_graph_inputs_with_symbolic_data(op: str, cases: list) -> None:
    """A Reshape/Expand/Tile target that is a graph input, over data with symbolic dims: the
    model is deferred (imported per input shape and target value when it runs)."""
    from graph_runtime.frontend.importer import import_onnx
    nodes = [helper.make_node(op, ["x", "t"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"]),
              helper.make_tensor_value_info("t", TensorProto.INT64, [len(cases[0][1])])]
    model = _model(nodes, inputs, {}, opset=17)
    result = import_onnx(model)
    assert result.symbolic_path == "deferred"
    assert "imported per input shape and shape-deciding value" in result.summary()
    module = gr.create(result.graph_json, result.module())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape, target in cases:
        feed = {"x": RNG.standard_normal(shape).astype(np.float32),
                "t": np.array(target, np.int64)}
        module.run(**feed)
        np.testing.assert_array_equal(module.get_output(0).numpy(), session.run(None, feed)[0])


def test_a_shape_deciding_input_of_symbolic_length_is_refused() -> None:
    """The target's own length decides the output's rank: refused, asking for its shape."""
    from graph_runtime.frontend.importer import import_onnx
    nodes = [helper.make_node("Reshape", ["x", "t"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"]),
              helper.make_tensor_value_info("t", TensorProto.INT64, ["r"])]
    with pytest.raises(FrontendError, match="input 't' has symbolic dims .r.; give concrete"):
        import_onnx(_model(nodes, inputs, {}, opset=17))


def test_dynamo_mask_builder_gather_nd_over_shape_built_indices() -> None:
    """Transformers' mask builder as the dynamo exporter writes it: GatherND into the mask with
    index tables from Range(Shape) broadcast to (batch, seq); the converter's stride and dims
    tables follow the dims."""
    c = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64),
         "a0": np.array([0], np.int64), "a1": np.array([1], np.int64),
         "am1": np.array([-1], np.int64), "big": np.array(-1e9, np.float32)}
    nodes = [helper.make_node("Shape", ["mask"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "b", "one"], ["rb"]),
             helper.make_node("Range", ["zero", "n", "one"], ["rn"]),
             helper.make_node("Unsqueeze", ["rb", "a1"], ["rb2"]),
             helper.make_node("Unsqueeze", ["rn", "a0"], ["rn2"]),
             helper.make_node("Unsqueeze", ["b", "a0"], ["b1"]),
             helper.make_node("Unsqueeze", ["n", "a0"], ["n1"]),
             helper.make_node("Concat", ["b1", "n1"], ["bn"], axis=0),
             helper.make_node("Expand", ["rb2", "bn"], ["ib"]),
             helper.make_node("Expand", ["rn2", "bn"], ["in_"]),
             helper.make_node("Unsqueeze", ["ib", "am1"], ["ib3"]),
             helper.make_node("Unsqueeze", ["in_", "am1"], ["in3"]),
             helper.make_node("Concat", ["ib3", "in3"], ["idx"], axis=-1),
             helper.make_node("GatherND", ["mask", "idx"], ["picked"]),
             helper.make_node("Cast", ["picked"], ["keep"], to=TensorProto.BOOL),
             helper.make_node("Unsqueeze", ["keep", "am1"], ["keep3"]),
             helper.make_node("Where", ["keep3", "x", "big"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4]),
              helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])]
    feeds = []
    for b, n in [(1, 3), (2, 6), (3, 1)]:
        mask = (RNG.random((b, n)) > 0.4).astype(np.int64)
        feeds.append({"x": RNG.standard_normal((b, n, 4)).astype(np.float32), "mask": mask})
    _matches_onnxruntime(_model(nodes, inputs, c, opset=18), feeds)


def test_kv_cache_concat_names_the_sum_of_lengths() -> None:
    """past (batch, past, 4) ++ new (batch, seq, 4), reshaped through its own Shape: past+seq."""
    c = {"m1": np.array([-1], np.int64), "a0": np.array([0], np.int64),
         "a2": np.array([2], np.int64)}
    nodes = [helper.make_node("Concat", ["past_kv", "x"], ["kv"], axis=1),
             helper.make_node("Shape", ["kv"], ["s"]),
             helper.make_node("Slice", ["s", "a0", "a2"], ["bt"]),
             helper.make_node("Concat", ["bt", "m1"], ["target"], axis=0),
             helper.make_node("Reshape", ["kv", "target"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=1)]
    inputs = [helper.make_tensor_value_info("past_kv", TensorProto.FLOAT, ["batch", "past", 4]),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])]
    doc = _matches_onnxruntime(_model(nodes, inputs, c), [
        {"past_kv": RNG.standard_normal((b, p, 4)).astype(np.float32),
         "x": RNG.standard_normal((b, s, 4)).astype(np.float32)}
        for b, p, s in [(1, 0, 3), (2, 5, 1), (1, 9, 4)]])
    assert ["batch", "past+seq", 4] in doc["attrs"]["shape"][1]


def test_matmul_over_a_batch_only_known_at_run_time() -> None:
    """Falcon's multi-query scores: (batch, 4, seq, 16) @ (batch, 1, 16, seq). Whether batch*1
    is 1 is not known at import; the general broadcast path serves batch 1 too."""
    nodes = [helper.make_node("MatMul", ["q", "k"], ["y"])]
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["batch", 4, "seq", 16]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, ["batch", 1, 16, "seq"])]
    _matches_onnxruntime(_model(nodes, inputs, {}), [
        {"q": RNG.standard_normal((b, 4, s, 16)).astype(np.float32),
         "k": RNG.standard_normal((b, 1, 16, s)).astype(np.float32)}
        for b, s in [(1, 5), (3, 2), (2, 9)]])


def test_what_propagation_cannot_decide_falls_back_to_the_probes() -> None:
    """Squeeze without axes on (1, n): whether n is 1 is not known at import; the probe import
    (n at 37 and 53) still serves, and the result says which way it went and why."""
    from graph_runtime.frontend.importer import import_onnx
    nodes = [helper.make_node("Squeeze", ["x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])], {})
    result = import_onnx(model)
    assert result.symbolic_path == "probes"
    assert "Squeeze" in result.propagation_refusal and "n == 1" in result.propagation_refusal
    assert "imported at probe sizes and fitted (propagation refused: " in result.summary()
    _matches_onnxruntime(model, [{"x": RNG.standard_normal((1, k)).astype(np.float32)}
                                 for k in (2, 7)], path="probes")


@pytest.mark.parametrize("name", ["bert_dyn", "gpt2_dyn"])
def test_transformers_import_by_propagation(name: str) -> None:
    from graph_runtime.frontend.importer import import_onnx
    result = import_onnx(DYNAMIC / f"{name}.onnx")
    assert result.symbolic_path == "propagation", result.propagation_refusal
    assert "imported once, shapes propagated as expressions" in result.summary()


# Tiny exports of the models issue 32 names (bench/dynamic_models.py --tiny): dims by name, the
# bindings each is run at (mask, if any, padded at the end of row 0; position ids after past).
TINY = {"llama_tiny_ts": [{"batch": 1, "seq": 9}, {"batch": 2, "seq": 17}, {"batch": 3, "seq": 5}],
        "llama_tiny_dynamo": [{"s72": 1, "s43": 1, "s53": 9}, {"s72": 2, "s43": 2, "s53": 17},
                              {"s72": 3, "s43": 3, "s53": 5}],
        "llama_tiny_kv_ts": [{"batch": 1, "seq": 1, "past": 5, "total": 6},
                             {"batch": 2, "seq": 7, "past": 0, "total": 7},
                             {"batch": 1, "seq": 3, "past": 20, "total": 23}],
        "cnn_tiny_hw_ts": [{"batch": 1, "height": 64, "width": 64},
                           {"batch": 2, "height": 81, "width": 97},
                           {"batch": 1, "height": 100, "width": 72}],
        "cnn_tiny_hw_dynamo": [{"s77": 1, "s53": 64, "s0": 64}, {"s77": 2, "s53": 81, "s0": 97}],
        "wav2vec2_tiny_ts": [{"batch": 1, "samples": 800}, {"batch": 2, "samples": 1201}],
        # counts its frames twice, by the convs and by its own floor arithmetic
        "wav2vec2_tiny_dynamo": [{"s5": 1, "s96": 800}, {"s5": 2, "s96": 1201},
                                 {"s5": 1, "s96": 400}]}


def _tiny_feeds(session: ort.InferenceSession, env: dict[str, int]) -> dict[str, np.ndarray]:
    feeds = {}
    for i in session.get_inputs():
        shape = [env[d] if isinstance(d, str) else d for d in i.shape]
        if "int64" not in i.type:
            feeds[i.name] = RNG.standard_normal(shape).astype(np.float32)
        elif "mask" in i.name:
            feeds[i.name] = np.ones(shape, np.int64)
            if shape[-1] > 3:
                feeds[i.name][0, -2:] = 0
        elif "position" in i.name:
            past = env.get("past", 0)
            feeds[i.name] = np.broadcast_to(np.arange(past, past + shape[-1]), shape).copy()
        else:
            feeds[i.name] = RNG.integers(0, 100, shape).astype(np.int64)
    return feeds


@pytest.mark.parametrize("name", list(TINY))
def test_issue_models_import_once_by_propagation(name: str) -> None:
    """Refused or probe-imported before (dynamo's mask builder, conv lengths, the KV cache's
    past+seq); now one import serves every shape, as ONNX Runtime computes it."""
    from graph_runtime.frontend.importer import import_onnx
    path = DYNAMIC / f"{name}.onnx"
    result = import_onnx(path)
    assert result.symbolic_path == "propagation", result.propagation_refusal
    module = gr.create(result.graph_json, result.module())
    module.load_params(result.params)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for env in TINY[name]:
        feeds = _tiny_feeds(session, env)
        want = session.run(None, feeds)
        module.run(**feeds)
        for i, expected in enumerate(want):
            np.testing.assert_allclose(module.get_output(i).numpy(), expected, rtol=1e-3,
                                       atol=1e-4, err_msg=f"{name} {env} output {i}")


def test_symbolic_value_read_inside_a_loop_body_is_fed() -> None:
    """A shape value that follows the dims, read by a Loop body, is fed to it as an input (a
    dim_values node makes it per shape), never embedded as a constant of one size."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "n"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.INT64, [1])])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
             helper.make_node("Loop", ["trips", "", "zero"], ["total"], body=body),
             helper.make_node("Cast", ["total"], ["tf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "tf"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])
    model = _model(nodes, [x], {"i1": np.array([1], np.int64), "trips": np.array(3, np.int64),
                                "zero": np.array([0], np.int64)})
    _matches_onnxruntime(model, [{"x": RNG.standard_normal((b, s)).astype(np.float32)}
                                 for b, s in [(1, 2), (2, 5)]])


def _static_shapes(path: Path, env: dict[str, int]) -> dict[str, list[int]]:
    inputs = onnx.load(str(path), load_external_data=False).graph.input
    return {i.name: [d.dim_value if d.HasField("dim_value") else env[d.dim_param]
                     for d in i.type.tensor_type.shape.dim] for i in inputs}


@pytest.mark.parametrize("name, env", [
    ("bert_dyn", {"batch": 2, "seq": 7}), ("gpt2_dyn", {"batch": 2, "seq": 7}),
    ("llama_tiny_ts", TINY["llama_tiny_ts"][1]), ("llama_tiny_kv_ts", TINY["llama_tiny_kv_ts"][0])])
def test_symbolic_import_fuses_as_a_static_one(name: str, env: dict[str, int]) -> None:
    """Attention (and BERT's QKV packing) traced at stand-in sizes: the same rewrites as an import
    at one shape (test_transformers_import_once... and test_issue_models... run the fused module
    against ONNX Runtime at every shape)."""
    from graph_runtime.frontend.importer import import_onnx
    path = DYNAMIC / f"{name}.onnx"
    symbolic = import_onnx(path)
    assert symbolic.symbolic_path == "propagation", symbolic.propagation_refusal
    static = import_onnx(path, shape=_static_shapes(path, env))
    assert symbolic.patterns["attention"] == 2
    # (index arithmetic over symbolic dims is one index_expr; at one shape it is folded)
    assert symbolic.patterns - Counter(index_expr=symbolic.patterns["index_expr"]) \
        == static.patterns


def _attention_model(heads_back: bool) -> onnx.ModelProto:
    """x (batch, seq, 32) -> self-attention of 4 heads of 8; the context's heads put back by
    Transpose + Reshape (heads_back), or by a Reshape alone (the right layout only for seq 1)."""
    nodes = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", ["x", f"W{n}"], [f"{n}p"]),
                  helper.make_node("Reshape", [f"{n}p", "split"], [f"{n}4"]),
                  helper.make_node("Transpose", [f"{n}4"], [n], perm=perm)]
    nodes += [helper.make_node("MatMul", ["q", "k"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["c"])]
    if heads_back:
        nodes += [helper.make_node("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["ct", "merge"], ["y"])]
    else:
        nodes += [helper.make_node("Reshape", ["c", "merge"], ["y"])]
    inits = {f"W{n}": RNG.standard_normal((32, 32)).astype(np.float32) for n in "qkv"}
    inits.update(split=np.array([0, 0, 4, 8], np.int64), merge=np.array([0, -1, 32], np.int64),
                 scale=np.array(8 ** -0.5, np.float32))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                        ["batch", "seq", 32])], inits)


@pytest.mark.parametrize("heads_back", [True, False])
def test_attention_layout_right_only_at_some_sizes_is_not_fused(heads_back: bool) -> None:
    """The context's Reshape without a Transpose gives attention's layout only where seq is 1:
    traced at stand-in sizes it is no match, and both models run as ONNX Runtime's."""
    from graph_runtime.frontend.importer import import_onnx
    model = _attention_model(heads_back)
    assert import_onnx(model).patterns["attention"] == int(heads_back)
    _matches_onnxruntime(model, [{"x": RNG.standard_normal(s).astype(np.float32)}
                                 for s in ((1, 1, 32), (2, 5, 32), (3, 7, 32))])


def test_audio_too_short_for_the_convs_is_refused_naming_the_node() -> None:
    """wav2vec2's dynamo export imported once: its frames' two formulas taken as one size
    (symdim.same_size) for every length the model takes; a clip shorter than its convs' window
    (400 samples) is refused at that node, as ONNX Runtime refuses it, never run wrong."""
    from graph_runtime.errors import GraphError
    from graph_runtime.frontend.importer import import_onnx
    result = import_onnx(DYNAMIC / "wav2vec2_tiny_dynamo.onnx")
    assert result.symbolic_path == "propagation", result.propagation_refusal
    module = gr.create(result.graph_json, result.module())
    module.load_params(result.params)
    with pytest.raises(GraphError, match=r"conv2d.*cannot take these input shapes|"
                                         r"cannot take these input shapes.*conv2d"):
        module.run(audio=np.zeros((1, 399), np.float32))
