"""Decoder-LLM and mobile-net patterns fused at import: RMSNorm in the exporters' forms, SiLU
(into a conv's or dense's tail: the SiLU-gated MLP), and attention whose heads carry rotary
embeddings and whose K/V heads are repeated (grouped- and multi-query)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx_builders import (F32, assert_matches, helper, init, model, numpy_helper, run_ort,
                           run_ours, tensor, weights)

import graph_runtime as gr
from graph_runtime.frontend import from_onnx
from graph_runtime.frontend.importer import import_onnx


def _ops(result: object) -> list[str]:
    return [s["op"] for f in result.lib_doc["functions"].values()  # type: ignore[attr-defined]
            for s in f.get("ops", [f])]


def _rms_norm(form: str, gamma: bool) -> object:
    """x / sqrt(mean(x^2) + eps) [* w] as the TorchScript exporter (Pow, Div(1, .), Mul), the
    dynamo exporter (Mul(x, x), Reciprocal, Mul) or directly (Div(x, .)) writes it."""
    width = 24
    square = helper.make_node("Pow", ["x", "two"], ["sq"]) if form == "ts" \
        else helper.make_node("Mul", ["x", "x"], ["sq"])
    nodes = [square, helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
             helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["rms"])]
    if form == "ts":
        nodes += [helper.make_node("Div", ["one", "rms"], ["inv"]),
                  helper.make_node("Mul", ["x", "inv"], ["n"])]
    elif form == "dynamo":
        nodes += [helper.make_node("Reciprocal", ["rms"], ["inv"]),
                  helper.make_node("Mul", ["x", "inv"], ["n"])]
    else:
        nodes += [helper.make_node("Div", ["x", "rms"], ["n"])]
    if gamma:
        nodes.append(helper.make_node("Mul", ["w", "n"], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    inits = [init("two", np.float32(2)), init("eps", np.float32(1e-6)),
             init("one", np.float32(1)), init("w", weights(width) + 1)]
    used = {i for n in nodes for i in n.input}
    return model(nodes, [tensor("x", F32, [2, 5, width])], [tensor("y", F32, [2, 5, width])],
                 [i for i in inits if i.name in used], opset=17)


@pytest.mark.parametrize("form,gamma", [("ts", True), ("dynamo", True), ("div", False)])
def test_rms_norm_becomes_one_op(form: str, gamma: bool, backend_name: str) -> None:
    m = _rms_norm(form, gamma)
    result = import_onnx(m)
    assert dict(result.patterns) == {"rms_norm": 1}
    assert _ops(result) == ["rms_norm"]
    x = (np.random.default_rng(5).standard_normal((2, 5, 24)) * 3).astype(np.float32)
    assert_matches(m, {"x": x}, backend_name)


def test_rms_norm_disabled_keeps_the_prims() -> None:
    result = import_onnx(_rms_norm("ts", True), disable=["rms-norm"])
    assert "rms_norm" not in _ops(result) and "mean" in _ops(result)


def test_a_negative_epsilon_is_left_to_the_prims() -> None:
    """mean(x^2) - 1 under the root: a model may write it (NaN below 1); rms_norm refuses a
    negative epsilon, so the pattern stays as the graph wrote it."""
    m = _rms_norm("dynamo", True)
    eps = next(i for i in m.graph.initializer if i.name == "eps")
    eps.CopyFrom(init("eps", np.float32(-1.0)))
    result = import_onnx(m)
    assert "rms_norm" not in dict(result.patterns) and "mean" in _ops(result)


def test_a_mean_of_squares_read_twice_is_left() -> None:
    """mean(x^2) also a graph output: fusing would compute it twice, so nothing is fused."""
    m = _rms_norm("dynamo", True)
    m.graph.output.append(tensor("ms", F32, [2, 5, 1]))
    assert "rms_norm" not in dict(import_onnx(m).patterns)


def test_silu_joins_the_conv_tail(backend_name: str) -> None:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    m = model(nodes, [tensor("x", F32, [1, 3, 6, 6])], [tensor("y", F32, [1, 4, 6, 6])],
              [init("w", weights(4, 3, 3, 3)), init("b", weights(4))])
    result = import_onnx(m)
    assert dict(result.patterns) == {"silu": 1}
    assert list(result.lib_doc["functions"]) == ["tvmgen_default_fused_nn_conv2d_add_silu"]
    x = np.random.default_rng(6).standard_normal((1, 3, 6, 6)).astype(np.float32) * 3
    assert_matches(m, {"x": x}, backend_name)


def _gated_mlp(activation: list, packed: bool | str = False, bias: bool = False,
               seq: object = 7) -> object:
    """down(act(gate(x)) * up(x)) as LLaMA (act SiLU as x * sigmoid(x)) and T5 v1.1 (GELU)
    write it, or (packed) Phi-3's one product chunked in two halves, gate first."""
    if packed == "sliced":  # as the TorchScript exporter writes chunk(2, dim=-1)
        nodes = [helper.make_node("MatMul", ["x", "wgu"], ["gu"]),
                 helper.make_node("Slice", ["gu", "zero", "half", "last"], ["g"]),
                 helper.make_node("Slice", ["gu", "half", "end", "last"], ["u"])]
        inits = [init("wgu", weights(16, 80))] + [
            init(n, np.array([v])) for n, v in (("zero", 0), ("half", 40), ("end", 80),
                                                ("last", -1))]
    elif packed:
        nodes = [helper.make_node("MatMul", ["x", "wgu"], ["gu"]),
                 helper.make_node("Split", ["gu", "halves"], ["g", "u"], axis=-1)]
        inits = [init("wgu", weights(16, 80)), init("halves", np.array([40, 40]))]
    else:
        nodes = [helper.make_node("MatMul", ["x", "wg"], ["g0" if bias else "g"]),
                 helper.make_node("MatMul", ["x", "wu"], ["u0" if bias else "u"])]
        inits = [init("wg", weights(16, 40)), init("wu", weights(16, 40))]
        if bias:
            nodes += [helper.make_node("Add", ["g0", "bg"], ["g"]),
                      helper.make_node("Add", ["bu", "u0"], ["u"])]
            inits += [init("bg", weights(40)), init("bu", weights(40))]
    nodes += activation + [helper.make_node("Mul", ["u", "act"], ["h"]),
                           helper.make_node("MatMul", ["h", "wd"], ["y"])]
    return model(nodes, [tensor("x", F32, [1, seq, 16])], [tensor("y", F32, [1, seq, 16])],
                 inits + [init("wd", weights(40, 16))], opset=20)


