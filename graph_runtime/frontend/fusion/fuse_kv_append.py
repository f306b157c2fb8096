"""A decoder's packed q, k, v projection and its KV cache as one kv_append op (ops/kv_append.py).

A LLaMA-style decoder exported with past_key_values (Hugging Face's code: Optimum's inputs and
outputs) lowers, once sibling-pack has packed its projections, to

    split(qkv) -> q, k, v
    rotary(q, cos, sin)                                   -> the attention's q
    rotary(k, cos, sin) -> reshape (b, t, kv_heads, d) -> transpose (0, 2, 1, 3)
        -> concatenate([past_k, .], axis 2)               -> present_k
    v -> reshape (b, t, kv_heads, d) -> transpose (0, 2, 1, 3)
        -> concatenate([past_v, .], axis 2)               -> present_v

seven small steps a layer. In a decode step each costs 4-8 us in a run (the weights streaming
through the caches between them) and, at every new past length, the runtime re-points the
joins and the attention reading them; here they become one step whose kernel takes any length.
A model packing q, k and v itself (Phi-3's qkv_proj) takes them as last-axis slices, or as
rotaries at column offsets, of the one product: the same op serves.
The outputs are the same values (their readers, graph outputs among them, are unchanged); the
split's parts and the rotated k are read nowhere else.

Runs after sibling-pack (which makes the split) and the attention pass.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from ...errors import LibraryError
from ...lib.registry import load_standard_ops
from .. import sym_infer
from ..ir import Prim, Unsupported, Value
from ..symdim import is_sym
from .pattern import PatternGraph, last_axis_slice

HEAD_MAJOR = [0, 2, 1, 3]


def _last_axis(p: Prim) -> bool:
    axis = p.attrs.get("axis")
    return axis in (-1, p.inputs[0].rank - 1)


def _heads_joined(g: PatternGraph, v: Value, kv_heads: int, dim: int
                  ) -> tuple[Value, Prim, list[Prim]] | None:
    """(the past, the join, the prims from v to it) where v (batch, tokens, kv_heads * dim) is
    reshaped to (batch, tokens, kv_heads, dim), transposed head-major and joined onto a past on
    axis 2, each read once; else None."""
    reshape = g.sole(v)
    if reshape is None or reshape.op != "reshape":
        return None
    r = reshape.outputs[0]
    if r.rank != 4 or tuple(r.shape[2:]) != (kv_heads, dim) or (
            r.shape[0] is not v.shape[0] and r.shape[0] != v.shape[0]):
        return None
    transpose = g.sole(r)
    if transpose is None or transpose.op != "transpose" or \
            list(transpose.attrs.get("axes") or []) != HEAD_MAJOR:
        return None
    join = g.sole(transpose.outputs[0])
    if join is None or join.op != "concatenate" or join.attrs.get("axis") not in (2, -2) \
            or len(join.inputs) != 2 or join.inputs[1] is not transpose.outputs[0]:
        return None
    past = join.inputs[0]
    if past is transpose.outputs[0] or past.rank != 4:
        return None
    return past, join, [reshape, transpose, join]


def _rotary_of(g: PatternGraph, v: Value) -> Prim | None:
    """The rotary op reading v as its one reader, else None."""
    p = g.sole(v)
    if p is None or p.op != "rotary" or p.inputs[0] is not v:
        return None
    return p


def _parts(g: PatternGraph, x: Value) -> list[tuple[Value, int, list[Prim]]] | None:
    """The parts of packed x its readers take, as (value, its first column in x, the prims
    taking it): a split of the last axis (its outputs; the split with the first), and last-axis
    slices and rotaries reading x at a column offset (Phi-3's qkv_proj); None where a reader is
    none of those or a split keeps another output."""
    parts: list[tuple[Value, int, list[Prim]]] = []
    for reader in g.readers.get(id(x), []):
        if reader.op == "split" and _last_axis(reader) and reader.inputs[0] is x:
            at = 0
            for k, out in enumerate(reader.outputs):
                parts.append((out, at, [reader] if k == 0 else []))
                at += int(out.shape[-1])
        elif reader.op == "rotary" and reader.inputs[0] is x:
            parts.append((x, 0, []))  # the rotary reads its own offset
        else:
            sliced = last_axis_slice(reader.outputs[0]) if reader.outputs else None
            if sliced is None or sliced[0] is not x:
                return None
            parts.append((reader.outputs[0], sliced[1], [reader]))
    return parts


def _match(g: PatternGraph, x: Value) -> tuple[Prim, list[Prim]] | None:
    """The kv_append prim replacing the prims that take packed x apart and into a KV cache,
    and the prims it replaces."""
    if x.rank != 3 or x.dtype not in ("float32", "float64") or is_sym(x.shape[-1]):
        return None
    parts = _parts(g, x)
    if parts is None:
        return None
    roles: dict[str, Any] = {}
    seen: set[int] = set()
    for part, offset, taking in parts:
        if part is x:  # the rotaries reading x at their offsets
            rotaries = [r for r in g.readers.get(id(x), []) if r.op == "rotary"]
            rotary = next((r for r in rotaries if id(r) not in seen), None)
            if rotary is None:
                return None
            seen.add(id(rotary))
        else:
            rotary = _rotary_of(g, part)
        if rotary is not None:
            offset += rotary.attrs.get("offset", 0)
            joined = _heads_joined(g, rotary.outputs[0], rotary.attrs["num_heads"],
                                   rotary.attrs["head_dim"])
            role = "k" if joined is not None else "q"
        else:
            joined, role = None, "v"
        if role in roles:
            return None
        roles[role] = (part, offset, rotary, joined, taking)
    if set(roles) != {"q", "k", "v"}:
        return None
    _, q_off, q_rot, _, q_taking = roles["q"]
    _, k_off, k_rot, (past_k, k_join, k_prims), k_taking = roles["k"]
    v_part, v_off, _, _, v_taking = roles["v"]
    kv_heads, dim = k_rot.attrs["num_heads"], k_rot.attrs["head_dim"]
    rot = k_rot.attrs.get("rotary_dim", dim)
    if q_rot.inputs[1:] != k_rot.inputs[1:] or q_rot.attrs["head_dim"] != dim \
            or q_rot.attrs.get("rotary_dim", dim) != rot or v_part.shape[-1] != kv_heads * dim:
        return None
    v_joined = _heads_joined(g, v_part, kv_heads, dim)
    if v_joined is None:
        return None
    past_v, v_join, v_prims = v_joined
    cos, sin = k_rot.inputs[1:]
    attrs = {"q_heads": q_rot.attrs["num_heads"], "kv_heads": kv_heads, "head_dim": dim,
             "rotary_dim": rot, "q_offset": q_off, "k_offset": k_off, "v_offset": v_off}
    inputs = [x, past_k, past_v, cos, sin]
    outputs = [q_rot.outputs[0], k_join.outputs[0], v_join.outputs[0]]
    try:
        specs = sym_infer.infer("kv_append", [v.spec for v in inputs], attrs)
    except (LibraryError, Unsupported):  # the op refuses them (a past of another dtype)
        return None
    if [(tuple(s.shape), str(s.dtype)) for s in specs] != [(tuple(v.shape), v.dtype)
                                                           for v in outputs]:
        return None
    fused = Prim("kv_append", attrs, inputs, outputs, k_join.origin)
    return fused, [*q_taking, *k_taking, *v_taking, q_rot, k_rot, *k_prims, *v_prims]


def fuse_kv_append(prims: list[Prim], outputs: list[Value]) -> tuple[list[Prim], Counter]:
    """prims with each decoder layer's split, rotaries, head transposes and KV joins as one
    kv_append, and how many were fused."""
    load_standard_ops()  # (sym_infer asks the op table)
    g = PatternGraph(prims, outputs)
    index = {id(p): i for i, p in enumerate(prims)}
    replaced: set[int] = set()
    after: dict[int, list[Prim]] = {}  # position -> the fused prims placed after it
    count = 0
    packed: dict[int, Value] = {}  # the values taken apart: a split's or a rotary's input
    for p in prims:
        if p.op in ("split", "rotary") and p.inputs:
            packed.setdefault(id(p.inputs[0]), p.inputs[0])
    for x in packed.values():
        try:
            found = _match(g, x)
        except (ValueError, TypeError):  # a symbolic question the import cannot answer
            found = None
        if found is None:
            continue
        fused, gone = found
        gone_ids = {id(q) for q in gone}
        if gone_ids & replaced:
            continue
        # after every input's producer, before every reader of an output
        made = max((index[id(v.producer)] for v in fused.inputs
                    if v.producer is not None and id(v.producer) in index), default=-1)
        reads = [index[id(r)] for v in fused.outputs for r in g.readers.get(id(v), [])
                 if id(r) not in gone_ids]
        if reads and min(reads) <= made:
            continue
        replaced |= gone_ids
        after.setdefault(made, []).append(fused)
        for v in fused.outputs:
            v.producer = fused
        count += 1
    if not count:
        return prims, Counter()
    result: list[Prim] = list(after.get(-1, []))
    for i, p in enumerate(prims):
        if id(p) not in replaced:
            result.append(p)
        result.extend(after.get(i, []))
    return result, Counter(kv_append=count)
