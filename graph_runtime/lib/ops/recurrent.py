"""recurrence (ONNX RNN, LSTM, GRU): the per-step loop over precomputed input projections."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ...backends.base import Backend
from ..attrs import attr_error, bool_attr, float_attr, op_error, str_attr
from ..kernels.host import host_factory, wide_dtype
from ..kernels.opencl.recurrent import cl_recurrence
from ..library import TensorSpec
from ..registry import define_op, kernel
from ..shapes import FLOAT_DTYPES, check_dtype, check_rank

if TYPE_CHECKING:
    from ...backends.opencl import OpenCLBackend

# The importer computes xw = X @ W^T + Wb for every step and direction in one dense call; this
# op runs what cannot be batched over time: H(t-1) @ R^T, the gates and the state updates.
RECURRENCE_ATTRS = ("cell", "direction", "activations", "activation_alpha", "activation_beta",
                    "clip", "linear_before_reset", "input_forget")
GATES = {"rnn": 1, "gru": 3, "lstm": 4}
FUNCTIONS = {"rnn": 1, "gru": 2, "lstm": 3}
DIRECTIONS = ("forward", "reverse", "bidirectional")


def _sigmoid(xp: Any, x: Any, a: float, b: float) -> Any:
    # NOTE: the two-sided form never overflows exp for large |x|.
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


# ONNX's activation functions for recurrent nets: name -> (f(xp, x, alpha, beta), alpha, beta).
ACTIVATIONS: dict[str, tuple[Callable[..., Any], float | None, float | None]] = {
    "sigmoid": (_sigmoid, None, None),
    "tanh": (lambda xp, x, a, b: xp.tanh(x), None, None),
    "relu": (lambda xp, x, a, b: xp.maximum(x, 0), None, None),
    "affine": (lambda xp, x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda xp, x, a, b: xp.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda xp, x, a, b: xp.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda xp, x, a, b: a * xp.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda xp, x, a, b: xp.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda xp, x, a, b: xp.where(x >= 0, x, a * (xp.exp(xp.minimum(x, 0)) - 1)),
            1.0, None),
    "softsign": (lambda xp, x, a, b: x / (1 + xp.abs(x)), None, None),
    "softplus": (lambda xp, x, a, b: xp.logaddexp(x, 0), None, None),
}


def _numbers(attrs: Mapping[str, Any], key: str, count: int) -> list[float]:
    values = attrs.get(key)
    if not isinstance(values, (list, tuple)) or len(values) != count:
        raise attr_error("recurrence", key, values,
                         f"a list of {count} numbers, one per activation")
    return [float(v) for v in values]


def recurrence_params(attrs: Mapping[str, Any]) -> tuple[str, str, list[tuple[str, float, float]],
                                                          float, bool, bool]:
    """(cell, direction, [(activation, alpha, beta)] per function and direction, clip,
    linear_before_reset, input_forget), checked."""
    op = "recurrence"
    cell = str_attr(op, attrs, "cell", choices=tuple(GATES))
    direction = str_attr(op, attrs, "direction", "forward", choices=DIRECTIONS)
    count = FUNCTIONS[cell] * (2 if direction == "bidirectional" else 1)
    names = attrs.get("activations")
    if not isinstance(names, (list, tuple)) or len(names) != count:
        raise attr_error(op, "activations", names, f"a list of {count} activation names")
    alphas, betas = (_numbers(attrs, key, count) for key in ("activation_alpha",
                                                              "activation_beta"))
    functions = []
    for name, alpha, beta in zip(names, alphas, betas):
        if name not in ACTIVATIONS:
            raise attr_error(op, "activations", names, "names among " + ", ".join(ACTIVATIONS))
        functions.append((str(name), float(alpha), float(beta)))
    clip = float_attr(op, attrs, "clip", 0.0)
    if clip < 0:
        raise attr_error(op, "clip", clip, "a number >= 0 (0: no clipping)")
    return (cell, direction, functions, clip, bool_attr(op, attrs, "linear_before_reset", False),
            bool_attr(op, attrs, "input_forget", False))


def _infer(inputs: Sequence[TensorSpec], attrs: Mapping[str, Any]) -> list[TensorSpec]:
    """Inputs: xw (T, B, D, G*H), r (D, G*H, H), rb (D, G*H), h0 (D, B, H), then for lstm
    c0 (D, B, H) and p (D, 3*H), then seq_lens (B,) int32. Outputs: y (T, D, B, H), y_h
    (D, B, H), and for lstm y_c (D, B, H)."""
    op = "recurrence"
    cell, direction, *_ = recurrence_params(attrs)
    lstm = cell == "lstm"
    want = 7 if lstm else 5
    if len(inputs) != want:
        raise op_error(op, f"cell {cell!r} takes {want} inputs, got {len(inputs)}")
    xw, r, rb, h0 = inputs[:4]
    dtype = check_dtype(op, xw, FLOAT_DTYPES)
    check_rank(op, xw, (4,))
    steps, batch, dirs, width = xw.shape
    gates = GATES[cell]
    hidden = width // gates
    want_dirs = 2 if direction == "bidirectional" else 1
    expected = {1: (dirs, width, hidden), 2: (dirs, width), 3: (dirs, batch, hidden)}
    if lstm:
        expected.update({4: (dirs, batch, hidden), 5: (dirs, 3 * hidden)})
    if dirs != want_dirs or width != gates * hidden:
        raise op_error(op, f"input 0 has shape {xw.shape}; expected (T, B, {want_dirs}, "
                           f"{gates}*H) for a {direction} {cell}")
    for i, shape in expected.items():
        if tuple(inputs[i].shape) != shape or inputs[i].dtype != dtype:
            raise op_error(op, f"input {i} is {inputs[i]}; expected {shape} {dtype}")
    lens = inputs[-1]
    if tuple(lens.shape) != (batch,) or lens.dtype != "int32":
        raise op_error(op, f"input {len(inputs) - 1} (sequence lengths) is {lens}; expected "
                           f"({batch},) int32")
    state = TensorSpec((dirs, batch, hidden), dtype)
    outs = [TensorSpec((steps, dirs, batch, hidden), dtype), state]
    return outs + [state] if lstm else outs


def _host_recurrence(xp: Any, backend: Backend, device_id: int, inputs: Sequence[TensorSpec],
                     outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]
                     ) -> Callable[..., None]:
    cell, direction, functions, clip, before_reset, input_forget = recurrence_params(attrs)
    steps, batch, dirs, width = inputs[0].shape
    acc = wide_dtype(inputs[0].dtype)
    per_dir = FUNCTIONS[cell]

    def act(d: int, k: int, x: Any) -> Any:
        name, alpha, beta = functions[d * per_dir + k]
        return ACTIVATIONS[name][0](xp, x, alpha, beta)

    def clipped(x: Any) -> Any:
        return xp.clip(x, -clip, clip) if clip > 0 else x

    def run(*arrays: Any) -> None:
        xw, r, rb, h0 = (a.astype(acc, copy=False) for a in arrays[:4])
        lens = arrays[len(inputs) - 1]
        y, y_h = arrays[len(inputs)], arrays[len(inputs) + 1]
        lstm = cell == "lstm"
        if lstm:
            c0, peep = (a.astype(acc, copy=False) for a in arrays[4:6])
            y_c = arrays[len(inputs) + 2]
        lengths = xp.asarray(lens).astype(np.int64)
        full = bool((lengths == steps).all())
        rows = xp.arange(batch)
        y[...] = 0
        for d in range(dirs):
            reverse = direction == "reverse" or d == 1
            h = h0[d]
            rt = r[d].T
            if lstm:
                c = c0[d]
                p_i, p_o, p_f = (peep[d, k * h.shape[1]:(k + 1) * h.shape[1]] for k in range(3))
            for s in range(steps):
                if full:
                    t: Any = steps - 1 - s if reverse else s
                    x_t = xw[t, :, d]
                else:
                    # Each sequence runs over its own length; a reversed one from its own end.
                    t = xp.clip(lengths - 1 - s if reverse else xp.full(batch, s), 0, steps - 1)
                    x_t = xw[t, rows, d]
                hr = h @ rt + rb[d]
                if cell == "rnn":
                    h_new = act(d, 0, clipped(x_t + hr))
                elif cell == "gru":
                    xz, xr, xh = xp.split(x_t, 3, axis=1)
                    hz, hrr, hh = xp.split(hr, 3, axis=1)
                    z = act(d, 0, clipped(xz + hz))
                    reset = act(d, 0, clipped(xr + hrr))
                    if before_reset:
                        cand = xh + reset * hh
                    else:
                        hidden = h.shape[1]
                        r_h = r[d, 2 * hidden:].T
                        cand = xh + (reset * h) @ r_h + rb[d, 2 * hidden:]
                    h_new = (1 - z) * act(d, 1, clipped(cand)) + z * h
                else:
                    gi, go, gf, gc = xp.split(x_t + hr, 4, axis=1)
                    i_gate = act(d, 0, clipped(gi + p_i * c))
                    f_gate = 1 - i_gate if input_forget else act(d, 0, clipped(gf + p_f * c))
                    c_new = f_gate * c + i_gate * act(d, 1, clipped(gc))
                    o_gate = act(d, 0, clipped(go + p_o * c_new))
                    h_new = o_gate * act(d, 2, c_new)
                if full:
                    h = h_new
                    y[t, d] = h
                    if lstm:
                        c = c_new
                    continue
                live = (s < lengths)[:, None]
                h = xp.where(live, h_new, h)
                if lstm:
                    c = xp.where(live, c_new, c)
                y[t[live[:, 0]], d, rows[live[:, 0]]] = h[live[:, 0]]
            y_h[d] = h
            if lstm:
                y_c[d] = c
    return run


def _cl_recurrence(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                   outputs: Sequence[TensorSpec], attrs: Mapping[str, Any]
                   ) -> Callable[..., None]:
    return cl_recurrence(backend, device_id, inputs, recurrence_params(attrs))


define_op("recurrence", _infer, None, RECURRENCE_ATTRS)
kernel("recurrence", "cpu")(host_factory(_host_recurrence))
kernel("recurrence", "cuda")(host_factory(_host_recurrence))
kernel("recurrence", "opencl")(_cl_recurrence)