SILU = [helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["g", "sg"], ["act"])]
GELU_TANH = [helper.make_node("Gelu", ["g"], ["act"], approximate="tanh")]
GELU = [helper.make_node("Gelu", ["g"], ["act"])]
RELU = [helper.make_node("Relu", ["g"], ["act"])]


@pytest.mark.parametrize("name,activation", [("silu", SILU), ("gelu_tanh", GELU_TANH),
                                             ("gelu", GELU), ("relu", RELU)])
@pytest.mark.parametrize("form", ["two products", "with biases", "one product split",
                                  "one product sliced"])
def test_gated_mlp_is_one_product_and_glu(backend_name: str, name: str, activation: list,
                                          form: str) -> None:
    """The gate and up products of one input become one product twice as wide (weights and
    biases side by side) and glu; a product split in halves (Phi-3) becomes glu alone. Either
    way the answer is ONNX Runtime's."""
    packed = {"one product split": True, "one product sliced": "sliced"}.get(form, False)
    m = _gated_mlp(activation, packed=packed, bias=form == "with biases")
    result = import_onnx(m)
    kind = "gated_mlp_split" if packed else "gated_mlp_packed"
    assert dict(result.patterns) == {**({"silu": 1} if name == "silu" else {}), kind: 1}
    functions = list(result.lib_doc["functions"])
    assert "tvmgen_default_fused_glu" in functions
    # no activation, product or split of its own left: one product writes gate | up
    assert not any(op in f for f in functions for op in ("multiply", "silu", "gelu", "relu",
                                                         "split", "slice")), functions
    x = np.random.default_rng(7).standard_normal((1, 7, 16)).astype(np.float32)
    assert_matches(m, {"x": x}, backend_name)


def test_gated_mlp_with_a_symbolic_length_runs_every_length() -> None:
    """Imported once without --shape (seq symbolic): one glu serves each length."""
    m = _gated_mlp(SILU, seq="seq")
    assert dict(import_onnx(m).patterns)["gated_mlp_packed"] == 1
    graph_json, lib, params = from_onnx(m)
    module = gr.create(graph_json, lib, gr.cpu())
    module.load_params(gr.save_param_dict(params))
    for seq in (1, 9, 40):
        x = np.random.default_rng(seq).standard_normal((1, seq, 16)).astype(np.float32)
        module.run(x=x)
        want = run_ort(m, {"x": x})[0]
        np.testing.assert_allclose(module.get_output(0).numpy(), want, rtol=2e-4, atol=2e-4)


