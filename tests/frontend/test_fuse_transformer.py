"""Transformer patterns fused at import (frontend/fusion/fuse_transformer.py), judged in float64."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from onnx_builders import F32, helper, init, model, ort, run_ort, run_ours, tensor, weights

import graph_runtime as gr
from graph_runtime.frontend.importer import import_onnx

DATA = Path(__file__).resolve().parents[1] / "data" / "onnx"
# float32 GEMMs over at most ~40 terms and one softmax: a few dozen ulps of the largest value.
BOUND = 2e-5


def _assert_close(got: np.ndarray, want: np.ndarray) -> None:
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want).max()) / scale
    assert err <= BOUND, f"max|diff|/max|ref| = {err:.3g}"


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf
    return erf(x)


def _dense_gelu(approximate: str) -> tuple[object, np.ndarray, np.ndarray]:
    w = weights(13, 37)
    b = weights(37)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["h"])]
    if approximate == "none":  # BERT: x * 0.5 * (1 + erf(x / sqrt(2)))
        nodes += [helper.make_node("Div", ["h", "sqrt2"], ["d"]),
                  helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["a"]),
                  helper.make_node("Mul", ["h", "a"], ["m"]),
                  helper.make_node("Mul", ["m", "half"], ["y"])]
    elif approximate == "dynamo":  # PyTorch's dynamo exporter: x * ((1 + erf(x / sqrt(2))) * 0.5)
        nodes += [helper.make_node("Div", ["h", "sqrt2"], ["d"]),
                  helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["a"]),
                  helper.make_node("Mul", ["half", "a"], ["m"]),
                  helper.make_node("Mul", ["h", "m"], ["y"])]
    elif approximate == "bloom":  # x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
        nodes += [helper.make_node("Mul", ["h", "half"], ["hh"]),
                  helper.make_node("Mul", ["h", "c2"], ["cx"]),
                  helper.make_node("Mul", ["h", "c1"], ["kx"]),
                  helper.make_node("Mul", ["kx", "h"], ["kxx"]),
                  helper.make_node("Add", ["one", "kxx"], ["s"]),
                  helper.make_node("Mul", ["cx", "s"], ["s1"]),
                  helper.make_node("Tanh", ["s1"], ["t"]),
                  helper.make_node("Add", ["t", "one"], ["a"]),
                  helper.make_node("Mul", ["hh", "a"], ["y"])]
    elif approximate == "tanh_products":  # the cube as x * x * x, sqrt(2 / pi) first
        nodes += [helper.make_node("Mul", ["h", "half"], ["hh"]),
                  helper.make_node("Mul", ["h", "h"], ["p0"]),
                  helper.make_node("Mul", ["p0", "h"], ["p"]),
                  helper.make_node("Mul", ["c1", "p"], ["p1"]),
                  helper.make_node("Add", ["p1", "h"], ["s"]),
                  helper.make_node("Mul", ["c2", "s"], ["s1"]),
                  helper.make_node("Tanh", ["s1"], ["t"]),
                  helper.make_node("Add", ["one", "t"], ["a"]),
                  helper.make_node("Mul", ["hh", "a"], ["y"])]
    else:  # GPT-2: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
        nodes += [helper.make_node("Mul", ["h", "half"], ["hh"]),
                  helper.make_node("Pow", ["h", "three"], ["p"]),
                  helper.make_node("Mul", ["p", "c1"], ["p1"]),
                  helper.make_node("Add", ["h", "p1"], ["s"]),
                  helper.make_node("Mul", ["s", "c2"], ["s1"]),
                  helper.make_node("Tanh", ["s1"], ["t"]),
                  helper.make_node("Add", ["t", "one"], ["a"]),
                  helper.make_node("Mul", ["hh", "a"], ["y"])]
    consts = [init("w", w), init("b", b), init("sqrt2", np.float32(math.sqrt(2))),
              init("one", np.float32(1)), init("half", np.float32(0.5)),
              init("three", np.float32(3)), init("c1", np.float32(0.044715)),
              init("c2", np.float32(math.sqrt(2 / math.pi)))]
    used = {i for n in nodes for i in n.input}
    m = model(nodes, [tensor("x", F32, [3, 5, 13])], [tensor("y", F32, [3, 5, 37])],
              [c for c in consts if c.name in used])
    return m, w, b


@pytest.mark.parametrize("approximate", ["none", "dynamo", "tanh", "bloom", "tanh_products"])
def test_bias_gelu_fuses_into_the_dense_chain(approximate: str) -> None:
    m, w, b = _dense_gelu(approximate)
    result = import_onnx(m)
    tanh = approximate not in ("none", "dynamo")
    assert dict(result.patterns) == {"gelu_tanh" if tanh else "gelu": 1}
    chains = [[s["op"] for s in f.get("ops", [f])] for f in result.lib_doc["functions"].values()]
    assert ["dense", "add", "gelu"] in chains
    x = (np.random.default_rng(3).standard_normal((3, 5, 13)) * 2).astype(np.float32)
    h = x.astype(np.float64) @ w + b
    if not tanh:
        want = 0.5 * h * (1 + _erf(h / math.sqrt(2)))
    else:
        want = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    (got,) = run_ours(m, {"x": x}, "cpu")
    _assert_close(got, want)


def test_a_tanh_gelu_whose_product_is_read_elsewhere_stays_unfused() -> None:
    """Bloom's form with x * 0.044715 also a graph output: fusing would compute it twice."""
    m, _, _ = _dense_gelu("bloom")
    m.graph.output.append(tensor("kx", F32, [3, 5, 37]))
    result = import_onnx(m)
    assert "gelu_tanh" not in dict(result.patterns)


