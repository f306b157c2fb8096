"""softmax family, batch/layer norm, clip, leaky_relu, gelu, erf, where on every backend."""
from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

import graph_runtime as gr
from graph_runtime.errors import LibraryError
from graph_runtime.lib.library import TensorSpec

# Normalizations sum whole rows: per-dtype tolerances a little wider than elementwise ones.
ROW_TOLERANCES = {"float16": {"rtol": 1e-2, "atol": 1e-2}, "float32": {"rtol": 1e-5, "atol": 1e-5},
                  "float64": {"rtol": 1e-10, "atol": 1e-12}}


def _close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    assert got.shape == want.shape, f"shape {got.shape} != reference {want.shape}"
    assert str(got.dtype) == dtype
    np.testing.assert_allclose(got.astype(np.float64), want, **ROW_TOLERANCES[dtype])


def ref_softmax(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    x64 = x.astype(np.float64)
    shifted = x64 - x64.max(axis=axis, keepdims=True) if x.size else x64
    total = np.exp(shifted).sum(axis=axis, keepdims=True)
    return shifted - np.log(total) if log else np.exp(shifted) / total


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,axis", [((2, 3, 4), None), ((2, 3, 4), 0), ((2, 3, 4), 1),
                                        ((3, 1), -1), ((0, 3), -1), ((2, 300), 1)])
def test_softmax(backend_name: str, op: str, shape, axis, run_op, random_array) -> None:
    x = random_array(shape, "float32", -20, 20, seed=1)
    attrs = {} if axis is None else {"axis": axis}
    (got,) = run_op(backend_name, op, [x], attrs)
    _close(got, ref_softmax(x, -1 if axis is None else axis, op == "log_softmax"), "float32")