def test_gated_mlp_whose_parts_are_read_elsewhere_stays() -> None:
    """A gate product that is also a graph output, or two products of different inputs, or
    halves of a split along another axis: nothing packed, the answer still right."""
    read_elsewhere = _gated_mlp(SILU)
    read_elsewhere.graph.output.append(tensor("g", F32, [1, 7, 40]))
    two_inputs = _gated_mlp(SILU)
    two_inputs.graph.node[1].input[0] = "x2"
    two_inputs.graph.input.append(tensor("x2", F32, [1, 7, 16]))
    for m in (read_elsewhere, two_inputs):
        patterns = dict(import_onnx(m).patterns)
        assert "gated_mlp_packed" not in patterns and "gated_mlp_split" not in patterns
        feeds = {i.name: np.random.default_rng(1).standard_normal((1, 7, 16)).astype(
            np.float32) for i in m.graph.input}
        assert_matches(m, feeds, "cpu")


def test_sigmoid_times_another_value_is_no_silu() -> None:
    """Squeeze-and-excite's x * sigmoid(s) with s not x stays as it is."""
    nodes = [helper.make_node("Sigmoid", ["s"], ["g"]), helper.make_node("Mul", ["x", "g"], ["y"])]
    m = model(nodes, [tensor("x", F32, [2, 3]), tensor("s", F32, [2, 3])],
              [tensor("y", F32, [2, 3])])
    assert "silu" not in dict(import_onnx(m).patterns)


def _rotary(name: str, heads: int, seq: int, dim: int, nodes: list, inits: list,
            rot: int = 0, flipped: bool = False) -> str:
    """name * cos + rotate_half(name) * sin over (batch, heads, seq, dim), as LLaMA's code; with
    rot, over the first rot of each head, the rest concatenated after (GPT-NeoX's partial
    rotary); flipped: concat(x_a, -x_b), no rotate_half."""
    rot = rot or dim
    half = rot // 2
    x = name
    if rot != dim:
        nodes += [helper.make_node("Slice", [name, "zero1", "rot1", "axis3"], [f"{name}_x"]),
                  helper.make_node("Slice", [name, "rot1", "dim1", "axis3"], [f"{name}_p"])]
        x = f"{name}_x"
    parts = [f"{x}_a", f"{x}_nb"] if flipped else [f"{x}_nb", f"{x}_a"]
    nodes += [helper.make_node("Slice", [x, "zero1", "half1", "axis3"], [f"{x}_a"]),
              helper.make_node("Slice", [x, "half1", "rot1", "axis3"], [f"{x}_b"]),
              helper.make_node("Neg", [f"{x}_b"], [f"{x}_nb"]),
              helper.make_node("Concat", parts, [f"{x}_rot"], axis=3),
              helper.make_node("Mul", [x, "cos"], [f"{x}_c"]),
              helper.make_node("Mul", [f"{x}_rot", "sin"], [f"{x}_s"]),
              helper.make_node("Add", [f"{x}_c", f"{x}_s"], [f"{name}_r"])]
    if rot != dim:
        nodes[-1].output[0] = f"{name}_rr"
        nodes.append(helper.make_node("Concat", [f"{name}_rr", f"{name}_p"], [f"{name}_r"],
                                      axis=3))
    if not any(i.name == "cos" for i in inits):
        angles = np.arange(seq)[:, None] / 10000 ** (np.arange(half) * 2 / rot)[None]
        angles = np.concatenate([angles, angles], 1)[None, None]
        inits += [init("cos", np.cos(angles).astype(np.float32)),
                  init("sin", np.sin(angles).astype(np.float32)),
                  init("zero1", np.array([0], np.int64)), init("half1", np.array([half])),
                  init("rot1", np.array([rot])), init("dim1", np.array([dim])),
                  init("axis3", np.array([3]))]
    return f"{name}_r"


