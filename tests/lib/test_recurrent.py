"""recurrence (RNN, LSTM, GRU steps) against a float64 NumPy reference written from ONNX's
equations, one sequence and one step at a time."""
from __future__ import annotations

import numpy as np
import pytest

from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec
from graph_runtime.lib.registry import get_op

# cuda runs the cpu's NumPy-API kernel through CuPy; opencl runs generated OpenCL C.
RECURRENT_BACKENDS = [pytest.param("cpu", id="cpu"),
                      pytest.param("opencl", id="opencl", marks=pytest.mark.opencl),
                      pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]

FUNCS = {
    "sigmoid": lambda x, a, b: 1 / (1 + np.exp(-x)),
    "tanh": lambda x, a, b: np.tanh(x),
    "relu": lambda x, a, b: np.maximum(x, 0),
    "leakyrelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "hardsigmoid": lambda x, a, b: np.clip(a * x + b, 0, 1),
    "scaledtanh": lambda x, a, b: a * np.tanh(b * x),
    "affine": lambda x, a, b: a * x + b,
    "elu": lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)),
    "softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "softplus": lambda x, a, b: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
    "thresholdedrelu": lambda x, a, b: np.where(x > a, x, 0),
}


def reference(cell: str, xw, r, rb, h0, c0, p, lens, attrs):
    """Y (T, D, B, H), Y_h, Y_c in float64: each batch row walked over its own length."""
    xw, r, rb, h0 = (np.asarray(a, np.float64) for a in (xw, r, rb, h0))
    steps, batch, dirs, _ = xw.shape
    hidden = r.shape[2]
    names, alphas, betas = (attrs["activations"], attrs["activation_alpha"],
                            attrs["activation_beta"])
    per = len(names) // dirs
    clip = attrs.get("clip", 0.0)
    y = np.zeros((steps, dirs, batch, hidden))
    y_h = np.zeros((dirs, batch, hidden))
    y_c = np.zeros((dirs, batch, hidden))
    for d in range(dirs):
        def f(k, x):
            i = d * per + k
            x = np.clip(x, -clip, clip) if clip and k < 2 else x
            return FUNCS[names[i]](x, alphas[i], betas[i])
        reverse = attrs["direction"] == "reverse" or d == 1
        for bi in range(batch):
            h = h0[d, bi].copy()
            c = None if c0 is None else np.asarray(c0, np.float64)[d, bi].copy()
            order = range(lens[bi])[::-1] if reverse else range(lens[bi])
            for t in order:
                g = xw[t, bi, d] + r[d] @ h + rb[d]
                if cell == "rnn":
                    h = f(0, g)
                elif cell == "gru":
                    z = f(0, g[:hidden])
                    rr = f(0, g[hidden:2 * hidden])
                    if attrs.get("linear_before_reset"):
                        cand = xw[t, bi, d, 2 * hidden:] + rr * (r[d, 2 * hidden:] @ h
                                                                 + rb[d, 2 * hidden:])
                    else:
                        cand = xw[t, bi, d, 2 * hidden:] + r[d, 2 * hidden:] @ (rr * h) \
                            + rb[d, 2 * hidden:]
                    h = (1 - z) * f(1, cand) + z * h
                else:
                    pp = np.asarray(p, np.float64)[d]
                    gi, go, gf, gc = np.split(g, 4)
                    i_g = f(0, gi + pp[:hidden] * c)
                    f_g = 1 - i_g if attrs.get("input_forget") else \
                        f(0, gf + pp[2 * hidden:] * c)
                    c = f_g * c + i_g * f(1, gc)
                    o_g = f(0, go + pp[hidden:2 * hidden] * c)
                    h = o_g * FUNCS[names[d * per + 2]](c, alphas[d * per + 2],
                                                        betas[d * per + 2])
                y[t, d, bi] = h
            y_h[d, bi] = h
            if c is not None:
                y_c[d, bi] = c
    return [y, y_h] + ([y_c] if cell == "lstm" else [])


def _inputs(cell: str, steps: int, batch: int, dirs: int, hidden: int, dtype: str, lens):
    rng = np.random.default_rng(steps * 7 + batch)
    gates = {"rnn": 1, "gru": 3, "lstm": 4}[cell]
    width = gates * hidden

    def rand(*shape, scale=0.5):
        return (rng.standard_normal(shape) * scale).astype(dtype)
    arrays = [rand(steps, batch, dirs, width), rand(dirs, width, hidden), rand(dirs, width),
              rand(dirs, batch, hidden)]
    if cell == "lstm":
        arrays += [rand(dirs, batch, hidden), rand(dirs, 3 * hidden)]
    return arrays + [np.asarray(lens, np.int32)]


def _attrs(cell: str, direction: str, names: list[str], **extra):
    dirs = 2 if direction == "bidirectional" else 1
    names = names * dirs
    return {"cell": cell, "direction": direction, "activations": names,
            "activation_alpha": [0.3] * len(names), "activation_beta": [0.4] * len(names),
            **extra}


DEFAULTS = {"rnn": ["tanh"], "gru": ["sigmoid", "tanh"], "lstm": ["sigmoid", "tanh", "tanh"]}