def test_decomposed_layer_norm_becomes_one_op() -> None:
    width = 37
    gamma = weights(width)
    beta = weights(width)
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
             helper.make_node("Sub", ["x", "mu"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]),
             helper.make_node("Mul", ["n", "gamma"], ["g"]),
             helper.make_node("Add", ["g", "beta"], ["y"])]
    m = model(nodes, [tensor("x", F32, [2, 3, width])], [tensor("y", F32, [2, 3, width])],
              [init("two", np.float32(2)), init("eps", np.float32(1e-5)),
               init("gamma", gamma), init("beta", beta)], opset=17)
    result = import_onnx(m)
    assert dict(result.patterns) == {"layer_norm": 1}
    assert len(result.func_names) == 1
    x = (np.random.default_rng(4).standard_normal((2, 3, width)) * 3 + 1).astype(np.float32)
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    want = (x64 - mu) / np.sqrt(var + 1e-5) * gamma + beta
    (got,) = run_ours(m, {"x": x}, "cpu")
    _assert_close(got, want)


def _attention_model(batch: int, seq: int, heads: int, dim: int, mask: str, packed: bool,
                     nan_where: bool) -> tuple[object, dict[str, np.ndarray]]:
    """BERT's exported form: projections, heads by Reshape/Transpose, sqrt(scale) on q and k,
    MatMul, additive mask, Softmax, [where(isnan)], MatMul, heads back."""
    width = heads * dim
    emb = width + 3
    rng = np.random.default_rng(batch * 100 + seq)
    ws = {n: (rng.standard_normal((emb, width)) * 0.4).astype(np.float32) for n in "qkv"}
    bs = {n: (rng.standard_normal(width) * 0.2).astype(np.float32) for n in "qkv"}
    root = np.float32(1 / math.sqrt(math.sqrt(dim)))
    inits = [init("root", root), init("shape4", np.array([batch, seq, heads, dim], np.int64)),
             init("shape3", np.array([batch, seq, width], np.int64))]
    nodes = []
    if packed:  # GPT-2: one GEMM for q, k and v, split in three
        inits += [init("wqkv", np.concatenate([ws[n] for n in "qkv"], 1)),
                  init("bqkv", np.concatenate([bs[n] for n in "qkv"])),
                  init("splits", np.array([width] * 3, np.int64))]
        nodes += [helper.make_node("MatMul", ["x", "wqkv"], ["qkv0"]),
                  helper.make_node("Add", ["qkv0", "bqkv"], ["qkv"]),
                  helper.make_node("Split", ["qkv", "splits"], ["pq", "pk", "pv"], axis=2)]
    else:
        for n in "qkv":
            inits += [init(f"w{n}", ws[n]), init(f"b{n}", bs[n])]
            nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"m{n}"]),
                      helper.make_node("Add", [f"m{n}", f"b{n}"], [f"p{n}"])]
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [f"p{n}", "shape4"], [f"r{n}"]),
                  helper.make_node("Transpose", [f"r{n}"], [f"t{n}"], perm=perm)]
    nodes += [helper.make_node("Mul", ["tq", "root"], ["sq"]),
              helper.make_node("Mul", ["tk", "root"], ["sk"]),
              helper.make_node("MatMul", ["sq", "sk"], ["scores"])]
    feeds = {"x": rng.standard_normal((batch, seq, emb)).astype(np.float32)}
    inputs = [tensor("x", F32, [batch, seq, emb])]
    logits = "scores"
    mask_value = None
    if mask == "padding":
        mask_value = np.zeros((batch, 1, 1, seq), np.float32)
        mask_value[-1, :, :, seq // 2:] = -np.inf
        if nan_where:
            mask_value[0] = -np.inf  # a sequence masked everywhere: NaN rows, zeroed
        inputs.append(tensor("mask", F32, [batch, 1, 1, seq]))
        feeds["mask"] = mask_value
    elif mask == "causal":
        mask_value = np.triu(np.full((seq, seq), -np.inf, np.float32), 1)[None, None]
        inits.append(init("mask", mask_value))
    if mask_value is not None:
        nodes.append(helper.make_node("Add", ["scores", "mask"], ["masked"]))
        logits = "masked"
    nodes.append(helper.make_node("Softmax", [logits], ["probs"], axis=-1))
    probs = "probs"
    if nan_where:
        inits.append(init("zero", np.float32(0)))
        nodes += [helper.make_node("IsNaN", ["probs"], ["isnan"]),
                  helper.make_node("Where", ["isnan", "zero", "probs"], ["clean"])]
        probs = "clean"
    nodes += [helper.make_node("MatMul", [probs, "tv"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "shape3"], ["y"])]
    m = model(nodes, inputs, [tensor("y", F32, [batch, seq, width])], inits)
    # float64 reference
    x = feeds["x"].astype(np.float64)
    proj = {n: (x @ ws[n] + bs[n]).reshape(batch, seq, heads, dim).transpose(0, 2, 1, 3)
            for n in "qkv"}
    s = proj["q"] @ proj["k"].transpose(0, 1, 3, 2) / math.sqrt(dim)
    if mask_value is not None:
        s = s + mask_value
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    if nan_where:
        p = np.where(np.isnan(p), 0.0, p)
    feeds["__want__"] = (p @ proj["v"]).transpose(0, 2, 1, 3).reshape(batch, seq, width)
    return m, feeds


@pytest.mark.parametrize("batch,seq,heads,dim,mask,packed,nan_where", [
    (2, 7, 3, 5, "padding", False, True),
    (1, 9, 1, 8, "causal", True, False),
    (2, 5, 4, 4, "none", True, False),
    (3, 11, 2, 3, "padding", False, False),
])
def test_attention_fuses_and_matches_float64(batch: int, seq: int, heads: int, dim: int,
                                             mask: str, packed: bool, nan_where: bool,
                                             backend_name: str) -> None:
    m, feeds = _attention_model(batch, seq, heads, dim, mask, packed, nan_where)
    want = feeds.pop("__want__")
    result = import_onnx(m)
    assert result.patterns["attention"] == 1
    # three projections of x: one dense writes q | k | v (frontend/fusion/fuse_qkv.py)
    assert result.patterns["qkv_packed"] == (0 if packed else 1)
    ops = [s["op"] for f in result.lib_doc["functions"].values() for s in f.get("ops", [f])]
    assert "softmax" not in ops and "batch_matmul" not in ops and "transpose" not in ops
    (got,) = run_ours(m, feeds, backend_name)
    if mask == "padding" and not nan_where:
        # the model's own semantics: a masked-out key never reaches an unmasked query
        assert np.isfinite(want).all()
    _assert_close(got, want)


@pytest.mark.parametrize("name,want", [
    ("bert_ts", {"attention": 2, "gelu": 2, "qkv_packed": 2}),
    ("bert_dynamo", {"attention": 2, "gelu": 2, "qkv_packed": 2}),
    ("gpt2_ts", {"attention": 2, "gelu_tanh": 2}),
    ("gpt2_dynamo", {"attention": 2, "gelu_tanh": 2}),
])
def test_real_exports_fuse(name: str, want: dict[str, int]) -> None:
    result = import_onnx(str(DATA / f"{name}.onnx"))
    assert dict(result.patterns) == want


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max()) / float(np.abs(want).max())


