"""Gated MLPs as one product and the glu op: act(x W_gate) * (x W_up) (LLaMA, Qwen2, Mistral,
T5 v1.1's gated GELU) and Phi-3's packed product split in two halves.

The two products of one input become one product twice as wide (the weights, and biases where
there are any, side by side), as ONNX Runtime packs an attention's Q, K and V; the glu op then
reads both halves of its output in one pass, in place of the activation and the multiply (a
product's compiled tail reading the other product's output before). A packed product's split,
activation and multiply (Phi-3's gate_up_proj, two NumPy passes and a copy before) become the
glu op alone. Each intermediate must be read by the pattern alone.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ..ir import Prim, Value
from ..symdim import same_shape
from .fuse_qkv import live, projection
from .pattern import PatternGraph, last_axis_slice, new_prim, spliced

ACTIVATIONS = ("silu", "gelu", "relu", "sigmoid")


def _activation(g: PatternGraph, v: Value, reader: Prim) -> Prim | None:
    """v's producer when it is a glu activation of one input read by reader alone."""
    p = v.producer
    if p is None or p.op not in ACTIVATIONS or g.sole(v) is not reader or len(p.inputs) != 1:
        return None
    return p


def _act_attrs(act: Prim) -> dict[str, Any]:
    attrs: dict[str, Any] = {"activation": act.op}
    if act.op == "gelu":
        attrs["approximate"] = str(act.attrs.get("approximate", "none"))
    return attrs


def _two_products(g: PatternGraph, p: Prim, act: Prim, up: Value) -> list[Prim] | None:
    """dense(x, W_gate | W_up) [+ biases] and glu writing p's output, for act(gate) * up where
    gate and up are projections of one x."""
    gate = projection(g, act.inputs[0], act)
    other = projection(g, up, p)
    if gate is None or other is None or gate[0] is not other[0] \
            or gate[1].shape != other[1].shape:
        return None
    x = gate[0]
    weight = np.concatenate([gate[1], other[1]], axis=0)
    name = act.inputs[0].name
    w = Value(f"{name}_gated_weight", weight.shape, x.dtype, const=weight)
    made = [new_prim("dense", [x, w], {}, None, p.origin)]
    if gate[2].any() or other[2].any():
        bias = np.concatenate([gate[2], other[2]]).astype(x.dtype)
        b = Value(f"{name}_gated_bias", bias.shape, x.dtype, const=bias)
        made.append(new_prim("add", [made[-1].outputs[0], b], {}, None, p.origin))
    glu = new_prim("glu", [made[-1].outputs[0]], {**_act_attrs(act), "gate": "first"},
                   p.outputs[0], p.origin)
    return made + [glu]


def _half(g: PatternGraph, v: Value, reader: Prim) -> tuple[Value, int] | None:
    """(y, 0 or 1) when v is the first or second half of y's last axis (a strided_slice of
    that axis, or a split of it in two, read by reader alone); else None."""
    s = v.producer
    if s is None or g.sole(v) is not reader:
        return None
    if s.op == "split":  # two pieces of the last axis, each half of it
        y = s.inputs[0]
        width = y.shape[-1] if y.rank else None
        if not isinstance(width, int) or width % 2 or len(s.outputs) != 2 \
                or int(s.attrs.get("axis", 0)) % y.rank != y.rank - 1 \
                or not all(same_shape(tuple(o.shape), (*y.shape[:-1], width // 2))
                           for o in s.outputs):
            return None
        return y, s.outputs.index(v)
    sliced = last_axis_slice(v)
    if sliced is None:
        return None
    y, lo, hi = sliced
    half = y.shape[-1] // 2
    if y.shape[-1] % 2 or hi - lo != half or lo not in (0, half):
        return None
    return y, lo // half


def _packed_product(g: PatternGraph, p: Prim, act: Prim, up: Value) -> list[Prim] | None:
    """glu writing p's output, for act(y's one half) * y's other half."""
    gate = _half(g, act.inputs[0], act)
    other = _half(g, up, p)
    if gate is None or other is None or gate[0] is not other[0] or gate[1] == other[1]:
        return None
    attrs = {**_act_attrs(act), "gate": "first" if gate[1] == 0 else "second"}
    return [new_prim("glu", [gate[0]], attrs, p.outputs[0], p.origin)]


def fuse_gated(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with each gated MLP's activation and multiply as glu (its two products packed into
    one), and how many of each form were found."""
    g = PatternGraph(live(prims, outputs), outputs)
    before: dict[int, list[Prim]] = {}
    found: Counter = Counter()
    for p in prims:
        if p.op != "multiply" or len(p.inputs) != 2 or p.inputs[0] is p.inputs[1] \
                or not same_shape(tuple(p.inputs[0].shape), tuple(p.inputs[1].shape)) \
                or not same_shape(tuple(p.inputs[0].shape), tuple(p.outputs[0].shape)):
            continue
        for a, b in (p.inputs, p.inputs[::-1]):
            act = _activation(g, a, p)
            if act is None:
                continue
            try:
                made = _two_products(g, p, act, b)
                kind = "gated_mlp_packed"
                if made is None:
                    made = _packed_product(g, p, act, b)
                    kind = "gated_mlp_split"
            except ValueError:  # the op's own check refused the shapes: no match
                made = None
            if made is not None:
                # the activation's and the products' prims go: nothing else reads them
                before[id(p)] = made
                found[kind] += 1
                break
    if not before:
        return prims, Counter()
    return spliced(prims, before), found
