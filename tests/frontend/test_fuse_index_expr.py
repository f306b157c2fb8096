"""The index-expr pass: a decoder's mask arithmetic as one index_expr op, its values the graph's
own bit for bit, checked against the same import without the pass and against ONNX Runtime."""
from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import graph_runtime as gr  # noqa: E402
from graph_runtime.errors import LibraryError  # noqa: E402
from graph_runtime.frontend.importer import import_onnx  # noqa: E402
from graph_runtime.lib.registry import OPS, load_standard_ops  # noqa: E402
from graph_runtime.lib.library import TensorSpec  # noqa: E402

MIN = float(np.finfo(np.float32).min)


def _c(name: str, value: object, dtype: int = TensorProto.INT64) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, dtype, np.shape(value), np.asarray(value).reshape(-1).tolist()))


def mask_model() -> onnx.ModelProto:
    """transformers' mask builder as its TorchScript export writes it: a causal mask of the
    cache positions (past + Range(seq)) against Range(past + seq), and the padding mask read
    by a Gather of the flattened attention mask at batch * total + position; Where gives 0
    or float32's lowest. The output adds the mask to scores (batch, 1, seq, past + seq)."""
    nodes = [
        _c("i0", 0), _c("i1", 1), _c("i2", 2), _c("ax0", [0]), _c("ax1", [1]), _c("ax2", [2]),
        _c("ax3", [3]), _c("m1", [-1]),
        helper.make_node("Cast", ["attention_mask"], ["am_bool"], to=TensorProto.BOOL),
        helper.make_node("Shape", ["ids"], ["ids_shape"]),
        helper.make_node("Gather", ["ids_shape", "i1"], ["seq"], axis=0),
        helper.make_node("Gather", ["ids_shape", "i0"], ["batch"], axis=0),
        helper.make_node("Shape", ["past"], ["past_shape"]),
        helper.make_node("Gather", ["past_shape", "i2"], ["past_len"], axis=0),
        helper.make_node("Add", ["past_len", "seq"], ["kv_len"]),
        helper.make_node("Range", ["i0", "batch", "i1"], ["b_idx"]),
        helper.make_node("Range", ["i0", "seq", "i1"], ["q_range"]),
        helper.make_node("Add", ["q_range", "past_len"], ["q_pos"]),
        helper.make_node("Range", ["i0", "kv_len", "i1"], ["k_pos"]),
        helper.make_node("Unsqueeze", ["b_idx", "ax1"], ["b1"]),
        helper.make_node("Unsqueeze", ["b1", "ax2"], ["b2"]),
        helper.make_node("Unsqueeze", ["b2", "ax3"], ["b4"]),
        helper.make_node("Unsqueeze", ["q_pos", "ax0"], ["q1"]),
        helper.make_node("Unsqueeze", ["q1", "ax1"], ["q2"]),
        helper.make_node("Unsqueeze", ["q2", "ax3"], ["q4"]),
        helper.make_node("Unsqueeze", ["k_pos", "ax0"], ["k1"]),
        helper.make_node("Unsqueeze", ["k1", "ax1"], ["k2"]),
        helper.make_node("Unsqueeze", ["k2", "ax2"], ["k4"]),
        helper.make_node("LessOrEqual", ["k4", "q4"], ["causal"]),
        helper.make_node("Shape", ["am_bool"], ["am_shape"]),
        helper.make_node("Gather", ["am_shape", "ax1"], ["total"], axis=0),
        helper.make_node("Flatten", ["am_bool"], ["am_flat"], axis=2),
        helper.make_node("Mul", ["b4", "total"], ["row"]),
        helper.make_node("Add", ["k4", "row"], ["flat_index"]),
        helper.make_node("Gather", ["am_flat", "flat_index"], ["padded"], axis=0),
        helper.make_node("Shape", ["flat_index"], ["index_shape"]),
        helper.make_node("Reshape", ["padded", "m1"], ["padded_1d"]),
        helper.make_node("Reshape", ["padded_1d", "index_shape"], ["padding"]),
        helper.make_node("And", ["causal", "padding"], ["allowed"]),
        _c("zero", 0.0, TensorProto.FLOAT), _c("lowest", MIN, TensorProto.FLOAT),
        helper.make_node("Where", ["allowed", "zero", "lowest"], ["mask"]),
        helper.make_node("Neg", ["mask"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "mask", [
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", 2, "past", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(rng: np.random.Generator, batch: int, seq: int, past: int) -> dict[str, np.ndarray]:
    mask = np.ones((batch, past + seq), np.int64)
    mask[0, : min(2, past + seq)] = 0  # left padding of the first row
    return {"ids": rng.integers(0, 9, (batch, seq)).astype(np.int64), "attention_mask": mask,
            "past": rng.standard_normal((batch, 2, past, 4)).astype(np.float32)}


def _module(disable: tuple[str, ...] = ()) -> tuple[object, dict]:
    result = import_onnx(mask_model(), disable=disable)
    module = gr.create(result.graph_json, result.module())
    module.load_params(result.params)
    return module, json.loads(result.graph_json)


def _ops(graph: dict) -> list[str]:
    return [n["attrs"]["func_name"] for n in graph["nodes"] if n["op"] != "null"]


def test_the_mask_arithmetic_is_one_index_expr_bit_for_bit_at_every_shape() -> None:
    """Imported once: the mask's Ranges, Unsqueezes, comparison, Gather and Where are one
    index_expr node (the output's negation aside), whose values equal the graph's without the pass
    exactly and ONNX Runtime's, at prompts and decode steps, batch 1 and 2, left padding."""
    fused, graph = _module()
    plain, unfused = _module(("index-expr",))
    assert any("index_expr" in f for f in _ops(graph))
    assert len(_ops(graph)) == 2 and len(_ops(unfused)) > 6, (_ops(graph), _ops(unfused))
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(mask_model().SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch, seq, past in [(1, 5, 0), (1, 1, 5), (1, 1, 6), (2, 3, 4), (2, 1, 17), (1, 1, 0)]:
        feeds = _feeds(rng, batch, seq, past)
        got = fused.run_with(**feeds)[0]
        np.testing.assert_array_equal(got, plain.run_with(**feeds)[0])
        np.testing.assert_array_equal(got, session.run(None, feeds)[0])


def test_a_float_input_is_read_outside_the_index_arithmetic() -> None:
    """A Range scaled by a float input: the Range and its cast are index arithmetic (one
    index_expr, reading x for its length alone); the product with x's elements stays an op of
    its own (index arithmetic reads int or bool inputs and scalars only)."""
    nodes = [_c("i0", 0), _c("i1", 1),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "i0"], ["n"], axis=0),
             helper.make_node("Range", ["i0", "n", "i1"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["rf", "x"], ["y"])]
    graph = helper.make_graph(nodes, "scaled", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = import_onnx(model)
    assert _ops(json.loads(result.graph_json)) == ["tvmgen_default_fused_index_expr",
                                                   "tvmgen_default_fused_multiply"]
    program = result.lib_doc["functions"]["tvmgen_default_fused_index_expr"]["expr"]
    assert not any(step[0] == "read" for step in program), program
    module = gr.create(result.graph_json, result.module())
    for n in (7, 1, 0):
        x = np.linspace(-1, 1, n).astype(np.float32)
        np.testing.assert_array_equal(module.run_with(x=x)[0], np.arange(n, dtype=np.float32) * x)


def _infer(expr: object, shape: object = ("n",)) -> list[TensorSpec]:
    load_standard_ops()
    return OPS["index_expr"].infer([TensorSpec((3, 4), "int64")],
                                   {"at": [["n", 0, 1]], "shape": list(shape),
                                    "dtype": "int64", "expr": expr})


def test_a_malformed_program_is_refused_naming_the_step() -> None:
    assert _infer([["idx", 0]])[0].shape == (4,)
    assert _infer([["dim", "n"], ["idx", 0], ["add"]])[0].shape == (4,)
    for expr, says in [([["idx", 1]], "step 0"), ([["add"]], "2 values on the stack"),
                       ([["idx", 0], ["idx", 0]], "leaves 2 values"),
                       ([["dim", "m"]], "reads m"), ([["take", "wrap"]], "after a"),
                       ([["grid", 4], ["idx", 0]], "grids open"), ([["sqrt"]], "unknown kind"),
                       ([["const", 1, "complex64"]], "dtype"), ("idx", "list of 1 to")]:
        with pytest.raises(LibraryError, match="index_expr") as e:
            _infer(expr)
        assert says in str(e.value), (expr, str(e.value))
    with pytest.raises(LibraryError, match="reads q"):
        _infer([["idx", 0]], ("q",))


@pytest.mark.opencl
def test_the_mask_runs_on_opencl_as_on_the_cpu(opencl_available: None) -> None:
    """The whole graph on an OpenCL device: index_expr reads the attention mask on the host
    and writes the mask back; the same values as on the CPU."""
    result = import_onnx(mask_model())
    on_cl = gr.create(result.graph_json, result.module(), gr.device("opencl"))
    on_cpu, _ = _module()
    rng = np.random.default_rng(1)
    for batch, seq, past in [(1, 4, 0), (2, 1, 9), (1, 1, 10)]:
        feeds = _feeds(rng, batch, seq, past)
        np.testing.assert_array_equal(on_cl.run_with(**feeds)[0], on_cpu.run_with(**feeds)[0])


def test_a_program_reading_two_gathers_on_grids_of_their_own() -> None:
    """Two flattened values, each made on a grid of its own dims and read by a take: each
    grid's indices are its own (a program written out reads no index of another grid)."""
    from graph_runtime.lib.ops.index_expr import compile_program
    program = [["grid", 2, 3], ["idx", 0], ["idx", 1], ["read", 0], ["flat"], ["idx", 0],
               ["take", "wrap"],
               ["grid", "n"], ["idx", 0], ["read", 1], ["flat"], ["idx", 0], ["take", "clip"],
               ["add"]]
    inputs = [TensorSpec((2, 3), "int64"), TensorSpec((4,), "int64")]
    load_standard_ops()
    attrs = {"at": [["n", 1, 0]], "shape": [5], "dtype": "int64", "expr": program}
    assert OPS["index_expr"].infer(inputs, attrs)[0].shape == (5,)
    a, b = np.arange(6, dtype=np.int64).reshape(2, 3) * 10, np.arange(4, dtype=np.int64)
    got = compile_program(program, [2, 1], 1)([a, b], {"n": 4}, (5,))
    want = np.take(a.reshape(-1), np.arange(5), mode="wrap") + np.take(b, np.arange(5),
                                                                        mode="clip")
    np.testing.assert_array_equal(got, want)


def test_a_value_doubled_op_after_op_makes_no_huge_program() -> None:
    """x(k+1) = x(k) + x(k), 40 times over a Range: written as a tree each level would double
    the program (2^40 steps). The pass stops a region where its program would pass the op's
    1024 steps; the rest are ops of their own, and the import is quick and exact."""
    import time
    nodes = [_c("i0", 0), _c("i1", 1), helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "i0"], ["n"], axis=0),
             helper.make_node("Range", ["i0", "n", "i1"], ["x0"])]
    nodes += [helper.make_node("Add", [f"x{k}", f"x{k}"], [f"x{k + 1}"]) for k in range(40)]
    graph = helper.make_graph(nodes, "doubled", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("x40", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    start = time.perf_counter()
    result = import_onnx(model)
    assert time.perf_counter() - start < 20
    program = result.lib_doc["functions"]["tvmgen_default_fused_index_expr"]["expr"]
    assert len(program) <= 1024
    module = gr.create(result.graph_json, result.module())
    got = module.run_with(x=np.zeros(5, np.float32))[0]
    np.testing.assert_array_equal(got, np.arange(5, dtype=np.int64) * 2 ** 40)
