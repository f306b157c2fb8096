"""Converters for recurrent nets: RNN, LSTM, GRU as one input-projection GEMM plus a recurrence."""
from __future__ import annotations

import numpy as np

from ..lib.ops.recurrent import ACTIVATIONS, FUNCTIONS, GATES
from .convert import Context, converts
from .ir import Unsupported, Value, check_const_bytes
from .onnx_node import OnnxNode

DEFAULT_ACTIVATIONS = {"rnn": ["Tanh"], "gru": ["Sigmoid", "Tanh"],
                       "lstm": ["Sigmoid", "Tanh", "Tanh"]}


def _activations(node: OnnxNode, cell: str, dirs: int) -> tuple[list[str], list[float],
                                                                list[float]]:
    """One (name, alpha, beta) per function and direction, alphas and betas consumed in order by
    the functions that take them (as ONNX Runtime reads activation_alpha/activation_beta)."""
    per_dir = FUNCTIONS[cell]
    names = list(node.attr("activations") or DEFAULT_ACTIVATIONS[cell])
    if len(names) == per_dir and dirs == 2:
        names = names * 2
    if len(names) != per_dir * dirs:
        raise Unsupported(f"activations {names}: expected {per_dir * dirs} names "
                          f"({per_dir} per direction)")
    alphas = [float(v) for v in node.attr("activation_alpha") or []]
    betas = [float(v) for v in node.attr("activation_beta") or []]
    out_names, out_alpha, out_beta = [], [], []
    for name in names:
        key = name.lower()
        if key not in ACTIVATIONS:
            raise Unsupported(f"activation {name!r}; supported: "
                              + ", ".join(sorted(ACTIVATIONS)))
        _, alpha, beta = ACTIVATIONS[key]
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        out_names.append(key)
        out_alpha.append(0.0 if alpha is None else alpha)
        out_beta.append(0.0 if beta is None else beta)
    return out_names, out_alpha, out_beta


def _optional(args: list, i: int) -> Value | None:
    return args[i] if i < len(args) else None


@converts("RNN", "GRU", "LSTM")
def recurrent(ctx: Context, node: OnnxNode, args: list) -> list[Value]:
    b = ctx.b
    cell = node.op_type.lower()
    lstm = cell == "lstm"
    x, w, r = args[0], args[1], args[2]
    if w is None or r is None:
        raise Unsupported("W and R are required")
    layout = int(node.attr("layout", 0))
    if x.rank != 3 or w.rank != 3 or r.rank != 3:
        raise Unsupported(f"X {x.shape}, W {w.shape}, R {r.shape}: expected rank 3 each")
    if layout:
        x = b.transpose(x, [1, 0, 2])
    steps, batch, size = x.shape
    if steps >= 2 ** 31:
        # NOTE: sequence lengths are int32 (ONNX's sequence_lens type).
        raise Unsupported(f"X {x.shape}: {steps} time steps; expected fewer than 2^31")
    dirs, width, hidden = r.shape
    gates = GATES[cell]
    direction = str(node.attr("direction", "forward"))
    if dirs != (2 if direction == "bidirectional" else 1) or width != gates * hidden \
            or w.shape != (dirs, width, size):
        raise Unsupported(f"W {w.shape}, R {r.shape} for X {x.shape} ({direction}, {gates} "
                          f"gates): expected W (D, {gates}*H, {size}), R (D, {gates}*H, H)")
    if node.attr("hidden_size") is not None and int(node.attr("hidden_size")) != hidden:
        raise Unsupported(f"hidden_size {node.attr('hidden_size')} but R has {hidden}")
    dtype = x.dtype
    xw = b.op("dense", b.reshape(x, (steps * batch, size)), b.reshape(w, (dirs * width, size)))
    bias = _optional(args, 3)
    if bias is not None and tuple(bias.shape) != (dirs, 2 * width):
        raise Unsupported(f"B of shape {list(bias.shape)}; expected [{dirs}, {2 * width}] "
                          f"(D, 2*{gates}*H)")
    if bias is not None:
        if bias.const is not None:
            wb = b.const(np.ascontiguousarray(bias.const[:, :width]).reshape(-1), bias.name)
            rb = b.const(np.ascontiguousarray(bias.const[:, width:]), bias.name)
        else:
            wb = b.reshape(b.op("strided_slice", bias, begin=[0], end=[width], strides=[1],
                                axes=[1]), (dirs * width,))
            rb = b.op("strided_slice", bias, begin=[width], end=[2 * width], strides=[1],
                      axes=[1])
        xw = b.op("add", xw, wb)
    else:
        rb = b.const(_zeros((dirs, width), dtype, "the recurrence bias"), "rb")
    xw = b.reshape(xw, (steps, batch, dirs, width))

    def state(i: int, hint: str) -> Value:
        value = _optional(args, i)
        if value is None:
            return b.const(_zeros((dirs, batch, hidden), dtype, hint), hint)
        return b.transpose(value, [1, 0, 2]) if layout else value

    lens = _optional(args, 4)
    if lens is None:
        check_const_bytes((batch,), np.int32, "sequence_lens")
        lens = b.const(np.full(batch, steps, np.int32), "sequence_lens")
    else:
        if lens.const is not None and ((lens.const < 0) | (lens.const > steps)).any():
            raise Unsupported(f"sequence_lens {lens.const.tolist()} outside [0, {steps}]")
        lens = b.cast(lens, "int32")
    inputs = [xw, r, rb, state(5, "initial_h")]
    if lstm:
        peep = _optional(args, 7)
        if peep is None:
            peep = b.const(_zeros((dirs, 3 * hidden), dtype, "peepholes"), "P")
        inputs += [state(6, "initial_c"), peep]
    names, alphas, betas = _activations(node, cell, dirs)
    outs = b.ops("recurrence", inputs + [lens], cell=cell, direction=direction,
                 activations=names, activation_alpha=alphas, activation_beta=betas,
                 clip=float(node.attr("clip", 0.0)),
                 linear_before_reset=int(node.attr("linear_before_reset", 0)),
                 input_forget=int(node.attr("input_forget", 0)))
    y, states = outs[0], outs[1:]
    if layout:
        y = b.transpose(y, [2, 0, 1, 3])
        states = [b.transpose(s, [1, 0, 2]) for s in states]
    return [y] + states


def _zeros(shape: tuple[int, ...], dtype: str, what: str) -> np.ndarray:
    """A default (zero) input the ONNX node omitted, refused before it is made past the import's
    budget (a batch of 2^31 made 24 GiB of initial state)."""
    check_const_bytes(shape, dtype, f"the default {what}")
    return np.zeros(shape, dtype)
