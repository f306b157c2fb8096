"""Q/K/V projections of one input packed into one dense at import (frontend/fusion/fuse_qkv.py)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from graph_runtime.frontend.fusion.fuse_qkv import pack_qkv
from graph_runtime.frontend.ir import Value
from graph_runtime.frontend.fusion.pattern import new_prim
from graph_runtime.lib.registry import load_standard_ops

load_standard_ops()
ATTRS = {"num_heads": 2, "head_dim": 3, "scale": 0.5, "q_offset": 0, "k_offset": 0,
         "v_offset": 0, "nan_to_zero": False}


def _attention(inputs: list[Value], bias: tuple[bool, bool, bool] = (True, True, True)):
    """Prims for attention over three projections (dense [+ bias]) of inputs[i], and outputs."""
    rng = np.random.default_rng(0)
    prims, projected = [], []
    for i, (x, has_bias) in enumerate(zip(inputs, bias)):
        w = Value(f"w{i}", (6, 8), "float32", const=rng.standard_normal((6, 8), np.float32))
        dense = new_prim("dense", [x, w], {}, None, "proj")
        prims.append(dense)
        out = dense.outputs[0]
        if has_bias:
            b = Value(f"b{i}", (6,), "float32", const=rng.standard_normal(6, np.float32))
            add = new_prim("add", [b, out], {}, None, "proj")  # the bias first, as BERT's
            prims.append(add)
            out = add.outputs[0]
        projected.append(out)
    att = new_prim("attention", projected, dict(ATTRS), None, "att")
    return prims + [att], [att.outputs[0]], projected


def test_three_projections_of_one_input_become_one_dense() -> None:
    x = Value("x", (2, 5, 8), "float32", is_input=True)
    prims, outputs, _ = _attention([x, x, x], bias=(True, False, True))
    result, packed = pack_qkv(prims, outputs)
    assert packed == Counter(qkv_packed=1)
    dense, add, att = result[-3:]
    assert dense.op == "dense" and dense.inputs[0] is x and add.op == "add"
    want_w = np.concatenate([p.inputs[1].const for p in prims if p.op == "dense"])
    np.testing.assert_array_equal(dense.inputs[1].const, want_w)
    want_b = np.concatenate([prims[1].inputs[0].const, np.zeros(6, np.float32),
                             prims[4].inputs[0].const])
    np.testing.assert_array_equal(add.inputs[1].const, want_b)
    assert att.inputs[:3] == [add.outputs[0]] * 3 and att.outputs == outputs
    assert (att.attrs["q_offset"], att.attrs["k_offset"], att.attrs["v_offset"]) == (0, 6, 12)


def test_projections_of_different_inputs_stay() -> None:
    x = Value("x", (2, 5, 8), "float32", is_input=True)
    memory = Value("memory", (2, 5, 8), "float32", is_input=True)  # cross-attention
    prims, outputs, _ = _attention([x, memory, memory])
    assert pack_qkv(prims, outputs) == (prims, Counter())


def test_a_projection_read_elsewhere_stays() -> None:
    x = Value("x", (2, 5, 8), "float32", is_input=True)
    prims, outputs, projected = _attention([x, x, x])
    assert pack_qkv(prims, outputs + [projected[1]]) == (prims, Counter())


def test_a_take_from_a_symbolic_array_is_a_function_of_its_own() -> None:
    """fuse_ops.fuse: a take whose data has symbolic dims (a decoder's padding-mask gather)
    neither joins the cast before it nor takes the reshapes after it, so each function takes
    any shape; the same prims at static shapes stay one chain."""
    from graph_runtime.frontend.fusion.fuse_ops import fuse
    from graph_runtime.frontend.symdim import Sym

    def groups(rows: object) -> list[list[str]]:
        mask = Value("mask", (rows,), "int64", is_input=True)
        index = Value("index", (rows, 1), "int64", is_input=True)
        cast = new_prim("cast", [mask], {"dtype": "bool"}, None, "mask")
        take = new_prim("take", [cast.outputs[0], index], {"axis": 0, "mode": "wrap"}, None,
                        "mask")
        flat = new_prim("reshape", [take.outputs[0]], {"newshape": [rows]}, None, "mask")
        return [[p.op for p in g.prims] for g in fuse([cast, take, flat], flat.outputs)]

    assert groups(Sym.name("total")) == [["cast"], ["take"], ["reshape"]]
    assert groups(7) == [["cast", "take", "reshape"]]
