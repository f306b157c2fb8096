"""Fusion as TVM's FuseOps: group prims into lib.json chains and name them as TVM names them."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ...lib.kernels.gpu_elementwise import ELEMENTWISE_EXPRS
from ..ir import Prim, Value
from ..symdim import has_sym

# TVM's "out_elemwise_fusable" ops: heavy ops whose elementwise epilogue joins their function.
ANCHORS = frozenset({"conv2d", "conv2d_transpose", "dense", "matmul", "batch_matmul", "dense_dynamic_scaled",
                     "max_pool2d", "avg_pool2d", "global_avg_pool2d", "global_max_pool2d"})
INJECTIVE = frozenset({"reshape", "transpose", "squeeze", "expand_dims", "flatten",
                       "batch_flatten", "strided_slice", "concatenate", "take", "pad", "split",
                       "broadcast_to", "tile", "copy"})
# Reductions take an elementwise/injective prologue and an elementwise epilogue.
REDUCTIONS = frozenset({"sum", "mean", "max", "min", "prod", "argmax", "argmin", "softmax",
                        "log_softmax", "layer_norm", "rms_norm"})
COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum"})
# Relay's op names as they appear in TVM's fused function names.
RELAY_NAMES = {"conv2d": "nn_conv2d", "conv2d_transpose": "nn_conv2d_transpose",
               "dense": "nn_dense", "matmul": "nn_matmul", "batch_matmul": "nn_batch_matmul",
               "relu": "nn_relu", "leaky_relu": "nn_leaky_relu", "softmax": "nn_softmax",
               "log_softmax": "nn_log_softmax", "max_pool2d": "nn_max_pool2d",
               "avg_pool2d": "nn_avg_pool2d", "global_avg_pool2d": "nn_global_avg_pool2d",
               "global_max_pool2d": "nn_global_max_pool2d", "batch_norm": "nn_batch_norm",
               "layer_norm": "nn_layer_norm", "rms_norm": "nn_rms_norm",
               "bias_add": "nn_bias_add", "pad": "nn_pad",
               "batch_flatten": "nn_batch_flatten", "instance_norm": "nn_instance_norm",
               "group_norm": "nn_group_norm", "prelu": "nn_prelu", "lrn": "nn_lrn",
               "resize": "image_resize2d", "gelu": "nn_gelu"}
MAX_NAME = 80  # TVM caps the op part of a fused name near this length


def _kind(op: str) -> str:
    if op in ANCHORS:
        return "anchor"
    if op in ELEMENTWISE_EXPRS or op in ("bias_add", "qlookup"):
        return "elemwise"
    if op in INJECTIVE:
        return "injective"
    if op in REDUCTIONS:
        return "reduce"
    return "opaque"


@dataclass(eq=False)
class Group:
    """Prims fused into one function, in chain order; its outputs are the last prim's."""

    prims: list[Prim] = field(default_factory=list)
    kind: str = "injective"
    closed: bool = False

    @property
    def outputs(self) -> list[Value]:
        return self.prims[-1].outputs

    def inputs(self) -> list[Value]:
        """The function's arguments: the first op's inputs, then each later op's extra ones."""
        args = list(self.prims[0].inputs)
        for p in self.prims[1:]:
            args += p.inputs[1:]
        return args


def _can_join(group: Group, prim: Prim) -> bool:
    kind = _kind(prim.op)
    if group.closed or kind in ("anchor", "opaque"):
        return False
    if kind == "elemwise":
        return group.kind in ("anchor", "injective", "reduce", "elemwise")
    if kind == "injective":
        return group.kind in ("injective", "elemwise")
    return group.kind in ("injective", "elemwise")  # a reduction after its prologue


def _alone(p: Prim) -> bool:
    """A take from an array of symbolic shape (a decoder's padding-mask gather) is a function
    of its own: alone its kernel takes any shape (it reads the extent per call), where in a
    chain its input and output would be intermediates sized for one shape, prepared again at
    every past length."""
    return p.op == "take" and bool(p.inputs) and has_sym(p.inputs[0].shape)


def fuse(prims: list[Prim], outputs: list[Value]) -> list[Group]:
    """Greedy chains: a prim joins the group producing its first input when that value has no
    other reader and is no graph output; commutative ops swap inputs to put it first."""
    reads: Counter = Counter()
    for p in prims:
        reads.update(id(v) for v in p.inputs)
    pinned = {id(v) for v in outputs}
    group_of: dict[int, Group] = {}
    groups: list[Group] = []

    def host(value: Value, p: Prim) -> Group | None:
        """The group p may join through value: it ends in value, read only here."""
        g = group_of.get(id(value))
        if g is not None and g.outputs == [value] and reads[id(value)] == 1 \
                and id(value) not in pinned and _can_join(g, p):
            return g
        return None

    for p in prims:
        joined = None
        alone = _alone(p)
        if p.inputs and not alone:
            joined = host(p.inputs[0], p)
            if joined is None and p.op in COMMUTATIVE and len(p.inputs) == 2:
                joined = host(p.inputs[1], p)
                if joined is not None:
                    p.inputs = [p.inputs[1], p.inputs[0]]  # the chain's value goes first
        if joined is None:
            joined = Group([], _kind(p.op))
            groups.append(joined)
        else:
            kind = _kind(p.op)
            if kind == "reduce":
                joined.kind = "reduce"
        joined.prims.append(p)
        if len(p.outputs) > 1 or _kind(p.op) == "opaque" or alone:
            joined.closed = True
        for v in p.outputs:
            group_of[id(v)] = joined
    return groups


def function_doc(group: Group) -> dict[str, Any]:
    """The lib.json FUNC of a group: the one-op shorthand or an ops chain."""
    steps = [{"op": p.op, **p.attrs} for p in group.prims]
    for step, p in zip(steps, group.prims):
        if p.op == "concatenate" and len(group.prims) > 1:
            step["num_inputs"] = len(p.inputs)  # counts the previous result too
    if len(steps) == 1:
        return steps[0]
    return {"ops": steps}


def base_name(group: Group) -> str:
    parts: list[str] = []
    length = 0
    for p in group.prims:
        part = RELAY_NAMES.get(p.op, p.op)
        if parts and length + len(part) + 1 > MAX_NAME:
            break
        parts.append(part)
        length += len(part) + 1
    return "tvmgen_default_fused_" + "_".join(parts)
