"""A DynamicQuantizeLinear read by one integer matmul alone merged into it (dense_dynamic_scaled).

quantize_dynamic writes each float activation's quantization as its own node: once the matmul's
cast, scales and bias are one dense_integer_scaled (fuse_integer.py) and an attention's three
projections one product (fuse_qkv.py), every dynamic_quantize feeds exactly one of them. The op
runs the same two kernels in one call (lib/ops/quantized_integer.py), so the values are the
ones the two nodes gave; only the node and its three small results go.
"""
from __future__ import annotations

from collections import Counter

from ..ir import Prim
from .fuse_qkv import live
from .pattern import PatternGraph, new_prim


def _merged(g: PatternGraph, quantize: Prim) -> Prim | None:
    """The dense_dynamic_scaled replacing the one dense_integer_scaled reading all three of
    quantize's results (as its x, x_zero and x_scale) and nothing else reading them."""
    y, scale, zero = quantize.outputs
    dense = g.sole(y)
    if dense is None or dense.op != "dense_integer_scaled" or g.sole(scale) is not dense \
            or g.sole(zero) is not dense:
        return None
    x, x_zero, w, x_scale, w_scale, bias = dense.inputs
    if x is not y or x_zero is not zero or x_scale is not scale:
        return None
    return new_prim("dense_dynamic_scaled", [quantize.inputs[0], w, w_scale, bias], {},
                    dense.outputs[0], dense.origin)


def fuse_dynamic_quantize(prims: list[Prim], outputs: list) -> tuple[list[Prim], Counter]:
    """prims with each such pair merged (the dynamic_quantize left unread, for emission to
    drop), and how many."""
    # the prims earlier fusions left unread (projections fuse_qkv.py packed) read y too
    g = PatternGraph(live(prims, outputs), outputs)
    replace: dict[int, Prim] = {}
    for p in prims:
        if p.op == "dynamic_quantize" and len(p.outputs) == 3:
            merged = _merged(g, p)
            if merged is not None:
                replace[id(g.sole(p.outputs[0]))] = merged
    return [replace.get(id(p), p) for p in prims], Counter(dense_dynamic_scaled=len(replace))