# bench/dynamic_models.py's arch() exports (hidden 64, 2 layers, 4 heads: --tiny's size), by the
# TorchScript exporter: T5's and MPNet's relative position bias and the padding mask added to the
# scores; Bloom's ALiBi added to the (batch*heads, q, k) scores, then its causal+padding mask.
@pytest.mark.parametrize("name", ["t5_tiny_encoder_ts", "mpnet_tiny_ts", "bloom_tiny_ts"])
def test_position_biased_attention_fuses_and_matches(name: str) -> None:
    path = DATA / f"{name}.onnx"
    result = import_onnx(path)
    assert result.patterns["attention"] == 2
    module = gr.create(result.graph_json, result.module())
    module.load_params(result.params)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for batch, seq in ((1, 9), (2, 13), (1, 1)):
        mask = np.ones((batch, seq), np.int64)
        mask[-1, seq * 3 // 4 + 1:] = 0  # the last sequence padded
        feeds = {"input_ids": rng.integers(0, 1000, (batch, seq)), "attention_mask": mask}
        (want,) = session.run(None, feeds)
        module.run(**feeds)
        err = _rel_err(module.get_output(0).numpy(), want)
        assert err <= 1e-5, f"{name} at ({batch}, {seq}): max|diff|/max|ref| = {err:.3g}"


def _biased_scores_model(tail: str) -> tuple[object, dict[str, np.ndarray], int]:
    """softmax(f(q k^T)) v over q, k, v inputs cut in heads by Reshape/Transpose, f as tail
    names; the attentions it should fuse (0 where the bias cannot be one additive mask)."""
    batch, seq, heads, dim = 2, 5, 3, 4
    rng = np.random.default_rng(11)
    bias = (rng.standard_normal((1, heads, seq, seq)) * 2).astype(np.float32)
    inits = [init("shape4", np.array([batch, seq, heads, dim], np.int64)),
             init("shape3", np.array([batch, seq, heads * dim], np.int64))]
    nodes = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [n, "shape4"], [f"r{n}"]),
                  helper.make_node("Transpose", [f"r{n}"], [f"t{n}"], perm=perm)]
    nodes.append(helper.make_node("MatMul", ["tq", "tk"], ["scores"]))
    fused = 0
    if tail == "bias before the scale":  # softmax(0.5 * (qk + bias) + mask): bias scaled too
        inits += [init("bias", bias), init("half", np.float32(0.5))]
        nodes += [helper.make_node("Add", ["scores", "bias"], ["biased"]),
                  helper.make_node("Mul", ["biased", "half"], ["scaled"]),
                  helper.make_node("Add", ["scaled", "mask"], ["logits"])]
        fused = 1
    elif tail == "per-head scale after the bias":  # no scalar scale: no op attr holds it
        inits += [init("bias", bias),
                  init("w", rng.uniform(0.2, 1.0, (1, heads, 1, 1)).astype(np.float32))]
        nodes += [helper.make_node("Add", ["scores", "bias"], ["biased"]),
                  helper.make_node("Mul", ["biased", "w"], ["scaled"]),
                  helper.make_node("Add", ["scaled", "mask"], ["logits"])]
    elif tail == "bias on merged head rows":  # (batch, heads*q, k): not a layout matched
        inits += [init("bias", bias.reshape(heads * seq, seq)),
                  init("merged", np.array([batch, heads * seq, seq], np.int64)),
                  init("split", np.array([batch, heads, seq, seq], np.int64))]
        nodes += [helper.make_node("Reshape", ["scores", "merged"], ["rows"]),
                  helper.make_node("Add", ["rows", "bias"], ["biased"]),
                  helper.make_node("Reshape", ["biased", "split"], ["unmerged"]),
                  helper.make_node("Add", ["unmerged", "mask"], ["logits"])]
    else:  # masked_fill: where(keep, scores, fill) is no additive term
        inits += [init("keep", rng.uniform(size=(1, heads, seq, seq)) > 0.3),
                  init("fill", np.float32(-1e4))]
        nodes += [helper.make_node("Where", ["keep", "scores", "fill"], ["filled"]),
                  helper.make_node("Add", ["filled", "mask"], ["logits"])]
    nodes += [helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "tv"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "shape3"], ["y"])]
    width = heads * dim
    inputs = [tensor(n, F32, [batch, seq, width]) for n in "qkv"]
    inputs.append(tensor("mask", F32, [batch, 1, 1, seq]))
    mask = np.zeros((batch, 1, 1, seq), np.float32)
    mask[-1, ..., -2:] = -np.inf
    feeds = {n: rng.standard_normal((batch, seq, width)).astype(np.float32) for n in "qkv"}
    feeds["mask"] = mask
    return model(nodes, inputs, [tensor("y", F32, [batch, seq, width])], inits), feeds, fused


