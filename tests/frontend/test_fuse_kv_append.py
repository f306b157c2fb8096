"""frontend/fusion/fuse_kv_append.py: a decoder layer's split q, k, v, rotaries, head transposes
and KV-cache joins as one kv_append, on the prims the importer makes, at fixed and symbolic
sizes; a pattern whose parts are read elsewhere, or of another layout, is left as it is. The
whole decoder (Hugging Face's LLaMA with past_key_values) against ONNX Runtime is in
test_fuse_transformer.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import graph_runtime as gr
from graph_runtime.frontend.fusion.fuse_kv_append import fuse_kv_append
from graph_runtime.frontend.importer import import_onnx
from graph_runtime.frontend.ir import Prim, Value
from graph_runtime.frontend.symdim import Sym

DATA = Path(__file__).resolve().parents[1] / "data" / "onnx"


def _value(name: str, shape: tuple, producer: Prim | None = None) -> Value:
    return Value(name, tuple(shape), "float32", producer=producer)


def _prim(op: str, attrs: dict, inputs: list[Value], shapes: list[tuple], name: str) -> Prim:
    p = Prim(op, attrs, inputs, [], name)
    p.outputs = [_value(f"{name}{k}", s, p) for k, s in enumerate(shapes)]
    return p


def _layer(batch: Any, tokens: Any, past: Any, qh: int = 4, kvh: int = 2, dim: int = 8,
           order: str = "qkv", v_axes: tuple = (0, 2, 1, 3)
           ) -> tuple[list[Prim], list[Value], dict[str, Value]]:
    """The prims one LLaMA layer's projection lowers to, parts of the split in order."""
    widths = {"q": qh * dim, "k": kvh * dim, "v": kvh * dim}
    x = _value("qkv", (batch, tokens, sum(widths.values())))
    x.is_input = True
    past_k, past_v = (_value(n, (batch, kvh, past, dim)) for n in ("past_k", "past_v"))
    cos, sin = (_value(n, (1, tokens, dim)) for n in ("cos", "sin"))
    for v in (past_k, past_v, cos, sin):
        v.is_input = True
    bounds = np.cumsum([widths[r] for r in order])[:-1].tolist()
    split = _prim("split", {"indices_or_sections": bounds, "axis": 2}, [x],
                  [(batch, tokens, widths[r]) for r in order], "split")
    part = dict(zip(order, split.outputs))
    prims = [split]
    rq = _prim("rotary", {"num_heads": qh, "head_dim": dim}, [part["q"], cos, sin],
               [(batch, tokens, qh * dim)], "rq")
    rk = _prim("rotary", {"num_heads": kvh, "head_dim": dim}, [part["k"], cos, sin],
               [(batch, tokens, kvh * dim)], "rk")
    prims += [rq, rk]
    presents = []
    for name, src, past, axes in (("k", rk.outputs[0], past_k, (0, 2, 1, 3)),
                                  ("v", part["v"], past_v, v_axes)):
        shaped = (batch, tokens, kvh, dim)
        r = _prim("reshape", {"newshape": list(shaped)}, [src], [shaped], f"r{name}")
        moved = tuple(shaped[a] for a in axes)
        t = _prim("transpose", {"axes": list(axes)}, [r.outputs[0]], [moved], f"t{name}")
        c = _prim("concatenate", {"axis": 2}, [past, t.outputs[0]],
                  [(batch, kvh, past.shape[2] + tokens, dim)], f"c{name}")
        prims += [r, t, c]
        presents.append(c.outputs[0])
    outputs = [rq.outputs[0], *presents]
    return prims, outputs, {"x": x, "past_k": past_k, "past_v": past_v, "cos": cos, "sin": sin}


@pytest.mark.parametrize("order", ["qkv", "vkq"])
@pytest.mark.parametrize("symbolic", [False, True])
def test_the_layer_becomes_one_kv_append(order: str, symbolic: bool) -> None:
    dims = tuple(Sym({(n,): 1}) for n in ("batch", "seq", "past")) if symbolic else (2, 3, 5)
    prims, outputs, ins = _layer(*dims, order=order)
    fused, counts = fuse_kv_append(prims, outputs)
    assert counts == {"kv_append": 1} and [p.op for p in fused] == ["kv_append"]
    p = fused[0]
    assert p.inputs == [ins["x"], ins["past_k"], ins["past_v"], ins["cos"], ins["sin"]]
    assert p.outputs == outputs and all(v.producer is p for v in outputs)
    start = {r: sum({"q": 32, "k": 16, "v": 16}[o] for o in order[:order.index(r)])
             for r in "qkv"}
    assert p.attrs == {"q_heads": 4, "kv_heads": 2, "head_dim": 8, "rotary_dim": 8,
                       "q_offset": start["q"], "k_offset": start["k"], "v_offset": start["v"]}