def _gqa(batch: int, seq: int, heads: int, kv_heads: int, dim: int, rotary: bool,
         packed: bool = False, rot: int = 0, flipped: bool = False, tiled: bool = False,
         k_out: bool = False) -> object:
    """LLaMA's attention: projections (or one packed projection split in three), heads by
    Reshape/Transpose, rotary on q and k (partial with rot; no rotate_half if flipped), K/V
    heads repeated by Unsqueeze/Expand/Reshape (tiled: Tile, kv head h % kv_heads for head h),
    MatMul, scale, causal mask, Softmax, MatMul, heads back to (batch, seq, heads * dim); k_out:
    the rotated K heads an output too (as a KV cache's present)."""
    emb, group = 32, heads // kv_heads
    nodes: list = []
    inits = [init("wq", weights(emb, heads * dim)), init("wk", weights(emb, kv_heads * dim)),
             init("wv", weights(emb, kv_heads * dim)),
             init("scale", np.float32(1 / math.sqrt(dim))),
             init("mask", np.triu(np.full((seq, seq), -np.inf, np.float32), 1)[None, None]),
             init("q4", np.array([batch, seq, heads, dim], np.int64)),
             init("kv4", np.array([batch, seq, kv_heads, dim], np.int64)),
             init("kv5", np.array([batch, kv_heads, group, seq, dim], np.int64)),
             init("rep4", np.array([batch, heads, seq, dim], np.int64)),
             init("out3", np.array([batch, seq, heads * dim], np.int64)),
             init("axis2", np.array([2], np.int64)),
             init("tile4", np.array([1, group, 1, 1], np.int64))]
    if packed:
        inits += [init("wqkv", np.concatenate([numpy_helper.to_array(i) for i in inits[:3]], 1)),
                  init("splits", np.array([heads * dim, kv_heads * dim, kv_heads * dim]))]
        nodes += [helper.make_node("MatMul", ["x", "wqkv"], ["pqkv"]),
                  helper.make_node("Split", ["pqkv", "splits"], ["pq", "pk", "pv"], axis=2)]
    for n, shape in (("q", "q4"), ("k", "kv4"), ("v", "kv4")):
        if not packed:
            nodes.append(helper.make_node("MatMul", ["x", f"w{n}"], [f"p{n}"]))
        nodes += [helper.make_node("Reshape", [f"p{n}", shape], [f"r{n}"]),
                  helper.make_node("Transpose", [f"r{n}"], [f"t{n}"], perm=[0, 2, 1, 3])]
    q, k = "tq", "tk"
    if rotary:
        q = _rotary("tq", heads, seq, dim, nodes, inits, rot, flipped)
        k = _rotary("tk", kv_heads, seq, dim, nodes, inits, rot, flipped)
    repeated = {}
    for n, src in (("k", k), ("v", "tv")):
        if group == 1:
            repeated[n] = src
            continue
        if tiled:
            nodes.append(helper.make_node("Tile", [src, "tile4"], [f"g{n}"]))
            repeated[n] = f"g{n}"
            continue
        nodes += [helper.make_node("Unsqueeze", [src, "axis2"], [f"u{n}"]),
                  helper.make_node("Expand", [f"u{n}", "kv5"], [f"e{n}"]),
                  helper.make_node("Reshape", [f"e{n}", "rep4"], [f"g{n}"])]
        repeated[n] = f"g{n}"
    nodes += [helper.make_node("Transpose", [repeated["k"]], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", [q, "kt"], ["s0"]),
              helper.make_node("Mul", ["s0", "scale"], ["s1"]),
              helper.make_node("Add", ["s1", "mask"], ["s2"]),
              helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", repeated["v"]], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "out3"], ["y"])]
    used = {i for n in nodes for i in n.input}
    outputs = [tensor("y", F32, [batch, seq, heads * dim])]
    if k_out:
        outputs.append(tensor(k, F32, [batch, kv_heads, seq, dim]))
    return model(nodes, [tensor("x", F32, [batch, seq, emb])], outputs,
                 [i for i in inits if i.name in used], opset=17)


@pytest.mark.parametrize("batch,seq,heads,kv_heads,dim,rotary,packed", [
    (1, 9, 4, 2, 8, True, False),    # grouped-query, rotary (LLaMA, Qwen2, Mistral)
    (2, 6, 3, 1, 4, True, False),    # multi-query
    (2, 7, 2, 2, 6, True, False),    # rotary, every head its own K/V
    (1, 5, 6, 3, 4, False, False),   # grouped-query over plain projections
    (2, 5, 4, 2, 4, False, True),    # grouped-query over one packed projection, split
])
def test_grouped_query_attention_fuses(batch: int, seq: int, heads: int, kv_heads: int,
                                       dim: int, rotary: bool, packed: bool,
                                       backend_name: str) -> None:
    m = _gqa(batch, seq, heads, kv_heads, dim, rotary, packed)
    result = import_onnx(m)
    assert result.patterns["attention"] == 1
    # q and k rotated in token layout, k and v read un-repeated: no copy left around attention
    assert result.patterns["rotary"] == (2 if rotary else 0)
    assert result.patterns["grouped_kv"] == (heads != kv_heads)
    (attention,) = _attention_attrs(result)
    assert attention.get("kv_heads", heads) == kv_heads
    ops = _ops(result)
    assert "softmax" not in ops and "batch_matmul" not in ops
    assert not {"broadcast_to", "transpose", "negative", "strided_slice"} & set(ops)
    x = np.random.default_rng(seq).standard_normal((batch, seq, 32)).astype(np.float32)
    assert_matches(m, {"x": x}, backend_name)


def _attention_attrs(result: object) -> list[dict]:
    return [s for f in result.lib_doc["functions"].values()  # type: ignore[attr-defined]
            for s in f.get("ops", [f]) if s["op"] == "attention"]


@pytest.mark.parametrize("rot", [4, 6])
def test_partial_rotary_fuses(rot: int, backend_name: str) -> None:
    """GPT-NeoX's and Phi's partial rotary: the first rot of each head rotated, the rest
    concatenated back unchanged, all in one rotary op."""
    m = _gqa(2, 7, 4, 2, 8, True, rot=rot)
    result = import_onnx(m)
    assert result.patterns["rotary"] == 2 and result.patterns["grouped_kv"] == 1
    ops = _ops(result)
    assert "concatenate" not in ops and "strided_slice" not in ops
    assert all(s.get("rotary_dim") == rot for f in result.lib_doc["functions"].values()
               for s in f.get("ops", [f]) if s["op"] == "rotary")
    x = np.random.default_rng(rot).standard_normal((2, 7, 32)).astype(np.float32)
    assert_matches(m, {"x": x}, backend_name)


def test_no_rotate_half_is_no_rotary(backend_name: str) -> None:
    """concat(x_a, -x_b) * sin: not rotate_half, so the prims stay as the graph wrote them."""
    m = _gqa(1, 6, 4, 2, 8, True, flipped=True)
    result = import_onnx(m)
    assert "rotary" not in result.patterns and "negative" in _ops(result)
    x = np.random.default_rng(3).standard_normal((1, 6, 32)).astype(np.float32)
    assert_matches(m, {"x": x}, backend_name)


def test_tiled_heads_are_not_grouped(backend_name: str) -> None:
    """Tile repeats the kv heads as a whole (head h reads kv head h % kv_heads), not as
    repeat_kv does: the op's kv_heads cannot say that, so K and V are copied as read."""
    m = _gqa(2, 5, 6, 2, 4, True, tiled=True)
    result = import_onnx(m)
    assert result.patterns["attention"] == 1 and "grouped_kv" not in result.patterns
    assert all("kv_heads" not in a for a in _attention_attrs(result))
    x = np.random.default_rng(4).standard_normal((2, 5, 32)).astype(np.float32)
    assert_matches(m, {"x": x}, backend_name)


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_rotated_k_given_out_keeps_its_layout_and_values(kv_heads: int,
                                                            backend_name: str) -> None:
    """The rotated K heads are also an output (a KV cache's present): rotated by the op in
    token layout, put in (batch, kv heads, tokens, dim) for the output, bit for bit as without
    the fusions, and read there (un-repeated) by the attention."""
    m = _gqa(2, 6, 4, kv_heads, 8, True, k_out=True)
    result = import_onnx(m)
    assert result.patterns["rotary"] == 2
    assert result.patterns["grouped_kv"] == (kv_heads != 4)
    assert _ops(result).count("transpose") == 1  # k's for the output; no copy for attention
    x = np.random.default_rng(5).standard_normal((2, 6, 32)).astype(np.float32)
    assert_matches(m, {"x": x}, backend_name)
    fused = run_ours(m, {"x": x}, backend_name)
    plain = run_ours(m, {"x": x}, backend_name, disable=["rotary", "attention"])
    if backend_name == "cuda":
        # NOTE: CUDA's compiler contracts the unfused chain's x * cos + r * sin into an FMA
        # (one rounding less), the CuPy rotary kernel does not: they differ in the last bit
        # (seen on an H200, 4.8e-7 at most).
        np.testing.assert_allclose(fused[1], plain[1], rtol=2e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(fused[1], plain[1])


def test_value_heads_of_another_width_are_left_unfused(backend_name: str) -> None:
    """softmax(q k^T) v with v's heads 5 wide, q's and k's 4: the attention op has one head
    width, so the products stay as the graph wrote them."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["ctx"]),
             helper.make_node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ct", "shape"], ["y"])]
    m = model(nodes, [tensor("q", F32, [1, 2, 6, 4]), tensor("k", F32, [1, 2, 6, 4]),
                      tensor("v", F32, [1, 2, 6, 5])], [tensor("y", F32, [1, 6, 10])],
              [init("shape", np.array([1, 6, 10], np.int64))])
    assert "attention" not in dict(import_onnx(m).patterns)
    rng = np.random.default_rng(8)
    feeds = {n: rng.standard_normal((1, 2, 6, 5 if n == "v" else 4)).astype(np.float32)
             for n in "qkv"}
    assert_matches(m, feeds, backend_name)


def test_grouped_query_attention_disabled_keeps_the_products() -> None:
    result = import_onnx(_gqa(1, 9, 4, 2, 8, True), disable=["attention"])
    assert "attention" not in _ops(result) and "softmax" in _ops(result)


def test_rotary_disabled_keeps_rotate_half() -> None:
    result = import_onnx(_gqa(1, 9, 4, 2, 8, True), disable=["rotary"])
    assert "rotary" not in _ops(result) and "negative" in _ops(result)
    assert result.patterns["attention"] == 1 and result.patterns["grouped_kv"] == 1


def test_rotary_projections_are_one_product_split(backend_name: str) -> None:
    """LLaMA's q, k and v (q and k rotated, the rotated k an output as a KV cache's present):
    the attention reads none of them at offsets, so the three products become one dense and a
    split of its columns."""
    m = _gqa(1, 9, 4, 2, 8, True, k_out=True)
    result = import_onnx(m)
    assert result.patterns["products_packed"] == 3
    assert _ops(result).count("dense") == 1 and "split" in _ops(result)
    x = np.random.default_rng(3).standard_normal((1, 9, 32)).astype(np.float32)
    assert_matches(m, {"x": x}, backend_name)
    apart = import_onnx(m, disable=["sibling-pack"])
    assert "products_packed" not in apart.patterns and "split" not in _ops(apart)


def _biased_siblings(symbolic: bool) -> object:
    """Three products of x, two with per-column biases (Qwen2's q and k), one without; each
    read by an op of its own; another product reads a different input."""
    rows: list = ["batch", "seq"] if symbolic else [2, 5]
    nodes = [helper.make_node("MatMul", ["x", "wa"], ["a0"]),
             helper.make_node("Add", ["a0", "ba"], ["a"]),
             helper.make_node("MatMul", ["x", "wb"], ["b0"]),
             helper.make_node("Add", ["bb", "b0"], ["b"]),
             helper.make_node("MatMul", ["x", "wc"], ["c"]),
             helper.make_node("Relu", ["a"], ["ya"]),
             helper.make_node("Tanh", ["b"], ["yb"]),
             helper.make_node("MatMul", ["c", "wd"], ["yc"])]
    inits = [init("wa", weights(16, 12)), init("ba", weights(12)), init("wb", weights(16, 4)),
             init("bb", weights(4)), init("wc", weights(16, 4)), init("wd", weights(4, 6))]
    return model(nodes, [tensor("x", F32, rows + [16])],
                 [tensor("ya", F32, rows + [12]), tensor("yb", F32, rows + [4]),
                  tensor("yc", F32, rows + [6])], inits, opset=17)


@pytest.mark.parametrize("symbolic", [False, True])
def test_biased_projections_of_one_input_are_packed(symbolic: bool, backend_name: str) -> None:
    m = _biased_siblings(symbolic)
    result = import_onnx(m)
    assert result.patterns["products_packed"] == 3
    assert _ops(result).count("dense") == 2  # the packed one, and c's reader of its own input
    for shape in ((2, 5, 16), (1, 3, 16)) if symbolic else ((2, 5, 16),):
        x = np.random.default_rng(shape[1]).standard_normal(shape).astype(np.float32)
        assert_matches(m, {"x": x}, backend_name)
