"""Converters for elementwise math, activations, comparisons, reductions, arg/top-k, cumsum."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import EXTENDED_DTYPES
from ..lib.shapes import FLOAT_DTYPES
from .convert import Context, const_input, converts, ints_of, norm_axis
from .convert_data_dependent import topk_computed
from .fold import fold_cast, fold_identity
from .ir import Unsupported, Value, check_const_bytes
from .onnx_node import OnnxNode
from .symdim import is_int

# ONNX op type -> standard op, where one op is the whole conversion.
BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide",
          "Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
          "GreaterOrEqual": "greater_equal", "And": "logical_and", "Or": "logical_or",
          "Xor": "logical_xor", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
          "BitwiseXor": "bitwise_xor"}
UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log",
         "Sqrt": "sqrt", "Neg": "negative", "Abs": "abs", "Erf": "erf", "Floor": "floor",
         "Ceil": "ceil", "Round": "round", "Sign": "sign", "Sin": "sin", "Cos": "cos",
         "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh",
         "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
         "Softsign": "softsign", "IsNaN": "isnan", "Not": "logical_not", "Mish": "mish",
         "BitwiseNot": "bitwise_not"}
# ONNX activation -> (standard op, {ONNX attr: default}) passed under the same names.
ACTIVATIONS: dict[str, tuple[str, dict[str, float]]] = {
    "Elu": ("elu", {"alpha": 1.0}),
    "Selu": ("selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
    "Celu": ("celu", {"alpha": 1.0}),
    "ThresholdedRelu": ("thresholded_relu", {"alpha": 1.0}),
}


def _binary_args(ctx: Context, node: OnnxNode, a: Value, b: Value) -> tuple[Value, Value]:
    if node.op_type in ("Add", "Sub", "Mul", "Div") and a.dtype != b.dtype:
        raise Unsupported(f"inputs of dtypes {a.dtype} and {b.dtype}")
    return a, b


@converts(*BINARY)
def binary(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    a, b = _binary_args(ctx, node, args[0], args[1])
    op = BINARY[node.op_type]
    if op == "divide" and np.dtype(a.dtype).kind in "iu":
        if a.dtype in ("int8", "int16", "int32"):
            # ONNX truncates toward zero. float64 holds these exactly and its correctly rounded
            # quotient never crosses an integer, so the cast back truncates to the exact answer.
            wide = ctx.b.op("divide", ctx.b.cast(a, "float64"), ctx.b.cast(b, "float64"))
            return [ctx.b.op("cast", wide, dtype=a.dtype)]
        if np.dtype(a.dtype).kind == "i":
            return [_truncating_divide(ctx, a, b)]
        op = "floor_divide"  # the same for unsigned operands
    return [ctx.b.op(op, a, b)]


def _truncating_divide(ctx: Context, a: Value, b: Value) -> Value:
    """ONNX's integer Div: floor division, plus one where a remainder is left and the signs
    differ (floor rounded away from zero there)."""
    bb = ctx.b
    q = bb.op("floor_divide", a, b)
    rest = bb.op("subtract", a, bb.op("multiply", q, b))
    zero = bb.scalar(0, a)
    inexact = bb.op("not_equal", rest, zero)
    signs = bb.op("logical_xor", bb.op("less", a, zero), bb.op("less", b, zero))
    fix = bb.cast(bb.op("logical_and", inexact, signs), a.dtype)
    return bb.op("add", q, fix)


@converts(*UNARY)
def unary(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op(UNARY[node.op_type], args[0])]


@converts(*ACTIVATIONS)
def activation(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    op, defaults = ACTIVATIONS[node.op_type]
    attrs = {k: float(node.attr(k, v)) for k, v in defaults.items()}
    return [ctx.b.op(op, args[0], **attrs)]


@converts("Identity", fold=fold_identity)
@converts("Dropout", shape_inputs=(1, 2))
def identity(ctx: Context, node: OnnxNode, args: list) -> list[Value | None]:
    if node.op_type == "Dropout":
        if len(args) > 2 and args[2] is not None:
            ratio = args[1].const if len(args) > 1 and args[1] is not None else None
            no_drop = ratio is not None and float(np.asarray(ratio)) == 0.0
            if not no_drop and (args[2].const is None or bool(np.asarray(args[2].const))):
                raise Unsupported("training_mode is true or computed at run time")
        mask = node.outputs[1] if len(node.outputs) > 1 else ""
        ctx.removed[node.op_type] += 1
        if ctx.used(mask):
            check_const_bytes(args[0].shape, bool, "Dropout's mask")
            return [args[0], ctx.b.const(np.ones(args[0].shape, bool), "mask")]
        return [args[0]]
    ctx.removed[node.op_type] += 1
    return [args[0]]


@converts("LeakyRelu")
def leaky_relu(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op("leaky_relu", args[0], alpha=float(node.attr("alpha", 0.01)))]


def _dtype_limits(dtype: str) -> tuple[float, float]:
    """The range of dtype: NumPy's types, and ml_dtypes' (bfloat16, float8, int4: kind 'V')."""
    kind = np.dtype(dtype).kind
    if kind in "fiu":
        info: Any = np.finfo(dtype) if kind == "f" else np.iinfo(dtype)
        return float(info.min), float(info.max)
    import ml_dtypes
    for lookup in (ml_dtypes.finfo, ml_dtypes.iinfo):
        try:
            info = lookup(dtype)
        except (TypeError, ValueError):
            continue
        return float(info.min), float(info.max)
    raise Unsupported(f"an input of {dtype}, which has no numeric range")


@converts("Clip", value_inputs=(1, 2))
def clip(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    lo, hi = _dtype_limits(x.dtype)
    if node.opset < 11:
        lo = float(node.attr("min", lo))
        hi = float(node.attr("max", hi))
    else:
        given_lo = const_input(node, args, 1, "min")
        given_hi = const_input(node, args, 2, "max")
        lo = lo if given_lo is None else float(given_lo)
        hi = hi if given_hi is None else float(given_hi)
    if np.dtype(x.dtype).kind != "f" and (lo != int(lo) or hi != int(hi)):
        raise Unsupported(f"non-integer bounds {lo}, {hi} for {x.dtype}")
    lo = min(lo, hi)  # ONNX: every value becomes max when min > max
    return [ctx.b.op("clip", x, a_min=lo, a_max=hi)]


@converts("HardSigmoid")
def hard_sigmoid(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    alpha = float(node.attr("alpha", 0.2))
    beta = float(node.attr("beta", 0.5))
    return [b.op("hard_sigmoid", x, alpha=alpha, beta=beta)]


@converts("HardSwish")
def hard_swish(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op("hard_swish", args[0])]


@converts("Softplus")
def softplus(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op("softplus", args[0])]


@converts("Gelu")
def gelu(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"approximate {approximate!r}")
    return [ctx.b.op("gelu", args[0], approximate=approximate)]


@converts("PRelu")
def prelu(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op("prelu", args[0], args[1])]


@converts("BitShift")
def bit_shift(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    direction = node.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise Unsupported(f"direction {direction!r}")
    op = "left_shift" if direction == "LEFT" else "right_shift"
    return [ctx.b.op(op, args[0], args[1])]


@converts("Reciprocal")
def reciprocal(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op("reciprocal", args[0])]


@converts("Pow")
def power(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x, y = args[0], args[1]
    if y.const is not None and y.const.size == 1 and y.shape == () or (
            y.const is not None and y.const.size == 1 and len(y.shape) <= x.rank):
        exponent = float(np.asarray(y.const).reshape(-1)[0])
        if exponent == 1.0:
            return [x]
        if exponent == 2.0:
            return [b.op("multiply", x, x)]
        if exponent == 0.5 and np.dtype(x.dtype).kind == "f":
            return [b.op("sqrt", x)]
    return [b.op("power", x, b.cast(y, x.dtype))]


@converts("Max", "Min", "Sum", "Mean")
def variadic(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    op = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[node.op_type]
    values = [a for a in args if a is not None]
    if len(values) == 1:
        acc = values[0]
    else:
        acc = b.op(op, values[0], values[1])
        for v in values[2:]:
            acc = b.op(op, acc, v)
    if node.op_type == "Mean" and len(values) > 1:
        acc = b.op("divide", acc, b.scalar(float(len(values)), acc))
    return [acc]


@converts("Mod")
def mod(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op("mod", args[0], args[1], fmod=int(node.attr("fmod", 0)))]


@converts("IsInf")
def isinf(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op("isinf", args[0],
                     detect_negative=bool(int(node.attr("detect_negative", 1))),
                     detect_positive=bool(int(node.attr("detect_positive", 1))))]


@converts("Where")
def where(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    return [ctx.b.op("where", args[0], args[1], args[2])]


EXTENDED_DTYPES_SET = frozenset(EXTENDED_DTYPES)


@converts("Cast", fold=fold_cast)
@converts("CastLike")
def cast(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    from .onnx_model import np_dtype
    if node.op_type == "CastLike":
        dtype = args[1].dtype
    else:
        dtype = np_dtype(int(node.attr("to")))
    if EXTENDED_DTYPES_SET & {dtype, args[0].dtype} and args[0].dtype != dtype:
        return [ctx.b.op("convert_type", args[0], dtype=dtype,
                         saturate=int(node.attr("saturate", 1)),
                         round_mode=str(node.attr("round_mode", "up")))]
    return [ctx.b.op("cast", args[0], dtype=dtype) if args[0].dtype != dtype else
            args[0]]


# -- reductions -----------------------------------------------------------------------------------

REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
          "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceSumSquare": "sum_square",
          "ReduceLogSum": "log_sum", "ReduceLogSumExp": "log_sum_exp"}


def _reduce_axes(node: OnnxNode, args: list, x: Value) -> list[int] | None:
    """The reduced axes (None: keep the input unchanged, noop_with_empty_axes)."""
    axes_from_input = node.opset >= 18 or (node.op_type == "ReduceSum" and node.opset >= 13)
    axes = ints_of(const_input(node, args, 1, "axes")) if axes_from_input else node.opt_ints("axes")
    if not axes:
        if int(node.attr("noop_with_empty_axes", 0)):
            return None
        return list(range(x.rank))
    return sorted({norm_axis(a, x.rank, node, "axes") for a in axes})


@converts(*REDUCE, shape_inputs=(1,))
def reduce(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    axes = _reduce_axes(node, args, x)
    if axes is None:
        return [x]
    keep = bool(int(node.attr("keepdims", 1)))
    if node.op_type in ("ReduceMax", "ReduceMin") and any(is_int(x.shape[a], 0) for a in axes):
        return [_empty_extreme(ctx, node, x, axes, keep)]
    pool = GLOBAL_POOLS.get(node.op_type)
    if pool is not None and x.rank == 4 and axes == [2, 3] and x.dtype in FLOAT_DTYPES \
            and all(isinstance(x.shape[a], int) and x.shape[a] > 0 for a in axes):
        # a mean or max over an image's height and width (PyTorch's dynamo exporter writes
        # squeeze-excite and classifier pools so) is the global pool GlobalAveragePool gives:
        # one op that reads channels-last data and runs oneDNN's pooling where that is faster
        # (sizes known and not 0: over an empty image the pool refuses where ONNX's mean is NaN)
        y = b.op(pool, x)
        return [y if keep else b.reshape(y, (x.shape[0], x.shape[1]))]
    return [b.op(REDUCE[node.op_type], x, axis=axes, keepdims=keep)]


# reductions over (H, W) of an NCHW image that are a global pool op
GLOBAL_POOLS = {"ReduceMean": "global_avg_pool2d", "ReduceMax": "global_max_pool2d"}


def _empty_extreme(ctx: Context, node: OnnxNode, x: Value, axes: list[int],
                   keep: bool) -> Value:
    """ReduceMax/ReduceMin over axes holding no elements: ONNX (opset 18+) gives the identity,
    -inf/+inf, or the dtype's lowest/highest value where it has no infinity (bool: False for
    max, True for min)."""
    if node.opset < 18:
        raise Unsupported(f"{node.op_type} over axes {axes} of {x.shape}: they hold no elements "
                          "(defined from opset 18)")
    kind = np.dtype(x.dtype).kind
    lowest = node.op_type == "ReduceMax"
    value: Any
    if kind == "f":
        value = -np.inf if lowest else np.inf
    elif kind == "b":
        value = not lowest  # max is any(), min is all()
    else:
        info = np.iinfo(x.dtype)
        value = info.min if lowest else info.max
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
    check_const_bytes(shape, x.dtype, f"{node.op_type} of an empty set")
    return ctx.b.const(np.full(shape, value, dtype=x.dtype), "empty_extreme")


@converts("ArgMax", "ArgMin")
def arg_reduce(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    x = args[0]
    axis = norm_axis(int(node.attr("axis", 0)), x.rank, node)
    keep = bool(int(node.attr("keepdims", 1)))
    op = "argmax" if node.op_type == "ArgMax" else "argmin"
    if int(node.attr("select_last_index", 0)):
        # The last extreme index = n - 1 - (first extreme index of the reversed axis).
        n = x.shape[axis]
        flipped = b.op("strided_slice", x, begin=[n - 1], end=[None], strides=[-1], axes=[axis])
        first = b.cast(b.op(op, flipped, axis=[axis], keepdims=keep), "int64")
        return [b.op("subtract", b.const(np.array(n - 1, np.int64), "last"), first)]
    return [b.cast(b.op(op, x, axis=[axis], keepdims=keep), "int64")]


@converts("TopK", shape_inputs=(1,))
def topk(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    if node.opset < 10:
        k = int(node.attr("k"))
    elif args[1] is not None and args[1].const is None and node.outputs[0] in ctx.data_sizes:
        # k computed at run time (its value may be known at this probe import only).
        return topk_computed(ctx, node, args)
    else:
        k = int(np.asarray(const_input(node, args, 1, "K")).reshape(-1)[0])
    axis = norm_axis(int(node.attr("axis", -1)), x.rank, node)
    outs = ctx.b.ops("topk", [x], k=k, axis=axis, largest=bool(int(node.attr("largest", 1))),
                     sorted=bool(int(node.attr("sorted", 1))))
    return outs


@converts("CumSum", shape_inputs=(1,))
def cumsum(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    x = args[0]
    axis = norm_axis(int(np.asarray(const_input(node, args, 1, "axis")).reshape(-1)[0]),
                     x.rank, node)
    return [ctx.b.op("cumsum", x, axis=axis, exclusive=bool(int(node.attr("exclusive", 0))),
                     reverse=bool(int(node.attr("reverse", 0))))]