def _sliced_layer(tokens: Any, past: Any) -> tuple[list[Prim], list[Value], Value]:
    """_layer as Phi-3 packs it: no split; q and k rotated at their column offsets of the
    one product, v a last-axis slice of it."""
    prims, outputs, ins = _layer(1, tokens, past)
    split, rq, rk = prims[:3]
    x = split.inputs[0]
    rq.inputs[0], rq.attrs["offset"] = x, 0
    rk.inputs[0], rk.attrs["offset"] = x, 32
    v = split.outputs[2]
    s = Prim("strided_slice", {"axes": [2], "begin": [48], "end": [64], "strides": [1]}, [x],
             [v], "slice")
    v.producer = s
    return [s, rq, rk] + prims[3:], outputs, x


@pytest.mark.parametrize("symbolic", [False, True])
def test_rotaries_at_offsets_and_a_slice_become_one_kv_append(symbolic: bool) -> None:
    dims = tuple(Sym({(n,): 1}) for n in ("seq", "past")) if symbolic else (3, 5)
    prims, outputs, x = _sliced_layer(*dims)
    fused, counts = fuse_kv_append(prims, outputs)
    assert counts == {"kv_append": 1} and [p.op for p in fused] == ["kv_append"]
    assert fused[0].inputs[0] is x and fused[0].outputs == outputs
    assert (fused[0].attrs["q_offset"], fused[0].attrs["k_offset"],
            fused[0].attrs["v_offset"]) == (0, 32, 48)
    # the product read by something else besides: the slices and rotaries stay
    prims, outputs, x = _sliced_layer(*dims)
    other = _prim("relu", {}, [x], [tuple(x.shape)], "relu")
    kept, counts = fuse_kv_append(prims + [other], outputs + other.outputs)
    assert not counts and kept == prims + [other]


def test_a_part_read_elsewhere_or_other_heads_are_left() -> None:
    prims, outputs, _ = _layer(1, 1, 4)
    v = prims[0].outputs[2]
    reader = _prim("relu", {}, [v], [tuple(v.shape)], "relu")
    kept, counts = fuse_kv_append(prims + [reader], outputs + reader.outputs)
    assert not counts and kept == prims + [reader]
    # v's heads moved some other way than head-major: no join of this layout
    prims, outputs, _ = _layer(1, 1, 4, v_axes=(0, 2, 3, 1))
    prims[-1].attrs["axis"] = 3
    kept, counts = fuse_kv_append(prims, outputs)
    assert not counts and kept == prims


def test_a_past_of_another_dtype_is_left() -> None:
    """The op takes one float dtype throughout: a float64 past beside float32 projections
    (which the joins would refuse too) is no match, not an import error."""
    prims, outputs, ins = _layer(1, 1, 4)
    ins["past_v"].dtype = "float64"
    kept, counts = fuse_kv_append(prims, outputs)
    assert not counts and kept == prims


def test_disabled_the_decoder_keeps_its_steps_and_the_same_values(backend_name: str) -> None:
    """Hugging Face's LLaMA with a KV cache, imported once with the pass and once without, on
    each device (kv_append's own kernel there): every output (logits and presents) the same,
    at a prompt and two decode steps (bit for bit on the CPU)."""
    path = DATA / "llama_tiny_kv_ts.onnx"
    fused, plain = import_onnx(path), import_onnx(path, disable=["kv-append"])
    assert fused.patterns["kv_append"] == 2 and "kv_append" not in plain.patterns
    device = gr.device(backend_name)
    modules = []
    for result in (fused, plain):
        m = gr.create(result.graph_json, result.module(), device)
        m.load_params(result.params)
        modules.append(m)
    rng = np.random.default_rng(3)
    past, heads, dim = 0, 2, 16
    for tokens in (6, 1, 1):
        feeds = {"input_ids": rng.integers(0, 100, (1, tokens)),
                 "attention_mask": np.ones((1, past + tokens), np.int64),
                 "position_ids": np.arange(past, past + tokens)[None]}
        for name in [f"past_key_values.{i}.{kv}" for i in (0, 1) for kv in ("key", "value")]:
            feeds[name] = rng.standard_normal((1, heads, past, dim)).astype(np.float32)
        got = [m.run_with(**feeds) for m in modules]
        for a, b in zip(*got):
            if backend_name == "cpu":
                np.testing.assert_array_equal(a, b)
            else:  # the attention and products there may sum in another order
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        past += tokens
    placed = [d for _, _, fn, d in modules[0].placement() if "kv_append" in (fn or "")]
    assert placed == [device] * 2  # (a symbolic module places its nodes at its first run)