@pytest.mark.parametrize("backend", RECURRENT_BACKENDS)
@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens", [[5, 5, 5], [5, 2, 0]], ids=["full", "ragged"])
def test_recurrence(backend: str, cell: str, direction: str, lens, run_op) -> None:
    dirs = 2 if direction == "bidirectional" else 1
    arrays = _inputs(cell, 5, 3, dirs, 4, "float64", lens)
    attrs = _attrs(cell, direction, DEFAULTS[cell])
    got = run_op(backend, "recurrence", arrays, attrs)
    c0, p = (arrays[4], arrays[5]) if cell == "lstm" else (None, None)
    want = reference(cell, *arrays[:4], c0, p, lens, attrs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", RECURRENT_BACKENDS)
@pytest.mark.parametrize("cell,extra,names", [
    ("gru", {"linear_before_reset": 1}, ["hardsigmoid", "leakyrelu"]),
    ("lstm", {"input_forget": 1, "clip": 0.7}, ["sigmoid", "scaledtanh", "softsign"]),
    ("lstm", {}, ["affine", "elu", "softplus"]),
    ("rnn", {"clip": 1.5}, ["thresholdedrelu"]),
])
def test_recurrence_options(backend: str, cell, extra, names, run_op) -> None:
    arrays = _inputs(cell, 4, 2, 1, 3, "float32", [4, 3])
    attrs = _attrs(cell, "forward", names, **extra)
    got = run_op(backend, "recurrence", arrays, attrs)
    c0, p = (arrays[4], arrays[5]) if cell == "lstm" else (None, None)
    want = reference(cell, *arrays[:4], c0, p, [4, 3], attrs)
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


def test_recurrence_refuses_bad_shapes() -> None:
    op = get_op("recurrence")
    attrs = _attrs("lstm", "forward", DEFAULTS["lstm"])
    specs = [TensorSpec(a.shape, str(a.dtype)) for a in _inputs("lstm", 2, 1, 1, 3, "float32",
                                                                 [2])]
    specs[1] = TensorSpec((1, 12, 4), "float32")
    with pytest.raises(LibraryError, match=r"input 1 .*expected \(1, 12, 3\)"):
        op.infer(specs, attrs)
    with pytest.raises(LibraryError, match="takes 7 inputs, got 5"):
        op.infer(specs[:5], attrs)
    with pytest.raises(LibraryError, match="activations"):
        op.infer(specs, {**attrs, "activations": ["sigmoid", "tanh", "nope"]})


@pytest.mark.parametrize("backend", RECURRENT_BACKENDS)
@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("name", list(FUNCS))
def test_recurrence_every_activation(backend: str, cell: str, name: str, run_op) -> None:
    """Each activation in each slot of a cell, bidirectional with other functions backwards
    (odd hidden size, ragged lengths, clip on half the cases, both GRU resets)."""
    per = len(DEFAULTS[cell])
    names = [name] * per + [n for n in list(FUNCS)[::-1] if n != name][:per]
    clip = 0.9 if len(name) % 2 else 0.0
    extra = {"clip": clip, "linear_before_reset": int(len(name) % 3 == 0),
             "input_forget": int(len(name) % 4 == 0)}
    attrs = {"cell": cell, "direction": "bidirectional", "activations": names,
             "activation_alpha": [0.3 + 0.1 * i for i in range(len(names))],
             "activation_beta": [0.4 - 0.1 * i for i in range(len(names))], **extra}
    lens = [3, 6, 1, 0]
    arrays = _inputs(cell, 6, 4, 2, 5, "float64", lens)
    got = run_op(backend, "recurrence", arrays, attrs)
    c0, p = (arrays[4], arrays[5]) if cell == "lstm" else (None, None)
    want = reference(cell, *arrays[:4], c0, p, lens, attrs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", RECURRENT_BACKENDS)
@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("dtype,tol", [("float16", 3e-3), ("float32", 2e-5)])
def test_recurrence_narrow_dtypes(backend: str, cell: str, dtype: str, tol: float,
                                  run_op) -> None:
    """float16 computes in float32 (stored as float16); a larger hidden size, reverse rows."""
    lens = [7, 4, 7]
    arrays = _inputs(cell, 7, 3, 1, 33, dtype, lens)
    attrs = _attrs(cell, "reverse", DEFAULTS[cell])
    got = run_op(backend, "recurrence", arrays, attrs)
    c0, p = (arrays[4], arrays[5]) if cell == "lstm" else (None, None)
    want = reference(cell, *arrays[:4], c0, p, lens, attrs)
    for g, w in zip(got, want):
        assert g.dtype == np.dtype(dtype)
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=tol, atol=tol)


def test_opencl_activations_follow_the_op() -> None:
    """The OpenCL C activation table names exactly the op's activations."""
    from graph_runtime.lib.kernels.opencl.recurrent import CL_ACTIVATIONS
    from graph_runtime.lib.ops.recurrent import ACTIVATIONS
    assert set(CL_ACTIVATIONS) == set(ACTIVATIONS) == set(FUNCS)


@pytest.mark.parametrize("backend", RECURRENT_BACKENDS)
@pytest.mark.parametrize("cell,before_reset", [("rnn", 0), ("gru", 0), ("gru", 1), ("lstm", 0)])
def test_recurrence_batch_past_a_block(backend: str, cell: str, before_reset: int,
                                       run_op) -> None:
    """11 batch rows: OpenCL's products take 8 rows a work item, so the last block is partial."""
    lens = [5, 1, 3, 5, 0, 2, 5, 4, 5, 1, 3]
    arrays = _inputs(cell, 5, 11, 2, 8, "float64", lens)
    attrs = _attrs(cell, "bidirectional", DEFAULTS[cell], linear_before_reset=before_reset)
    got = run_op(backend, "recurrence", arrays, attrs)
    c0, p = (arrays[4], arrays[5]) if cell == "lstm" else (None, None)
    want = reference(cell, *arrays[:4], c0, p, lens, attrs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