@pytest.mark.parametrize("dtype", ["float16", "float64"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_dtypes(backend_name: str, op: str, dtype: str, run_op, random_array) -> None:
    x = random_array((3, 7), dtype, -4, 4, seed=2)
    (got,) = run_op(backend_name, op, [x], {"axis": -1})
    _close(got, ref_softmax(x, -1, op == "log_softmax"), dtype)


def ref_norm(x, gamma, beta, axis, epsilon, center, scale, mean=None, var=None) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * gamma + beta; statistics over axis unless given."""
    x64 = x.astype(np.float64)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    if mean is None:
        mean = x64.mean(axis=axis, keepdims=True)
        var = ((x64 - mean) ** 2).mean(axis=axis, keepdims=True)
    else:
        mean = mean.astype(np.float64).reshape(shape)
        var = var.astype(np.float64).reshape(shape)
    out = (x64 - mean) / np.sqrt(var + epsilon)
    if scale:
        out = out * gamma.astype(np.float64).reshape(shape)
    if center:
        out = out + beta.astype(np.float64).reshape(shape)
    return out


@pytest.mark.parametrize("shape,axis,center,scale,dtype", [
    ((2, 3, 4, 4), 1, True, True, "float32"), ((4, 3), -1, False, True, "float32"),
    ((2, 5), 1, True, False, "float64"), ((1, 2, 1, 1), 1, True, True, "float16"),
    ((0, 3), 1, True, True, "float32")])
def test_batch_norm(backend_name: str, shape, axis, center, scale, dtype, run_op,
                    random_array) -> None:
    channels = shape[axis]
    x = random_array(shape, dtype, seed=3)
    gamma = random_array((channels,), dtype, 0.5, 2, seed=4)
    beta = random_array((channels,), dtype, seed=5)
    mean = random_array((channels,), dtype, seed=6)
    var = random_array((channels,), dtype, 0.1, 2, seed=7)
    attrs = {"axis": axis, "epsilon": 1e-3, "center": center, "scale": scale}
    (got,) = run_op(backend_name, "batch_norm", [x, gamma, beta, mean, var], attrs)
    _close(got, ref_norm(x, gamma, beta, axis, 1e-3, center, scale, mean, var), dtype)


@pytest.mark.parametrize("declared_by", ["graph", "lib"])
def test_batch_norm_three_outputs(backend_name: str, declared_by: str, run_op,
                                  random_array) -> None:
    """Relay's 3 outputs, declared by the graph node's outputs or by the lib entry."""
    x = random_array((2, 3, 2), "float32", seed=8)
    params = [random_array((3,), "float32", 0.1, 2, seed=9 + i) for i in range(4)]
    if declared_by == "graph":
        outputs = [TensorSpec((2, 3, 2), "float32"), TensorSpec((3,), "float32"),
                   TensorSpec((3,), "float32")]
        got = run_op(backend_name, "batch_norm", [x] + params, outputs=outputs)
    else:
        got = run_op(backend_name, {"op": "batch_norm", "num_outputs": 3}, [x] + params)
    assert len(got) == 3
    _close(got[0], ref_norm(x, params[0], params[1], 1, 1e-5, True, True, params[2], params[3]),
           "float32")
    np.testing.assert_array_equal(got[1], params[2])
    np.testing.assert_array_equal(got[2], params[3])


@pytest.mark.parametrize("shape,axis,center,scale,dtype", [
    ((2, 3, 8), None, True, True, "float32"), ((2, 5, 3), 1, True, True, "float32"),
    ((4, 300), -1, False, False, "float32"), ((3, 6), -1, True, True, "float64"),
    ((2, 6), -1, True, True, "float16"), ((0, 4), -1, True, True, "float32"),
    ((3, 1), -1, True, True, "float32"), ((3, 5000), -1, True, False, "float32")])
def test_layer_norm(backend_name: str, shape, axis, center, scale, dtype, run_op,
                    random_array) -> None:
    where = -1 if axis is None else axis
    x = random_array(shape, dtype, seed=10)
    gamma = random_array((shape[where],), dtype, 0.5, 2, seed=11)
    beta = random_array((shape[where],), dtype, seed=12)
    attrs = {"center": center, "scale": scale, "epsilon": 1e-5}
    if axis is not None:
        attrs["axis"] = axis
    (got,) = run_op(backend_name, "layer_norm", [x, gamma, beta], attrs)
    _close(got, ref_norm(x, gamma, beta, where, 1e-5, center, scale), dtype)


@pytest.mark.parametrize("shape,axis,dtype", [
    ((2, 3, 8), None, "float32"), ((2, 5, 3), 1, "float32"), ((4, 300), -1, "float64"),
    ((2, 6), -1, "float16"), ((0, 4), -1, "float32"), ((3, 1), -1, "float32"),
    ((2, 4100), -1, "float32")])
def test_rms_norm(backend_name: str, shape, axis, dtype, run_op, random_array) -> None:
    where = -1 if axis is None else axis
    x = random_array(shape, dtype, seed=13)
    gamma = random_array((shape[where],), dtype, 0.5, 2, seed=14)
    attrs = {"epsilon": 1e-6} if axis is None else {"epsilon": 1e-6, "axis": axis}
    (got,) = run_op(backend_name, "rms_norm", [x, gamma], attrs)
    x64 = x.astype(np.float64)
    rms = np.sqrt((x64 * x64).mean(axis=where, keepdims=True) + 1e-6) if x.size else 1.0
    shaped = [1] * x.ndim
    shaped[where] = -1
    _close(got, x64 / rms * gamma.astype(np.float64).reshape(shaped), dtype)


# -- elementwise ops with attributes ------------------------------------------------------------

_ERF = np.vectorize(math.erf)


def ref_unary(op: str, x: np.ndarray, attrs: dict) -> np.ndarray:
    x64 = x.astype(np.float64)
    if op == "clip":
        return np.minimum(np.maximum(x64, attrs["a_min"]), attrs["a_max"])
    if op == "leaky_relu":
        return np.where(x64 < 0, attrs.get("alpha", 0.01) * x64, x64)
    if op == "erf":
        return _ERF(x64) if x.size else x64
    if attrs.get("approximate") == "tanh":
        return 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    return 0.5 * x64 * (1 + (_ERF(x64 / math.sqrt(2)) if x.size else x64))


UNARY_CASES = [("clip", {"a_min": -0.5, "a_max": 1.25}), ("clip", {"a_min": 0, "a_max": 6}),
               ("leaky_relu", {}), ("leaky_relu", {"alpha": 0.2}), ("gelu", {}),
               ("gelu", {"approximate": "tanh"}), ("erf", {})]


@pytest.mark.parametrize("op,attrs", UNARY_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_unary(backend_name: str, op: str, attrs, dtype: str, run_op, random_array) -> None:
    x = random_array((3, 5), dtype, -3, 3, seed=13)
    (got,) = run_op(backend_name, op, [x], attrs)
    _close(got, ref_unary(op, x, attrs), dtype)


@pytest.mark.parametrize("shape", [(0, 2), (1,), ()])
def test_unary_odd_shapes(backend_name: str, shape, run_op, random_array) -> None:
    x = random_array(shape, "float32", -3, 3, seed=14)
    for op, attrs in UNARY_CASES[::2]:
        (got,) = run_op(backend_name, op, [x], attrs)
        _close(got, ref_unary(op, x, attrs), "float32")


def test_clip_int32(backend_name: str, run_op) -> None:
    x = np.arange(-5, 6, dtype=np.int32)
    (got,) = run_op(backend_name, "clip", [x], {"a_min": -2.5, "a_max": 3.0})
    np.testing.assert_array_equal(got, np.clip(x, -2, 3))


@pytest.mark.parametrize("func", ["clip", [{"op": "clip"}, {"op": "relu"}]], ids=["clip", "chain"])
def test_clip_int32_bounds_beyond_the_dtype(backend_name: str, func, run_op) -> None:
    # GPU kernels once cast 1e10 to int in C (undefined; garbage on PoCL); bounds are clamped now.
    x = np.array([-5, 0, 7, 2**30], dtype=np.int32)
    attrs = {"a_min": -1e10, "a_max": 1e10}
    if isinstance(func, list):
        func = [dict(func[0], **attrs), func[1]]
        (got,) = run_op(backend_name, func, [x])
        np.testing.assert_array_equal(got, np.maximum(x, 0))
    else:
        (got,) = run_op(backend_name, func, [x], attrs)
        np.testing.assert_array_equal(got, x)


def test_clip_infinite_bound(backend_name: str, run_op, random_array) -> None:
    x = random_array((4,), "float32", -3, 3, seed=15)
    (got,) = run_op(backend_name, "clip", [x], {"a_min": float("-inf"), "a_max": 1.0})
    _close(got, np.minimum(x.astype(np.float64), 1.0), "float32")


@pytest.mark.parametrize("cond_dtype", ["bool", "float32", "int32"])
@pytest.mark.parametrize("shapes", [((2, 3), (2, 3), (2, 3)), ((3,), (2, 1), (1, 3)),
                                    ((2, 1), (), (2, 4)), ((0, 3), (3,), (1, 3))])
def test_where(backend_name: str, cond_dtype: str, shapes, run_op, random_array) -> None:
    rng = np.random.default_rng(16)
    cond = (rng.uniform(size=shapes[0]) > 0.5).astype(cond_dtype)
    x = random_array(shapes[1], "float32", seed=17)
    y = random_array(shapes[2], "float32", seed=18)
    (got,) = run_op(backend_name, "where", [cond, x, y])
    want = np.where(cond != 0, x.astype(np.float64), y.astype(np.float64))
    _close(got, want, "float32")


@pytest.mark.parametrize("op,attrs", [("erf", {}), ("gelu", {}), ("leaky_relu", {}), ("where", {})])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_cpu_kernels_make_no_array_per_call(op: str, attrs, dtype: str, make_function,
                                            random_array) -> None:
    """Workspaces come from prepare: a warm call allocates less than a quarter of a bool mask."""
    x = random_array((64, 256), dtype, seed=21)
    inputs = [x, x, x] if op == "where" else [x]  # where: a numeric condition needs a mask
    specs = [TensorSpec(x.shape, dtype)] * len(inputs)
    run = make_function(op).prepare(gr.cpu(), specs, specs[:1], attrs)
    out = np.empty_like(x)
    run(*inputs, out)
    tracemalloc.start()
    try:
        run(*inputs, out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < x.size // 4, f"{op} {dtype}: a call allocated {peak} bytes"


def test_fused_tail_on_gpus(backend_name: str, run_op, random_array) -> None:
    """dense then clip, leaky_relu, gelu: on GPUs the elementwise tail is one generated kernel."""
    data = random_array((3, 4), "float32", seed=19)
    weight = random_array((5, 4), "float32", seed=20)
    ops = [{"op": "dense"}, {"op": "clip", "a_min": -1.0, "a_max": 2.0},
           {"op": "leaky_relu", "alpha": 0.1}, {"op": "gelu"}]
    (got,) = run_op(backend_name, ops, [data, weight])
    want = data.astype(np.float64) @ weight.astype(np.float64).T
    for entry in ops[1:]:
        attrs = {k: v for k, v in entry.items() if k != "op"}
        want = ref_unary(entry["op"], want, attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- validation at create() time ----------------------------------------------------------------

F32 = "float32"
ERRORS = [
    ("softmax", [((2, 3), F32)], {"axis": 2},
     r"softmax: attribute 'axis' = 2: expected an axis in \[-2, 2\)"),
    ("log_softmax", [((2, 3), "int32")], {}, r"log_softmax: input 0 has dtype int32"),
    ("batch_norm", [((2, 3), F32), ((3,), F32), ((3,), F32), ((2,), F32), ((3,), F32)], {},
     r"batch_norm: moving_mean has shape \(2,\) but data \(2, 3\) float32 needs \(3,\) for axis 1"),
    ({"op": "batch_norm", "num_outputs": 2}, [((2, 3), F32)] + [((3,), F32)] * 4, {},
     r"batch_norm'?: attribute 'num_outputs' = 2: expected 1 \(the normalized data\) or 3"),
    ("batch_norm", [((2, 3), F32)] + [((3,), F32)] * 3, {},
     r"batch_norm: needs 5 input\(s\) but the graph node gives 4"),
    ("batch_norm", [((2, 3), F32)] + [((3,), F32)] * 4, {"epsilon": -1},
     r"batch_norm: attribute 'epsilon' = -1.0: expected a non-negative number"),
    ("layer_norm", [((2, 3), F32), ((3,), F32), ((2,), F32)], {},
     r"layer_norm: beta has shape \(2,\) but data \(2, 3\) float32 needs \(3,\) for axis 1"),
    ("layer_norm", [((2, 3), F32), ((3,), "float64"), ((3,), F32)], {},
     r"layer_norm: input 1 has dtype float64 but input 0 has float32"),
    ("rms_norm", [((2, 3), F32), ((2,), F32)], {},
     r"rms_norm: gamma has shape \(2,\) but data \(2, 3\) float32 needs \(3,\) for axis 1"),
    ("rms_norm", [((2, 3), F32), ((3,), F32)], {"epsilon": -1},
     r"rms_norm: attribute 'epsilon' = -1.0: expected a non-negative number"),
    ("clip", [((2,), F32)], {"a_min": 2, "a_max": 1},
     r"clip: attribute 'a_min' = 2.0: expected at most a_max = 1.0"),
    ("clip", [((2,), F32)], {"a_min": 0}, r"clip: missing required attribute 'a_max'"),
    ("gelu", [((2,), F32)], {"approximate": "fast"},
     r"gelu: attribute 'approximate' = 'fast': expected one of 'none', 'tanh'"),
    ("leaky_relu", [((2,), "int32")], {}, r"leaky_relu: input 0 has dtype int32"),
    ("where", [((2,), "bool"), ((2,), F32), ((2,), "float64")], {},
     r"where: input 1 has dtype float64 but input 0 has float32"),
    ("where", [((2,), "bool"), ((3,), F32), ((2,), F32)], {},
     r"where: cannot broadcast input shapes \(2,\) and \(3,\) and \(2,\)"),
    ("erf", [((2,), F32)], {"alpha": 1}, r"erf: unknown attribute 'alpha'; it accepts: no attr"),
]


@pytest.mark.parametrize("op,specs,attrs,message", ERRORS)
def test_errors(op, specs, attrs, message: str, make_function) -> None:
    inputs = [TensorSpec(shape, dtype) for shape, dtype in specs]
    func = make_function(op)
    with pytest.raises(LibraryError, match=message):
        func.infer(inputs, attrs)


@pytest.mark.parametrize("x_shape,slope_shape,dtype", [((2, 3, 4), (3, 1), "float32"),
                                                       ((2, 3), (2, 3), "float64"),
                                                       ((4, 2), (1,), "float16")])
def test_prelu(backend_name, x_shape, slope_shape, dtype, run_op, random_array) -> None:
    x = random_array(x_shape, dtype, seed=10)
    slope = random_array(slope_shape, dtype, 0.1, 0.9, seed=11)
    (got,) = run_op(backend_name, "prelu", [x, slope])
    x64 = x.astype(np.float64)
    want = np.where(x64 < 0, x64 * slope.astype(np.float64), x64)
    _close(got, want, dtype)


def test_prelu_slope_must_not_grow_x(make_function) -> None:
    with pytest.raises(LibraryError, match=r"prelu: slope \(2, 3\) float32 must broadcast to x "
                                           r"\(3,\) float32"):
        make_function("prelu").infer([TensorSpec((3,), "float32"), TensorSpec((2, 3), "float32")])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cpu_gelu_inside_a_chain_runs_compiled(approximate: str, dtype: str, monkeypatch,
                                              random_array) -> None:
    """Whisper's conv output: reshape -> gelu -> transpose -> add; the gelu between the views
    is one compiled pass (chain_jit), against float64 with NaN and inf as NumPy's kernel."""
    from graph_runtime.lib.chain import Chain, Step
    from graph_runtime.lib.kernels.cpu.chain_jit import CompiledChain
    from graph_runtime.settings import CHAIN_JIT
    x = random_array((1, 7, 1, 13), dtype, -4, 4, seed=31)
    x[0, :3, 0, 0] = [np.nan, np.inf, -np.inf]
    pos = random_array((13, 7), dtype, seed=32)
    chain = Chain("f", [Step("reshape", {"newshape": [1, 7, 13]}),
                        Step("gelu", {"approximate": approximate}),
                        Step("transpose", {"axes": [0, 2, 1]}), Step("add")])
    specs = [TensorSpec(x.shape, dtype), TensorSpec(pos.shape, dtype)]
    outs = chain.infer(specs)
    results = []
    for mode in ("auto", "off"):
        monkeypatch.setenv(CHAIN_JIT.name, mode)
        run = chain.prepare(gr.cpu(), specs, outs, {})
        compiled = [fn for fn, _ in run._steps if isinstance(fn, CompiledChain)]
        assert [c.ops for c in compiled] == ([["gelu"]] if mode == "auto" else [])
        out = np.empty(outs[0].shape, dtype)
        with np.errstate(invalid="ignore"):
            run(x, pos, out)
        results.append(out)
    attrs = {"approximate": approximate}
    want = ref_unary("gelu", x.reshape(1, 7, 13), attrs).transpose(0, 2, 1) + pos
    _close(results[0], want, dtype)
    np.testing.assert_array_equal(np.isnan(results[0]), np.isnan(results[1]))
