"""OpenCL kernels of recurrence (RNN, LSTM, GRU): per time step, one launch for H(t-1) @ R^T of
every direction and batch row, one for the gate updates (GRU with linear_before_reset=0: two of
each, its candidate needs the reset gate of every unit first).

The input projections (xw) come precomputed by one dense over all steps. The state lives on the
device in two buffers of the compute type that swap roles every step, so a step never waits on
the host.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...library import TensorSpec
from ..gpu_common import compute_type
from ..host import wide_dtype
from .recurrent_dot import ROWS, StepKernel, dot_source, vector_width
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
    """The program of one (dtype, cell, direction, activations, clip, options, batch) and the
    array arguments of each of its kernels, in order."""

    def __init__(self, dtype: str, cell: str, direction: str,
                 functions: Sequence[tuple[str, float, float]], clip: float,
                 before_reset: bool, input_forget: bool, batch: int, hidden: int) -> None:
        self.lstm = cell == "lstm"
        self.two_phase = cell == "gru" and not before_reset
        acc = compute_type(dtype, "opencl")
        io, st = dtype, wide_dtype(dtype)
        self.gates = GATES[cell]
        # The products: (first column, columns, vector width, vector) per phase.
        spans = [(0, 2 * hidden, "h_prev"), (2 * hidden, hidden, "rh")] if self.two_phase \
            else [(0, self.gates * hidden, "h_prev")]
        self.products = [(q0, nq, vector_width(nq), vec) for q0, nq, vec in spans]
        self.rows = max(1, min(ROWS, batch))
        c_outs = [("y_c", io, True), ("c_next", st, True)] if self.lstm else []
        self.transpose_args = [("rt", st, True), ("r", io, False)]
        self.init_args = ([("y", io, True), ("y_h", io, True), ("h_next", st, True)] + c_outs
                          + [("h0", io, False)] + ([("c0", io, False)] if self.lstm else []))
        weights = [("xw", io, False), ("hr", st, False), ("rb", io, False)]
        weights += [("p", io, False)] if self.lstm else []
        prev = [("lens", "int32", False), ("h_prev", st, False)]
        prev += [("c_prev", st, False)] if self.lstm else []
        scratch = [("zbuf", st, True), ("rh", st, True)] if self.two_phase else []
        self.gate_args = scratch + weights + prev
        self.step_args = ([("y", io, True), ("y_h", io, True), ("h_next", st, True)] + c_outs
                          + weights + prev + [(n, t, False) for n, t, _ in scratch])
        dots = [dot_source(st, self.rows, w) for w in sorted({p[2] for p in self.products})]
        self.text = "\n\n".join(
            [cl_header([dtype]) + f"typedef {acc} A;",
             _functions(cell, 2 if direction == "bidirectional" else 1, functions, clip, acc),
             self._setup(dtype), *dots, *self._steps(dtype, cell, direction, input_forget)]
        ) + "\n"

    def _setup(self, dtype: str) -> str:
        """gr_rec_transpose (R to rt, once a run) and gr_rec_init (state <- h0, c0; y <- 0)."""
        sizes = "long T, long D, long B, long H"
        params, pointers = _params(self.transpose_args)
        transpose = f"""__kernel void gr_rec_transpose({params}, {sizes}) {{
    long g = get_global_id(0);
    long gw = {self.gates} * H;
    if (g >= D * H * gw) return;
    {pointers}
    long q = g % gw, k = (g / gw) % H, d = g / (gw * H);
    rt[g] = {cl_load("r", dtype, "(d * gw + q) * H + k")};
}}"""
        params, pointers = _params(self.init_args)
        c_init = (f"A c = {cl_load('c0', dtype, 'g')}; c_next[g] = c; "
                  f"{cl_store('y_c', dtype, 'g', 'c')}") if self.lstm else ""
        return transpose + f"""