@pytest.mark.parametrize("tail", ["bias before the scale", "per-head scale after the bias",
                                  "bias on merged head rows", "masked_fill"])
def test_a_bias_fuses_only_where_one_scaled_mask_holds_it(tail: str, backend_name: str) -> None:
    m, feeds, fused = _biased_scores_model(tail)
    assert import_onnx(m).patterns.get("attention", 0) == fused
    (got,) = run_ours(m, feeds, backend_name)
    (want,) = run_ort(m, feeds)
    assert _rel_err(got, want) <= 1e-5


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
def test_scores_divided_by_zero_are_left_to_the_prims(backend_name: str) -> None:
    """softmax(q k^T / 0) v: no scale attr holds 1/0 (the match raised ZeroDivisionError out of
    the importer); the prims give ONNX Runtime's infinities and NaNs."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "zero"], ["d"]),
             helper.make_node("Softmax", ["d"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    shapes = {"q": [2, 3, 4], "kt": [2, 4, 3], "v": [2, 3, 4]}
    m = model(nodes, [tensor(n, F32, s) for n, s in shapes.items()],
              [tensor("y", F32, [2, 3, 4])], [init("zero", np.float32(0))])
    assert "attention" not in import_onnx(m).patterns
    feeds = {n: weights(*s) for n, s in shapes.items()}
    (got,) = run_ours(m, feeds, backend_name)
    (want,) = run_ort(m, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, equal_nan=True)


# LLaMA's tiny exports (bench/dynamic_models.py --tiny: 4 heads of 16 reading 2 kv heads, 2
# layers), the dims by name and the bindings each runs at (position ids after past).
LLAMA = {"llama_tiny_ts": [{"batch": 1, "seq": 9}, {"batch": 2, "seq": 17},
                           {"batch": 3, "seq": 1}],
         "llama_tiny_dynamo": [{"s72": 1, "s43": 1, "s53": 9}, {"s72": 2, "s43": 2, "s53": 17}],
         "llama_tiny_kv_ts": [{"batch": 1, "seq": 1, "past": 5, "total": 6},
                              {"batch": 2, "seq": 7, "past": 0, "total": 7},
                              {"batch": 1, "seq": 3, "past": 20, "total": 23}]}


def _llama_feeds(session: object, env: dict[str, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(sum(env.values()))
    feeds = {}
    for i in session.get_inputs():  # type: ignore[attr-defined]
        shape = [env[d] if isinstance(d, str) else d for d in i.shape]
        if "int64" not in i.type:  # the KV cache
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
        elif "mask" in i.name:
            feeds[i.name] = np.ones(shape, np.int64)
            feeds[i.name][0, :min(2, shape[-1] - 1)] = 0  # row 0 padded on the left
        elif "position" in i.name:
            past = env.get("past", 0)
            feeds[i.name] = np.broadcast_to(np.arange(past, past + shape[-1]), shape).copy()
        else:
            feeds[i.name] = rng.integers(0, 100, shape)
    return feeds


def _ops_of(result: object) -> list[dict]:
    """The ops of every node of the graph, in order (a function as often as nodes call it)."""
    import json
    graph = result.graph_json  # type: ignore[attr-defined]
    nodes = (json.loads(graph) if isinstance(graph, str) else graph)["nodes"]
    functions = result.lib_doc["functions"]  # type: ignore[attr-defined]
    called = [functions[n["attrs"]["func_name"]] for n in nodes if n["op"] == "tvm_op"]
    return [s for f in called for s in f.get("ops", [f])]


def _run(result: object, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    module = gr.create(result.graph_json, result.module())  # type: ignore[attr-defined]
    module.load_params(result.params)  # type: ignore[attr-defined]
    module.run(**feeds)
    return [module.get_output(i).numpy() for i in range(module.get_num_outputs())]


@pytest.mark.parametrize("name", list(LLAMA))
def test_llama_rotary_and_grouped_kv_fuse_and_match(name: str) -> None:
    """q and k rotated by the rotary op in token layout and k/v read un-repeated (kv_heads 2)
    by the attention op (a KV cache's presents in their own layout): no slice/neg/concat,
    transpose or repeated-heads copy left around it,
    imported with symbolic dims and at one shape, both as ONNX Runtime computes them. With the
    KV cache the rotated k also makes the present output, in its own layout: the presents bit
    for bit as without the rotary pass (and, before any attention output reaches them, without
    the attention pass: its kv heads are read, never rewritten)."""
    path = DATA / f"{name}.onnx"
    kv = "kv" in name
    symbolic = import_onnx(path)
    # each layer's q, k and v products packed into one (sibling-pack)
    want_patterns = {"silu": 2, "rms_norm": 5, "rotary": 4, "attention": 2, "grouped_kv": 2,
                     "gated_mlp_packed": 2, "products_packed": 6}
    if kv:  # each layer's split, rotaries, head transposes and joins as one kv_append
        want_patterns["kv_append"] = 2
    # imported once, the mask's index arithmetic (and without position_ids, the positions')
    # is index_expr ops; at one shape it is folded
    indexed = {"llama_tiny_ts": 2, "llama_tiny_dynamo": 4, "llama_tiny_kv_ts": 1}[name]
    assert dict(symbolic.patterns) == {**want_patterns, "index_expr": indexed}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    if kv:
        no_rotary = import_onnx(path, disable=["rotary"])
        plain = import_onnx(path, disable=["rotary", "attention"])
    for env in LLAMA[name]:
        feeds = _llama_feeds(session, env)
        want = session.run(None, feeds)
        results = [symbolic]
        if env is LLAMA[name][0]:
            results.append(import_onnx(path, shape={k: list(v.shape) for k, v in feeds.items()}))
            assert dict(results[1].patterns) == want_patterns
        for result in results:
            ops = [s["op"] for s in _ops_of(result)]
            attentions = [s for s in _ops_of(result) if s["op"] == "attention"]
            assert [(a["num_heads"], a.get("kv_heads")) for a in attentions] == [(4, 2)] * 2
            assert ops.count("rotary") == (0 if kv else 4) and "negative" not in ops
            assert ops.count("kv_append") == (2 if kv else 0)
            assert "strided_slice" not in ops
            # each MLP's gate and up products as one, its SiLU and product as glu
            assert ops.count("glu") == 2
            # with a KV cache, the new tokens' k and v heads put in the presents' layout by
            # kv_append; the presents read in place
            assert "transpose" not in ops
            assert "split" not in ops or not kv
            got = _run(result, feeds)
            for i, expected in enumerate(want):
                err = float(np.abs(got[i] - expected).max())
                assert err <= 1e-5, f"{name} {env} output {i}: max|diff| {err:.3g}"
        if kv:  # outputs: logits, then each layer's key and value
            presents = _run(symbolic, feeds)[1:]
            for fused, unfused in zip(presents, _run(no_rotary, feeds)[1:]):
                np.testing.assert_array_equal(fused, unfused)
            # the first layer's, before any attention output reaches them
            for fused, unfused in zip(presents[:2], _run(plain, feeds)[1:3]):
                np.testing.assert_array_equal(fused, unfused)
