"""OpenCL kernels of recurrence (RNN, LSTM, GRU): one launch per time step (two for GRU with
linear_before_reset=0), each work item one (direction, batch row, hidden unit).

The input projections (xw) come precomputed by one dense over all steps; what remains per step
is H(t-1) @ R^T and the gate updates. The state lives on the device in two buffers of the
compute type that swap roles every step, so a step never waits on the host.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ...library import TensorSpec
from ..gpu_common import compute_type
from ..host import wide_dtype
from .source import ClKernel, check_cl_dtypes, cl_header, cl_load, cl_param, cl_pointer, cl_store

if TYPE_CHECKING:
    from ....backends.opencl import OpenCLBackend

# ONNX's recurrent activations as C function bodies of x, with alpha a and beta b, in the compute
# type A; they follow ops/recurrent.py's ACTIVATIONS (NaN propagates as NumPy's does).
CL_ACTIVATIONS = {
    "sigmoid": "A e = exp(-fabs(x)); return x >= 0 ? 1 / (1 + e) : e / (1 + e);",
    "tanh": "return tanh(x);",
    "relu": "return x < 0 ? 0 : x;",
    "affine": "return a * x + b;",
    "leakyrelu": "return x >= 0 ? x : a * x;",
    "thresholdedrelu": "return x > a ? x : 0;",
    "scaledtanh": "return a * tanh(b * x);",
    "hardsigmoid": "A v = a * x + b; return v < 0 ? 0 : (v > 1 ? 1 : v);",
    "elu": "return x >= 0 ? x : a * (exp(x) - 1);",
    "softsign": "return x / (1 + fabs(x));",
    "softplus": "return fmax(x, (A)0) + log1p(exp(-fabs(x)));",
}
GATES = {"rnn": 1, "gru": 3, "lstm": 4}
PER_DIRECTION = {"rnn": 1, "gru": 2, "lstm": 3}


def _literal(value: float, acc: str) -> str:
    if not math.isfinite(value):
        return f"(A)({'NAN' if math.isnan(value) else ('-' if value < 0 else '') + 'INFINITY'})"
    return f"{float(np.float32(value))!r}f" if acc == "float" else repr(float(value))


def _functions(cell: str, dirs: int, functions: Sequence[tuple[str, float, float]], clip: float,
               acc: str) -> str:
    """gr_f{i}: activation i with its alpha and beta; gr_act{k}(d, x): function k of direction
    d; gr_clip: the clip attribute (0: none)."""
    parts = []
    for i, (name, alpha, beta) in enumerate(functions):
        parts.append(f"A gr_f{i}(A x) {{ const A a = {_literal(alpha, acc)}; "
                     f"const A b = {_literal(beta, acc)}; {CL_ACTIVATIONS[name]} }}")
    per = PER_DIRECTION[cell]
    for k in range(per):
        pick = f"d == 0 ? gr_f{k}(x) : gr_f{per + k}(x)" if dirs == 2 else f"gr_f{k}(x)"
        parts.append(f"A gr_act{k}(long d, A x) {{ return {pick}; }}")
    bound = _literal(clip, acc)
    body = (f"return x < -{bound} ? -{bound} : (x > {bound} ? {bound} : x);" if clip > 0
            else "return x;")
    parts.append(f"A gr_clip(A x) {{ {body} }}")
    return "\n".join(parts)


def _params(arrays: Sequence[tuple[str, str, bool]]) -> tuple[str, str]:
    """(parameter list, pointer statements) for (name, dtype, writable) arrays."""
    params = ", ".join(cl_param(n, t, const=not w) for n, t, w in arrays)
    pointers = "\n    ".join(cl_pointer(n, t, const=not w) for n, t, w in arrays)
    return params, pointers


class RecurrenceSource:
    """The program of one (dtype, cell, direction, activations, clip, options) and the array
    arguments of each of its kernels, in order."""

    def __init__(self, dtype: str, cell: str, direction: str,
                 functions: Sequence[tuple[str, float, float]], clip: float,
                 before_reset: bool, input_forget: bool) -> None:
        self.lstm = cell == "lstm"
        self.two_phase = cell == "gru" and not before_reset
        acc = compute_type(dtype, "opencl")
        state = wide_dtype(dtype)
        dirs = 2 if direction == "bidirectional" else 1
        io, st = dtype, state
        c_outs = [("y_c", io, True), ("c_next", st, True)] if self.lstm else []
        self.init_args = ([("y", io, True), ("y_h", io, True), ("h_next", st, True)] + c_outs
                          + [("h0", io, False)] + ([("c0", io, False)] if self.lstm else []))
        weights = [("xw", io, False), ("r", io, False), ("rb", io, False)]
        weights += [("p", io, False)] if self.lstm else []
        prev = [("lens", "int32", False), ("h_prev", st, False)]
        prev += [("c_prev", st, False)] if self.lstm else []
        scratch = [("zbuf", st, True), ("rh", st, True)] if self.two_phase else []
        self.gate_args = scratch + weights + prev
        self.step_args = ([("y", io, True), ("y_h", io, True), ("h_next", st, True)] + c_outs
                          + weights + prev + [(n, t, False) for n, t, _ in scratch])
        sizes = "long T, long D, long B, long H"
        store = "half" if dtype == "float16" else acc
        reverse = int(direction == "reverse")
        # Work item g: unit j of batch row b of direction d; the step s reads time t of that row
        # (a reversed row starts at its own last valid step, as _host_recurrence does).
        where = f"""long g = get_global_id(0);
    if (g >= D * B * H) return;
    long j = g % H, b = (g / H) % B, d = g / (B * H);
    long len = lens[b];
    long t = ({reverse} || d == 1) ? len - 1 - s : s;
    t = t < 0 ? 0 : (t > T - 1 ? T - 1 : t);
    int live = s < len;
    long row = (d * B + b) * H;
    long gw = {GATES[cell]} * H;
    __global const {store}* x_t = xw + ((t * B + b) * D + d) * gw;
    __global const {store}* r_d = r + d * gw * H;
    __global const {store}* rb_d = rb + d * gw;
    A hold = h_prev[row + j];"""
        x = lambda q: cl_load("x_t", dtype, q)
        bias = lambda q: cl_load("rb_d", dtype, q)
        gate = lambda q: f"({x(q)} + (gr_dot(r_d + ({q}) * H, h_prev + row, H) + {bias(q)}))"
        parts = [cl_header([dtype]) + f"typedef {acc} A;",
                 _functions(cell, dirs, functions, clip, acc),
                 f"""A gr_dot(__global const {store}* w, __global const A* h, long H) {{
    A s = 0;
    for (long k = 0; k < H; ++k) s += {cl_load("w", dtype, "k")} * h[k];
    return s;
}}"""]
        params, pointers = _params(self.init_args)
        c_init = (f"A c = {cl_load('c0', dtype, 'g')}; c_next[g] = c; "
                  f"{cl_store('y_c', dtype, 'g', 'c')}") if self.lstm else ""
        parts.append(f"""__kernel void gr_rec_init({params}, {sizes}) {{
    long g = get_global_id(0);
    if (g >= D * B * H) return;
    {pointers}
    long j = g % H, b = (g / H) % B, d = g / (B * H);
    A h = {cl_load("h0", dtype, "g")};
    h_next[g] = h;
    {cl_store("y_h", dtype, "g", "h")}
    {c_init}
    for (long t = 0; t < T; ++t) {{ {cl_store("y", dtype, "((t * D + d) * B + b) * H + j", "0")} }}
}}""")
        if cell == "rnn":
            update = f"h = gr_act0(d, gr_clip({gate('j')}));"
        elif cell == "gru":
            if self.two_phase:
                params, pointers = _params(self.gate_args)
                parts.append(f"""__kernel void gr_rec_gates({params}, {sizes}, long s) {{
    {pointers}
    {where}
    if (!live) return;
    zbuf[row + j] = gr_act0(d, gr_clip({gate('j')}));
    rh[row + j] = gr_act0(d, gr_clip({gate('H + j')})) * hold;
}}""")
                update = f"""A z = zbuf[row + j];
        A cand = {x('2 * H + j')} + (gr_dot(r_d + (2 * H + j) * H, rh + row, H)
                                     + {bias('2 * H + j')});"""
            else:
                update = f"""A z = gr_act0(d, gr_clip({gate('j')}));
        A reset = gr_act0(d, gr_clip({gate('H + j')}));
        A cand = {x('2 * H + j')} + reset * (gr_dot(r_d + (2 * H + j) * H, h_prev + row, H)
                                             + {bias('2 * H + j')});"""
            update += "\n        h = (1 - z) * gr_act1(d, gr_clip(cand)) + z * hold;"
        else:
            peep_f = cl_load("p_d", dtype, "2 * H + j")
            forget = ("1 - i" if input_forget
                      else f"gr_act0(d, gr_clip({gate('2 * H + j')} + {peep_f} * c))")
            update = f"""__global const {store}* p_d = p + d * 3 * H;
        A i = gr_act0(d, gr_clip({gate('j')} + {cl_load('p_d', dtype, 'j')} * c));
        A f = {forget};
        c = f * c + i * gr_act1(d, gr_clip({gate('3 * H + j')}));
        A o = gr_act0(d, gr_clip({gate('H + j')} + {cl_load('p_d', dtype, 'H + j')} * c));
        h = o * gr_act2(d, c);"""
        c_read = "A c = c_prev[row + j];" if self.lstm else ""
        c_write = (f"c_next[row + j] = c; {cl_store('y_c', dtype, 'row + j', 'c')}"
                   if self.lstm else "")
        params, pointers = _params(self.step_args)
        parts.append(f"""__kernel void gr_rec_step({params}, {sizes}, long s) {{
    {pointers}
    {where}
    A h = hold;
    {c_read}
    if (live) {{
        {update}
        {cl_store("y", dtype, "((t * D + d) * B + b) * H + j", "h")}
    }}
    h_next[row + j] = h;
    {cl_store("y_h", dtype, "row + j", "h")}
    {c_write}
}}""")
        self.text = "\n\n".join(parts) + "\n"


def cl_recurrence(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                  params: tuple[str, str, list[tuple[str, float, float]], float, bool, bool]
                  ) -> Callable[..., None]:
    """run(xw, r, rb, h0, [c0, p], lens, y, y_h, [y_c]) for recurrence_params' params."""
    cell, direction, functions, clip, before_reset, input_forget = params
    dtype = inputs[0].dtype
    check_cl_dtypes("recurrence", backend, device_id, [dtype])
    src = RecurrenceSource(dtype, cell, direction, functions, clip, before_reset, input_forget)
    make = lambda entry: ClKernel(backend, device_id, src.text, entry, "recurrence")
    init, step = make("gr_rec_init"), make("gr_rec_step")
    gates = make("gr_rec_gates") if src.two_phase else None
    steps, batch, dirs, width = inputs[0].shape
    hidden = width // GATES[cell]
    n = dirs * batch * hidden
    sizes = tuple(np.int64(v) for v in (steps, dirs, batch, hidden))
    state = wide_dtype(dtype)
    shape = (dirs, batch, hidden)
    h_bufs = [backend.empty(device_id, shape, np.dtype(state)) for _ in range(2)]
    c_bufs = [backend.empty(device_id, shape, np.dtype(state)) for _ in range(2)] \
        if src.lstm else []
    scratch = {name: backend.empty(device_id, shape, np.dtype(state)) for name in ("zbuf", "rh")} \
        if src.two_phase else {}
    names = ["xw", "r", "rb", "h0"] + (["c0", "p"] if src.lstm else []) + ["lens", "y", "y_h"] \
        + (["y_c"] if src.lstm else [])

    def pick(args: Sequence[tuple[str, str, bool]], bound: dict[str, Any]) -> list[Any]:
        return [bound[name] for name, _, _ in args]

    def run(*arrays: Any) -> None:
        bound: dict[str, Any] = dict(zip(names, arrays), **scratch)
        bound.update(h_next=h_bufs[0], c_next=c_bufs[0] if c_bufs else None)
        init.launch(n, None, *pick(src.init_args, bound), *sizes)
        for s in range(steps):
            bound.update(h_prev=h_bufs[s % 2], h_next=h_bufs[1 - s % 2])
            if c_bufs:
                bound.update(c_prev=c_bufs[s % 2], c_next=c_bufs[1 - s % 2])
            if gates is not None:
                gates.launch(n, None, *pick(src.gate_args, bound), *sizes, np.int64(s))
            step.launch(n, None, *pick(src.step_args, bound), *sizes, np.int64(s))
    return run