__kernel void gr_rec_init({params}, {sizes}) {{
    long g = get_global_id(0);
    if (g >= D * B * H) return;
    {pointers}
    long j = g % H, b = (g / H) % B, d = g / (B * H);
    A h = {cl_load("h0", dtype, "g")};
    h_next[g] = h;
    {cl_store("y_h", dtype, "g", "h")}
    {c_init}
    for (long t = 0; t < T; ++t) {{ {cl_store("y", dtype, "((t * D + d) * B + b) * H + j", "0")} }}
}}"""

    def _steps(self, dtype: str, cell: str, direction: str, input_forget: bool) -> list[str]:
        """gr_rec_step (and GRU's gr_rec_gates before it): step s of every row, from hr."""
        sizes = "long T, long D, long B, long H, long s"
        store = "half" if dtype == "float16" else compute_type(dtype, "opencl")
        # Work item g: unit j of batch row b of direction d; the step s reads time t of that row
        # (a reversed row starts at its own last valid step, as _host_recurrence does).
        where = f"""long g = get_global_id(0);
    if (g >= D * B * H) return;
    long j = g % H, b = (g / H) % B, d = g / (B * H);
    long len = lens[b];
    long t = ({int(direction == "reverse")} || d == 1) ? len - 1 - s : s;
    t = t < 0 ? 0 : (t > T - 1 ? T - 1 : t);
    int live = s < len;
    long row = (d * B + b) * H;
    long gw = {self.gates} * H;
    __global const {store}* x_t = xw + ((t * B + b) * D + d) * gw;
    __global const A* hr_b = hr + (d * B + b) * gw;
    __global const {store}* rb_d = rb + d * gw;
    A hold = h_prev[row + j];"""

        def gate(q: str) -> str:
            return f"({cl_load('x_t', dtype, q)} + (hr_b[{q}] + {cl_load('rb_d', dtype, q)}))"
        kernels = []
        if cell == "rnn":
            update = "h = gr_act0(d, gr_clip(" + gate("j") + "));"
        elif self.two_phase:
            params, pointers = _params(self.gate_args)
            kernels.append(f"""__kernel void gr_rec_gates({params}, {sizes}) {{
    {pointers}
    {where}
    if (!live) return;
    zbuf[row + j] = gr_act0(d, gr_clip({gate("j")}));
    rh[row + j] = gr_act0(d, gr_clip({gate("H + j")})) * hold;
}}""")
            update = f"""A z = zbuf[row + j];
        A cand = {gate("2 * H + j")};
        h = (1 - z) * gr_act1(d, gr_clip(cand)) + z * hold;"""
        elif cell == "gru":
            bias = cl_load("rb_d", dtype, "2 * H + j")
            update = f"""A z = gr_act0(d, gr_clip({gate("j")}));
        A reset = gr_act0(d, gr_clip({gate("H + j")}));
        A cand = {cl_load("x_t", dtype, "2 * H + j")} + reset * (hr_b[2 * H + j] + {bias});
        h = (1 - z) * gr_act1(d, gr_clip(cand)) + z * hold;"""
        else:
            peep = {q: cl_load("p_d", dtype, q) for q in ("j", "H + j", "2 * H + j")}
            forget = ("1 - i" if input_forget
                      else f"gr_act0(d, gr_clip({gate('2 * H + j')} + {peep['2 * H + j']} * c))")
            update = f"""__global const {store}* p_d = p + d * 3 * H;
        A i = gr_act0(d, gr_clip({gate("j")} + {peep["j"]} * c));
        A f = {forget};
        c = f * c + i * gr_act1(d, gr_clip({gate("3 * H + j")}));
        A o = gr_act0(d, gr_clip({gate("H + j")} + {peep["H + j"]} * c));
        h = o * gr_act2(d, c);"""
        c_read = "A c = c_prev[row + j];" if self.lstm else ""
        c_write = (f"c_next[row + j] = c; {cl_store('y_c', dtype, 'row + j', 'c')}"
                   if self.lstm else "")
        params, pointers = _params(self.step_args)
        kernels.append(f"""__kernel void gr_rec_step({params}, {sizes}) {{
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
        return kernels


def cl_recurrence(backend: OpenCLBackend, device_id: int, inputs: Sequence[TensorSpec],
                  params: tuple[str, str, list[tuple[str, float, float]], float, bool, bool]
                  ) -> Callable[..., None]:
    """run(xw, r, rb, h0, [c0, p], lens, y, y_h, [y_c]) for recurrence_params' params."""
    cell, direction, functions, clip, before_reset, input_forget = params
    dtype = inputs[0].dtype
    check_cl_dtypes("recurrence", backend, device_id, [dtype])
    steps, batch, dirs, width = inputs[0].shape
    hidden = width // GATES[cell]
    n = dirs * batch * hidden
    src = RecurrenceSource(dtype, cell, direction, functions, clip, before_reset, input_forget,
                           batch, hidden)

    def make(entry: str) -> ClKernel:
        return ClKernel(backend, device_id, src.text, entry, "recurrence")
    transpose, init = make("gr_rec_transpose"), make("gr_rec_init")
    step = StepKernel(make, "gr_rec_step", n, True)
    gates = StepKernel(make, "gr_rec_gates", n, True) if src.two_phase else None
    dots = [(StepKernel(make, f"gr_rec_dot{w}", nq // w * -(-batch // src.rows) * dirs, False),
             (np.int64(width), np.int64(q0), np.int64(nq)), vec)
            for q0, nq, w, vec in src.products]
    sizes = tuple(np.int64(v) for v in (steps, dirs, batch, hidden))
    state = np.dtype(wide_dtype(dtype))
    shape = (dirs, batch, hidden)
    # Device buffers of this prepared call: R transposed, H(t-1) @ R^T, the state twice (read
    # one, write the other, swapped every step), GRU's gates between its two phases.
    own = {"rt": backend.empty(device_id, (dirs, hidden, width), state),
           "hr": backend.empty(device_id, (dirs, batch, width), state)}
    pairs = [("h_prev", "h_next")] + ([("c_prev", "c_next")] if src.lstm else [])
    for prev, nxt in pairs:
        own[prev], own[nxt] = (backend.empty(device_id, shape, state) for _ in range(2))
    for name in ("zbuf", "rh") if src.two_phase else ():
        own[name] = backend.empty(device_id, shape, state)
    names = ["xw", "r", "rb", "h0"] + (["c0", "p"] if src.lstm else []) + ["lens", "y", "y_h"] \
        + (["y_c"] if src.lstm else [])
    swapped = {**own, **{a: own[b] for a, b in pairs}, **{b: own[a] for a, b in pairs}}

    def run(*arrays: Any) -> None:
        even = {**dict(zip(names, arrays)), **own}
        transpose.launch(dirs * hidden * width, None,
                         *(even[a] for a, _, _ in src.transpose_args), *sizes)
        # Even steps read h_prev and write h_next, odd steps the other way round; init writes
        # what step 0 reads.
        odd = {**even, **swapped}
        init.launch(n, None, *(odd[a] for a, _, _ in src.init_args), *sizes)
        for parity, arg in enumerate((even, odd)):
            step.bind(parity, [arg[a] for a, _, _ in src.step_args], sizes)
            if gates is not None:
                gates.bind(parity, [arg[a] for a, _, _ in src.gate_args], sizes)
            for dot, scalars, vec in dots:
                dot.bind(parity, [own["hr"], own["rt"], arg[vec]], (*sizes, *scalars))
        for s in range(steps):
            for i, (dot, _, _) in enumerate(dots):
                dot.launch(s)
                if i == 0 and gates is not None:
                    gates.launch(s)
            step.launch(s)
    return run
